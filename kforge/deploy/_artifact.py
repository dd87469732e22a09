"""Exported artifacts: a folder with a JSON manifest, each winner's source and binary, checksums.

Loading never unpickles anything: the manifest is JSON and binaries are checked against their
SHA-256 before they are loaded. On another GPU architecture, backend or torch version, each
kernel is rebuilt from its source and re-validated against eager before use; any that fails stays
on eager, and the report says so. The inference rewrites an export kept are listed in the manifest with their
verdicts (``rewrites``) and a description of the inputs they were checked on (``probe``); a load makes them again on
the loaded model after checking its output with them (``_artifact_rewrites``). A manifest without them loads with none.
"""
from __future__ import annotations

import hashlib
import json
import platform
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from .._version import __version__
from ..kernels import (
    CONTRACT_VERSION,
    backend_of,
    compile_source,
    device_info,
    verify_binary,
)
from ..ops import Variant
from ..rewrites import as_rewrites
from ._deployment import Deployment
from ._artifact_rewrites import Probe, load_rewrites
from ._deployment_plan import DeploymentPlan, LeftBy, LeftOut, PlannedKernel, choose, left_out
from ._fallback import RewriteVerdict
from ._launch import DeployedKernel, deploy_winners
from ._replay import replay_enabled
from ._select import DispatchCost

FORMAT = "kforge-artifact"
FORMAT_VERSION = 1


class ArtifactError(RuntimeError):
    """The artifact cannot be used: missing, malformed or tampered with."""


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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

    @classmethod
    def of(cls, planned: PlannedKernel, binary: Path) -> "ExportedKernel":
        """A deployment plan's kernel with the binary built from its source."""
        return cls(planned.variant, planned.source, binary, planned.candidate_id, planned.winner_speedup,
                   calls=planned.calls, eager_us=planned.eager_us, kernel_us=planned.kernel_us,
                   op_calls=planned.op_calls)

    @property
    def planned(self) -> PlannedKernel:
        """The deployment plan's record of this kernel (what its manifest entry holds besides its files)."""
        return PlannedKernel(self.variant, self.source, self.candidate_id, self.speedup, self.calls, self.op_calls,
                             self.eager_us, self.kernel_us)


def export_artifact(path: str | Path, kernels: Iterable[ExportedKernel], device: str, evaluator: Any = None, *,
                    rewrites: Sequence[RewriteVerdict] = (), probe: Probe | str | None = None) -> Path:
    """Write ``kernels`` (validated winners) to the folder ``path``; returns it. A CUDA kernel is written with its
    launch plan (its ``plan``, else one ``evaluator`` records in the sandbox): what ``kforge.load`` replays; one that
    has none is written with the reason (``not_replayable``) and stays on eager where it is loaded. ``rewrites``: the
    inference rewrites' verdicts (kept or not), which ``kforge.load`` reads back; ``probe``: the inputs they were
    checked on, described (or why they could not be), which the load draws inputs from to check them again."""
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
        entry = {**k.planned.to_json(), "source": src.name, "source_sha256": _sha256(src),
                 "binary": lib.name, "binary_sha256": _sha256(lib)}
        if backend_of(device) == "cuda" and replay_enabled():
            entry.update(_write_plan(root, stem, k, evaluator))
        entries.append(entry)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "kforge": __version__,
                "contract": CONTRACT_VERSION, "target": _target(device), "kernels": entries}
    if rewrites:
        manifest["rewrites"] = [v.to_json() for v in rewrites]
        manifest["probe"] = probe.to_json() if isinstance(probe, Probe) else {"none": probe or "not recorded"}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return root


def build_kernels(plan: DeploymentPlan, evaluator: Any) -> list[ExportedKernel]:
    """The plan's kernels, each with the binary built from its source for ``evaluator``'s architecture."""
    return [ExportedKernel.of(k, compile_source(k.source, backend_of(k.variant.device), evaluator.arch).path)
            for k in plan.kernels]


