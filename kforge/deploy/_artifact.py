"""Exported artifacts: a folder with a JSON manifest, each winner's source and binary, checksums.

Loading never unpickles anything: the manifest is JSON and binaries are checked against their
SHA-256 before they are loaded. On another GPU architecture, backend or torch version, each
kernel is rebuilt from its source and re-validated against eager before use; any that fails stays
on eager, and the report says so.
"""
from __future__ import annotations

import hashlib
import json
import platform
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

from .._version import __version__
from ..kernels import (
    CONTRACT_VERSION,
    backend_of,
    compile_source,
    device_info,
    verify_binary,
)
from ..ops import Card, Variant
from ._deployment import Deployment
from ._launch import DeployedKernel
from ._replay import replay_enabled
from ._select import DispatchCost, Winner, dispatch_cost, select_winners

FORMAT = "kforge-artifact"
FORMAT_VERSION = 1


class ArtifactError(RuntimeError):
    """The artifact cannot be used: missing, malformed or tampered with."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _target(device: str) -> dict[str, Any]:
    backend = backend_of(device)
    info = device_info(device) if backend == "cuda" else None
    return {"backend": backend, "arch": info.arch if info else f"native-{platform.machine()}",
            "device_name": info.name if info else platform.processor() or platform.machine(),
            "torch": torch.__version__.split("+")[0], "cuda": torch.version.cuda}


@dataclass(frozen=True)
class ExportedKernel:
    variant: Variant
    source: str
    binary: Path
    candidate_id: int | None
    speedup: float | None
    calls: int = 0                  # for the dispatch-cost filter at load: this variant's calls per forward,
    eager_us: float | None = None   # one call's eager and kernel time (from one evaluation),
    kernel_us: float | None = None
    op_calls: int = 0               # and the calls of its operator per forward, all variants
    plan: Any = None                # CUDA: its LaunchPlan (kernels/_plan.py), or why it has none (str); None: not asked


def export_artifact(path: str | Path, kernels: Iterable[ExportedKernel], device: str, evaluator: Any = None) -> Path:
    """Write ``kernels`` (validated winners) to the folder ``path``; returns it. A CUDA kernel is written with its
    launch plan (its ``plan``, else one ``evaluator`` records in the sandbox): what ``kforge.load`` replays; one that
    has none is written with the reason (``not_replayable``) and stays on eager where it is loaded."""
    root = Path(path)
    if root.exists() and any(root.iterdir()) and not (root / "manifest.json").exists():
        raise ArtifactError(f"{root} exists and is not a kforge artifact; choose an empty or new folder")
    if (root / "kernels").exists():
        shutil.rmtree(root / "kernels")
    (root / "kernels").mkdir(parents=True, exist_ok=True)
    entries = []
    ext = ".cu" if backend_of(device) == "cuda" else ".c"
    for k in kernels:
        stem = k.variant.key
        src, lib = root / "kernels" / f"{stem}{ext}", root / "kernels" / f"{stem}.so"
        src.write_text(k.source)
        shutil.copyfile(verify_binary(k.binary), lib)  # NB: a changed cache entry never reaches an artifact
        entry = {"variant": k.variant.to_json(), "signature": k.variant.signature,
                 "source": src.name, "source_sha256": _sha256(src),
                 "binary": lib.name, "binary_sha256": _sha256(lib),
                 "candidate_id": k.candidate_id, "speedup": k.speedup, "calls": k.calls,
                 "eager_us": k.eager_us, "kernel_us": k.kernel_us, "op_calls": k.op_calls}
        if backend_of(device) == "cuda" and replay_enabled():
            entry.update(_write_plan(root, stem, k, evaluator))
        entries.append(entry)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "kforge": __version__,
                "contract": CONTRACT_VERSION, "target": _target(device), "kernels": entries}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return root


def _write_plan(root: Path, stem: str, k: ExportedKernel, evaluator: Any) -> dict[str, Any]:
    """A CUDA kernel's launch plan written beside it (the plan's JSON and each module's bytes): its manifest fields."""
    from ..kernels._plan import LaunchPlan
    from ._replay import recorded_plan

    plan = k.plan
    if plan is None and evaluator is not None:
        plan = recorded_plan(k.variant, k.source, evaluator)
    if not isinstance(plan, LaunchPlan):
        return {"not_replayable": plan or "no launch plan was recorded (export with an evaluator)"}
    modules = []
    for i, image in enumerate(plan.modules):
        f = root / "kernels" / f"{stem}.module{i}.fatbin"
        f.write_bytes(image)
        modules.append(f.name)
    pf = root / "kernels" / f"{stem}.plan.json"
    pf.write_text(json.dumps(plan.to_json(), indent=1))
    return {"plan": pf.name, "plan_sha256": _sha256(pf), "modules": modules}


