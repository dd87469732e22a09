"""Operator families: each is one folder holding one registered object, and the code around them names none.

Every list here is derived from the registry (``kforge.ops.all_families``), so a new family is checked as it lands.
"""
from __future__ import annotations

import inspect
import io
import re
import tokenize
from pathlib import Path

import pytest

import kforge.proposers.builtin  # noqa: F401  (registers the strategies)
from kforge.ops import all_families, family_of, get_spec
from kforge.proposers.builtin import strategies_for

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kforge"
FAMILIES = all_families()
IDS = [f.name for f in FAMILIES]


def _folder(family) -> Path:
    """The folder a family's spec comes from (kforge/ops/families/<name>/)."""
    path = Path(inspect.getsourcefile(family.spec.bind)).resolve()
    families = PACKAGE / "ops" / "families"
    assert families in path.parents, f"{family.name}'s binder lives outside kforge/ops/families: {path}"
    return families / path.relative_to(families).parts[0]


def _code_names(path: Path) -> str:
    """A module's names and strings (its comments left out)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return " ".join(t.string for t in tokens if t.type in (tokenize.NAME, tokenize.STRING))


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_a_family_is_its_registered_spec_in_a_folder_of_its_own(family):
    assert get_spec(family.name) is family.spec
    assert family_of(family.name) is family
    assert (_folder(family) / "__init__.py").exists()
    assert family.doc and "\n" not in family.doc


@pytest.mark.parametrize("family", [f for f in FAMILIES if not f.spec.targets], ids=[f.name for f in FAMILIES if not f.spec.targets])
def test_a_family_with_no_eager_spelling_is_named_only_in_its_folder_and_its_strategies(family):
    """Its name appears in kforge's code only in its folder and in the strategy modules it points to (the finder,
    the graph passes and the dispatcher loop over the registry)."""
    allowed = {_folder(family)} | {PACKAGE.parent / (m.replace(".", "/") + ".py") for m in family.strategies}
    word = re.compile(rf"\b{re.escape(family.name)}\b")
    named = [str(p.relative_to(ROOT)) for p in sorted(PACKAGE.rglob("*.py"))
             if not any(a == p or a in p.parents for a in allowed) and word.search(_code_names(p))]
    assert not named, f"{family.name} is named outside its folder: {named}"


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_a_familys_graph_role_names_registered_operators(family):
    if family.epilogue is not None:
        get_spec(family.epilogue.of)
        get_spec(family.epilogue.op)
        assert family.fused, "an epilogue is fused: its calls are found in the ATen graph"
    if family.prologue_of is not None:
        plain = family_of(family.prologue_of)
        assert plain is not None and plain.spec.inputs == family.spec.inputs[:1] + family.spec.inputs[2:]
    if family.fused:
        # found by its own match, or (a prologue form) by the match of the family it is without its prologue
        assert family.match is not None or family_of(family.prologue_of).match is not None


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_a_familys_strategies_are_where_it_points(family):
    """A CPU and a CUDA strategy for each family, each rendered in a module the family names."""
    for backend in ("cpu", "cuda"):
        found = strategies_for(family.name, backend)
        assert found, f"{family.name} has no {backend} strategy"
        for s in found:
            assert inspect.getmodule(s.render_fn).__name__ in family.strategies, s.name


def test_the_architecture_page_lists_every_family_with_its_role():
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = {cells[0].strip("` "): [c.strip() for c in cells[1:]]
            for line in text.splitlines() if line.startswith("| `") and (cells := line.strip("|").split("|"))}
    for family in FAMILIES:
        assert family.name in rows, f"add {family.name} to the families table of docs/architecture.md"
        graph, *_ = rows[family.name]
        assert graph == family.graph, f"{family.name}: the table says {graph}, the registry {family.graph}"