def export_plan(path: str | Path, plan: DeploymentPlan, device: str, evaluator: Any = None, *,
                rewrites: Sequence[RewriteVerdict] = (), probe: Probe | str | None = None) -> Path:
    """Write the kernels of ``plan`` to the artifact folder ``path`` (``export_artifact``), built for ``evaluator``'s
    architecture; ``kforge.load`` reads the plan back (``plan_of_artifact``). ``evaluator`` is needed only where the
    plan has kernels (a CUDA kernel's launch plan is recorded by it). ``rewrites`` and ``probe`` as in
    ``export_artifact``."""
    exported = build_kernels(plan, evaluator) if plan.kernels else []
    cuda = any(k.variant.device.startswith("cuda") for k in exported)
    return export_artifact(path, exported, device, evaluator if cuda else None, rewrites=rewrites, probe=probe)


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
    rewrites_of(manifest, root)   # NB: a malformed rewrites field fails here, with the rest of the manifest's checks
    return manifest


def rewrites_of(manifest: dict, root: str | Path = "the artifact") -> tuple[tuple[RewriteVerdict, ...], Probe | str | None]:
    """The inference rewrites' verdicts an artifact's manifest records and the probe input it describes (a string:
    why the export could record none; None: none recorded). A manifest from before rewrites were exported has
    neither: no rewrites."""
    try:
        verdicts = tuple(RewriteVerdict.from_json(d) for d in manifest.get("rewrites") or ())
        raw = manifest.get("probe")
        probe = None if raw is None else str(raw["none"]) if "none" in raw else Probe.from_json(raw)
    except Exception as exc:  # noqa: BLE001 - whatever a damaged manifest makes the parsers raise (pytree raises
        # NotImplementedError for a type it does not know) is one malformed artifact
        raise ArtifactError(f"the rewrites recorded in {root}/manifest.json are malformed ({type(exc).__name__}: "
                            f"{exc}): export it again (a manifest damaged anywhere is not loaded, its kernels neither, "
                            "whatever rewrites= asks)") from None
    return verdicts, probe


def plan_of_artifact(path: str | Path, *, device: str | None = None, all_winners: bool = False,
                     dispatch_cost: DispatchCost | None = None, manifest: dict | None = None) -> DeploymentPlan:
    """The deployment plan of an exported artifact in this process: its kernels as export wrote them
    (``PlannedKernel.from_json``, the inverse of ``PlannedKernel.to_json``) through the same ``choose`` that plans a
    session's, the dispatch cost measured here (or given). ``manifest``: the artifact's, already read."""
    root = Path(path)
    manifest = read_manifest(root) if manifest is None else manifest
    here_device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    winners = [PlannedKernel.from_json(e, (root / "kernels" / e["source"]).read_text()) for e in manifest["kernels"]]
    return choose(winners, device=here_device, all_winners=all_winners, dispatch_cost_given=dispatch_cost)