def _read_plan(root: Path, e: dict) -> Any:
    """The entry's LaunchPlan (its files were checked by ``read_manifest``), or why it has none (str)."""
    from ..kernels._plan import LaunchPlan

    if "plan" not in e:
        return e.get("not_replayable") or "the artifact holds no launch plan for it (export it again)"
    try:
        modules = [(root / "kernels" / name).read_bytes() for name in e["modules"]]
        return LaunchPlan.from_json(json.loads((root / "kernels" / e["plan"]).read_text()), modules)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"the launch plan of {e.get('signature')} is malformed ({exc}): export it again") from None


def read_manifest(path: str | Path) -> dict:
    root = Path(path)
    mf = root / "manifest.json"
    if not mf.exists():
        raise ArtifactError(f"{root} has no manifest.json: not a kforge artifact (make one with session.export)")
    try:
        manifest = json.loads(mf.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{mf} is not valid JSON ({exc}); the artifact is damaged") from None
    if manifest.get("format") != FORMAT or manifest.get("format_version", 0) > FORMAT_VERSION:
        raise ArtifactError(f"{root} is not a kforge artifact this version can read "
                            f"(format {manifest.get('format')!r} v{manifest.get('format_version')})")
    for e in manifest["kernels"]:
        if "plan" in e:   # NB: modules are named by their SHA-256 in the plan itself, checked when it is read
            for name in [e["plan"], *e.get("modules", [])]:
                if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
                    raise ArtifactError(f"manifest names a file outside the artifact: {name!r}")
            if _sha256(root / "kernels" / e["plan"]) != e.get("plan_sha256"):
                raise ArtifactError(f"{e['plan']} does not match its checksum in manifest.json: the artifact was "
                                    "modified or damaged; refusing to load it. Export it again from the session")
        for kind in ("source", "binary"):
            name = e[kind]
            if "/" in name or "\\" in name or name.startswith("."):
                raise ArtifactError(f"manifest names a file outside the artifact: {name!r}")
            p = root / "kernels" / name
            if not p.exists():
                raise ArtifactError(f"{p} is missing from the artifact")
            if _sha256(p) != e[f"{kind}_sha256"]:
                raise ArtifactError(f"{p} does not match its checksum in manifest.json: the artifact was modified "
                                    "or damaged; refusing to load it. Export it again from the session")
    return manifest


def load_artifact(model: Any, path: str | Path, *, device: str | None = None, revalidate: bool | None = None,
                  install: bool = True, all_winners: bool = False, dispatch_cost: DispatchCost | None = None
                  ) -> Deployment:
    """Install the kernels of an exported artifact for ``model``; no LLM, no search, no store. Region and
    fused-operator kernels run in ``model``'s forward captured as a graph, as ``Session.apply`` runs them.

    ``revalidate``: None (default) re-validates only when the artifact was built for another
    target (architecture, backend or torch version); True always; False never. As in
    ``Session.apply``, an operator's kernels are left out when dispatching it costs this host more
    than they save (``all_winners=True`` installs them anyway), the cost measured in this process
    unless ``dispatch_cost`` or ``KFORGE_DISPATCH_COST`` gives it.
    """
    root = Path(path)
    manifest = read_manifest(root)
    here_device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    here = _target(here_device)
    built = manifest["target"]
    same_target = all(built.get(k) == here[k] for k in ("backend", "arch", "torch"))
    if built["backend"] != here["backend"]:
        raise ArtifactError(f"the artifact holds {built['backend']} kernels but this process runs on "
                            f"{here['backend']}: export it again from a session on this backend")
    check = (not same_target) if revalidate is None else revalidate
    kernels: list[DeployedKernel] = []
    entries, skipped = _worth_dispatching(manifest["kernels"], here_device, all_winners, dispatch_cost)
    evaluator = None
    try:
        for e in entries:
            variant = _retarget(Variant.from_json(e["variant"]), here_device)
            source = (root / "kernels" / e["source"]).read_text()
            if same_target:
                binary = root / "kernels" / e["binary"]
            else:
                try:
                    binary = compile_source(source, here["backend"], here["arch"] if here["backend"] == "cuda"
                                            else "native").path
                except Exception as exc:
                    skipped.append((variant.signature, f"does not build for {here['arch']}: {exc}"))
                    continue
            if check:
                if evaluator is None:
                    from ..evaluate import Evaluator

                    evaluator = Evaluator(here_device)
                ev = evaluator.evaluate_variant(variant, source)
                if not ev.status.is_correct:
                    skipped.append((variant.signature, f"re-validation on this machine: {ev.summary()}"))
                    continue
            if here["backend"] == "cuda" and replay_enabled():
                # NB: a CUDA kernel is replayed from its launch plan, never loaded here: the artifact's own on this
                # target, else one recorded now in the sandbox from the source
                plan = _read_plan(root, e) if same_target else None
                if plan is None or (isinstance(plan, str) and "plan" not in e and "not_replayable" not in e):
                    if evaluator is None:
                        from ..evaluate import Evaluator

                        evaluator = Evaluator(here_device)
                    from ._replay import recorded_plan

                    plan = recorded_plan(variant, source, evaluator)
                exported = ExportedKernel(variant, source, binary, e.get("candidate_id"), e.get("speedup"),
                                          kernel_us=e.get("kernel_us"), plan=plan)
                from ._replay import deploy_winners

                got, left = deploy_winners([exported], warn=False)
                kernels += got
                skipped += left
                continue
            kernels.append(DeployedKernel.from_binary(variant, binary, e["binary_sha256"] if same_target else None,
                                                      e.get("candidate_id"), e.get("speedup"), kernel_us=e.get("kernel_us")))
    finally:
        if evaluator is not None:
            evaluator.close()
    for sig, why in skipped:
        warnings.warn(f"kforge: {sig} stays on eager: {why}", stacklevel=2)
    from ._recheck import refuse_failing

    kernels, refused = refuse_failing(kernels)   # NB: fresh inputs only: an artifact carries no examples
    dep = Deployment(kernels, model, skipped + refused)
    return dep.install() if install else dep


def _worth_dispatching(entries: list[dict], device: str, all_winners: bool, cost: DispatchCost | None
                       ) -> tuple[list[dict], list[tuple[str, str]]]:
    """The dispatch-cost filter of ``Session.apply`` on a manifest's kernels (those that carry timings)."""
    timed = [e for e in entries if e.get("calls") and e.get("eager_us") and e.get("kernel_us")]
    if all_winners or not timed:
        return entries, []
    winners, cards = {}, []
    for i, e in enumerate(timed):
        card = Card(Variant.from_json(e["variant"]), e["calls"], e["eager_us"], 0.0, None)
        winners[i] = Winner(card, e["eager_us"], e["kernel_us"])
        cards.append(card)
    op_calls = {}
    for e, card in zip(timed, cards):
        op_calls[card.op] = max(op_calls.get(card.op, 0), e.get("op_calls") or 0)
    kept, skipped = select_winners(cards + _unseen_calls(cards, op_calls), list(winners.values()),
                                   dispatch_cost(device, cost))
    keep = {id(w) for w in kept}
    chosen = [e for i, e in enumerate(timed) if id(winners[i]) in keep]
    return [e for e in entries if e not in timed] + chosen, skipped


def _unseen_calls(cards: list, op_calls: dict[str, int]) -> list:
    """Stand-in cards for an operator's calls that have no kernel (they pay the guard's miss cost)."""
    out = []
    for op, n in op_calls.items():
        mine = [c for c in cards if c.op == op]
        rest = n - sum(c.calls for c in mine)
        if rest > 0:
            out.append(Card(mine[0].variant, rest, 0.0, 0.0, None))
    return out


def _retarget(variant: Variant, device: str) -> Variant:
    """The variant on this process's device index."""
    if device.startswith("cuda") and ":" not in device:
        device = f"cuda:{torch.cuda.current_device()}"
    return variant.on(str(torch.device(device)) if not device.startswith("cuda") else device)
