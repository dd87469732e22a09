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
import torch

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
        # found by its own pattern, or (a prologue form) by the pattern of the family it is without its prologue
        assert family.pattern is not None or (family.peel is not None and family_of(family.prologue_of).pattern)


PATTERNED = [f for f in FAMILIES if f.pattern is not None]


@pytest.mark.parametrize("family", PATTERNED, ids=[f.name for f in PATTERNED])
def test_each_spelling_of_a_familys_pattern_is_found_as_one_call_of_it(family):
    """Each function of the pattern, traced on each example as the model's graph would hold it, is found as one
    call whose inputs are the graph's inputs and whose nodes are all of the graph's operators but views of them."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kforge.ops._pattern import Pattern

    for fn in family.pattern.fns:
        for example in family.pattern.examples:
            tensors = {k: v for k, v in example.items() if isinstance(v, torch.Tensor)}
            scalars = {k: v for k, v in example.items() if k not in tensors}
            gm = make_fx(lambda *ts, fn=fn, names=tuple(tensors), kw=scalars: fn(**dict(zip(names, ts)), **kw))(
                *tensors.values())
            gm.graph.eliminate_dead_code()
            placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
            # NB: without its check (linear_gelu's is off on the CPU)
            (m,) = Pattern(family.pattern.fns, family.pattern.examples).find(gm.graph)
            assert [m.values[k] for k in tensors] == placeholders
            assert all(m.values[k] == v for k, v in scalars.items())
            out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
            assert m.output is out
            ops = [n for n in gm.graph.nodes if n.op == "call_function"]
            assert set(m.nodes) == {n for n in ops if not _views_an_input(n, placeholders)}


def _views_an_input(node, placeholders) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.returns[0].alias_info is not None \
        and all(a in placeholders for a in node.all_input_nodes)


def test_a_pattern_takes_products_in_either_order_and_no_intermediate_read_elsewhere():
    """``w * x`` is ``x * w``; a match whose intermediate something else reads is no match (its kernel would
    leave that reader without its value)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kforge.ops._pattern import Pattern, meta

    def norm(input, weight, eps):
        return input * torch.rsqrt(input.pow(2).mean(-1, keepdim=True) + eps) * weight

    pattern = Pattern((norm,), ({"input": meta(2, 8), "weight": meta(8), "eps": 0.0123},))

    def swapped(x, w):
        return w * (torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * x)

    def leaked(x, w):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * r * w, r

    x, w = torch.randn(4, 8), torch.randn(8)
    (m,) = pattern.find(make_fx(swapped)(x, w).graph)
    assert m.values["eps"] == 1e-6 and [n.op for n in (m.values["input"], m.values["weight"])] == ["placeholder"] * 2
    assert pattern.find(make_fx(leaked)(x, w).graph) == []
    assert pattern.find(make_fx(lambda x, w: x * torch.rsqrt(x.pow(3).mean(-1, keepdim=True) + 1e-6) * w)(x, w).graph) == []


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