def load_artifact(model: Any, path: str | Path, *, device: str | None = None, revalidate: bool | None = None,
                  install: bool = True, all_winners: bool = False, dispatch_cost: DispatchCost | None = None,
                  inputs: Any = None, rewrites: Sequence[str] | None = None) -> Deployment:
    """Install the kernels of an exported artifact for ``model``; no LLM, no search, no store. Region and
    fused-operator kernels run in ``model``'s forward captured as a graph, as ``Session.apply`` runs them.

    ``revalidate``: None (default) re-validates only when the artifact was built for another
    target (architecture, backend or torch version); True always; False never. As in
    ``Session.apply``, an operator's kernels are left out when dispatching it costs this host more
    than they save (``all_winners=True`` installs them anyway), the cost measured in this process
    unless ``dispatch_cost`` or ``KFORGE_DISPATCH_COST`` gives it (``plan_of_artifact``).

    The inference rewrites the export kept (``rewrites``: None for all of them, or the names of those wanted) are
    made again in ``model``'s captured forward and in ``Deployment.compile``'s graphs, their constants made from
    ``model``'s own parameters (and made again whenever one changes). Each is first checked: ``model``'s output with
    it against without it, on ``inputs`` (what the model runs on, as for ``Session(model, inputs)``) or on inputs
    drawn from the probe the export recorded; one whose output moves is left out. With nothing to check on it is
    made unchecked, with a warning; ``revalidate=False`` skips the check.
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
    plan = plan_of_artifact(root, device=here_device, all_winners=all_winners, dispatch_cost=dispatch_cost,
                            manifest=manifest)
    entry_of = {Variant.from_json(e["variant"]).key: e for e in manifest["kernels"]}
    kernels: list[DeployedKernel] = []
    left: list[LeftOut] = []
    evaluator = None
    try:
        for k in plan.kernels:
            e = entry_of[k.key]
            variant = _retarget(k.variant, here_device)
            source = k.source
            if same_target:
                binary = root / "kernels" / e["binary"]
            else:
                try:
                    binary = compile_source(source, here["backend"], here["arch"] if here["backend"] == "cuda"
                                            else "native").path
                except Exception as exc:
                    left.append(LeftOut(k.signature, LeftBy.BUILD, f"does not build for {here['arch']}: {exc}"))
                    continue
            if check:
                if evaluator is None:
                    from ..evaluate import Evaluator

                    evaluator = Evaluator(here_device)
                ev = evaluator.evaluate_variant(variant, source)
                if not ev.status.is_correct:
                    left.append(LeftOut(k.signature, LeftBy.REVALIDATION, f"re-validation on this machine: {ev.summary()}"))
                    continue
            if here["backend"] == "cuda" and replay_enabled():
                # NB: a CUDA kernel is replayed from its launch plan, never loaded here: the artifact's own on this
                # target, else one recorded now in the sandbox from the source
                launch_plan = _read_plan(root, e) if same_target else None
                if launch_plan is None or (isinstance(launch_plan, str) and "plan" not in e
                                           and "not_replayable" not in e):
                    if evaluator is None:
                        from ..evaluate import Evaluator

                        evaluator = Evaluator(here_device)
                    from ._replay import recorded_plan

                    launch_plan = recorded_plan(variant, source, evaluator)
                exported = ExportedKernel(variant, source, binary, k.candidate_id, k.winner_speedup,
                                          kernel_us=k.kernel_us, plan=launch_plan)
                got, unreplayable = deploy_winners([exported], warn=False)
                kernels += got
                left += left_out(unreplayable, LeftBy.REPLAY)
                continue
            kernels.append(DeployedKernel.from_binary(variant, binary, e["binary_sha256"] if same_target else None,
                                                      k.candidate_id, k.winner_speedup, kernel_us=k.kernel_us))
    finally:
        if evaluator is not None:
            evaluator.close()
    for lo in plan.left_out + tuple(left):
        warnings.warn(f"kforge: {lo.signature} stays on eager: {lo.reason}", stacklevel=2)
    from ._recheck import refuse_failing

    plan = plan.leaving_out(left)
    kernels, refused = refuse_failing(kernels)   # NB: fresh inputs only: an artifact carries no examples
    dep = Deployment(kernels, model, plan.leaving_out(left_out(refused, LeftBy.RECHECK)).skipped)
    verdicts, probe = rewrites_of(manifest, root)
    if verdicts or rewrites:
        from ..capture import split_batch

        dep = load_rewrites(dep, verdicts, inputs=None if inputs is None else split_batch(inputs), probe=probe,
                            check=revalidate is not False, wanted=None if rewrites is None else as_rewrites(rewrites))
    return dep.install() if install else dep


def _retarget(variant: Variant, device: str) -> Variant:
    """The variant on this process's device index."""
    if device.startswith("cuda") and ":" not in device:
        device = f"cuda:{torch.cuda.current_device()}"
    return variant.on(str(torch.device(device)) if not device.startswith("cuda") else device)
