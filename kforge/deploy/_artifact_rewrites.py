"""Inference rewrites carried by an exported artifact: what ``Session.export(rewrites=...)`` records (each rewrite's
verdict, and a ``Probe``: the session's inputs described without their values) and the check ``kforge.load`` makes
before it installs one (``load_rewrites``: the model with the rewrite against the model without it, on inputs the
load is given or drawn from the probe). A rewrite's constants are made from the loaded model's own parameters, so the
check is about that model, whatever target the artifact was built for."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.utils._pytree as pytree

from ..rewrites import get_rewrite
from ._deployment import Deployment
from ._fallback import RewriteVerdict
from ._graph import no_recompile_limit
from ._outputs import relative_difference, wrong_output

PROBES_AT_LOAD = 3   # probe inputs drawn where the load is given none (two beside the ones it is given)
# NB: a manifest's probe is the export's word for the inputs' sizes: a damaged or forged one could ask for any
# amount of memory, so a probe larger than this (one batch) is not drawn and the rewrites wait for inputs=
PROBE_LIMIT_BYTES = 1 << 30


@dataclass(frozen=True)
class ProbeTensor:
    """One input tensor without its values: its shape and dtype, and what a probe draws in its place: a floating
    tensor's mean and spread (normal values), an integer or bool tensor's least and greatest value (uniform)."""

    shape: tuple[int, ...]
    dtype: str
    mean: float | None = None
    std: float | None = None
    low: int | None = None
    high: int | None = None
    channels_last: bool = False

    @classmethod
    def of(cls, t: torch.Tensor) -> "ProbeTensor | str":
        """``t`` described, or why it cannot be (a complex or sparse tensor)."""
        if t.is_complex() or t.layout != torch.strided:
            kind = str(t.dtype).replace("torch.", "") + ("" if t.layout == torch.strided else f" {t.layout}")
            return f"the inputs hold a {kind} tensor, which kforge draws no probe of"
        dtype = str(t.dtype).replace("torch.", "")
        last = t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
        shape = tuple(int(n) for n in t.shape)
        if t.numel() == 0:
            return cls(shape, dtype, channels_last=last)
        if t.is_floating_point():
            wide = t.detach().double()
            return cls(shape, dtype, float(wide.mean()), float(wide.std()) if t.numel() > 1 else 0.0,
                       channels_last=last)
        wide = t.detach().long()
        return cls(shape, dtype, low=int(wide.min()), high=int(wide.max()), channels_last=last)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * getattr(torch, self.dtype).itemsize

    def draw(self, device: torch.device | str, gen: torch.Generator) -> torch.Tensor:
        dtype = getattr(torch, self.dtype)
        if dtype.is_floating_point:
            values = torch.randn(self.shape, generator=gen, dtype=torch.float32) * (self.std or 0.0) + (self.mean or 0.0)
        else:
            low, high = self.low or 0, self.high if self.high is not None else 0
            values = torch.randint(low, high + 1, self.shape, generator=gen, dtype=torch.int64)
        out = values.to(dtype=dtype, device=device)
        return out.contiguous(memory_format=torch.channels_last) if self.channels_last else out

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "mean": self.mean, "std": self.std, "low": self.low,
                "high": self.high, "channels_last": self.channels_last}

    @classmethod
    def from_json(cls, d: dict) -> "ProbeTensor":
        dtype = str(d["dtype"])
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"no torch dtype {dtype!r}")
        shape = tuple(int(n) for n in d["shape"])
        if any(n < 0 for n in shape):
            raise ValueError(f"a negative size in shape {list(shape)}")
        numbers = {k: d.get(k) for k in ("mean", "std", "low", "high")}
        for k, x in numbers.items():
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))):
                raise ValueError(f"{k} {x!r} is not a number")
        return cls(shape, dtype, numbers["mean"], numbers["std"], numbers["low"], numbers["high"],
                   d.get("channels_last") is True)


_PLAIN = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class Probe:
    """The session's inputs without their values: their structure (``torch.utils._pytree``'s, as JSON) and each
    leaf, a tensor as a ``ProbeTensor``, a plain value (a number, a string, None) as it is. ``draw`` makes inputs of
    the same shapes, dtypes and ranges: what ``kforge.load`` checks a rewrite on where it is given no inputs."""

    structure: str
    leaves: tuple[Any, ...]

    @classmethod
    def of(cls, args: tuple, kwargs: dict) -> "Probe | str":
        """The inputs ``(args, kwargs)`` described, or why they cannot be (a leaf that is neither a tensor nor a
        plain value)."""
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        out: list[Any] = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                described = ProbeTensor.of(leaf)
                if isinstance(described, str):
                    return described
                out.append(described)
            elif isinstance(leaf, _PLAIN):
                out.append(leaf)
            else:
                return f"the inputs hold a {type(leaf).__name__}, which kforge draws no probe of"
        try:
            structure = pytree.treespec_dumps(spec)
        except Exception as exc:  # noqa: BLE001 - a container pytree cannot write (a custom class): no probe
            return f"kforge cannot record the inputs' structure ({type(exc).__name__}: {exc})"
        return cls(structure, tuple(out))

    def draw(self, device: torch.device | str, seed: int) -> tuple[tuple, dict]:
        gen = torch.Generator().manual_seed(seed)
        leaves = [leaf.draw(device, gen) if isinstance(leaf, ProbeTensor) else leaf for leaf in self.leaves]
        args, kwargs = pytree.tree_unflatten(leaves, pytree.treespec_loads(self.structure))
        return tuple(args), dict(kwargs)

    def to_json(self) -> dict:
        return {"structure": json.loads(self.structure),
                "leaves": [{"tensor": leaf.to_json()} if isinstance(leaf, ProbeTensor) else {"value": leaf}
                           for leaf in self.leaves]}

    @classmethod
    def from_json(cls, d: dict) -> "Probe":
        leaves = tuple(ProbeTensor.from_json(leaf["tensor"]) if "tensor" in leaf else leaf["value"]
                       for leaf in d["leaves"])
        structure = json.dumps(d["structure"])
        pytree.treespec_loads(structure)   # NB: malformed here, not at the first draw
        return cls(structure, leaves)


def _device_of(model: torch.nn.Module) -> torch.device:
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


def load_rewrites(deployment: Deployment, exported: Sequence[RewriteVerdict], *, inputs: tuple[tuple, dict] | None,
                  probe: Probe | str | None, check: bool = True, wanted: Sequence[str] | None = None) -> Deployment:
    """``deployment`` (a loaded artifact's, not yet installed) with the rewrites its export kept (``exported``; only
    those of ``wanted`` where given), each checked first: the model with it against the model without it, its output
    held to eager's tolerance, on ``inputs`` (the load's own, plus two probe inputs drawn like them) or on inputs
    drawn from the exported ``probe``. One that fails is left out (``deployment.skipped`` says why); where there is
    nothing to check on, it is made unchecked, with a warning saying how to check it. ``check=False``
    (``revalidate=False``) makes them unchecked, silently. ``deployment.rewrite_checks`` holds the verdicts."""
    model = deployment.model
    asked = None if wanted is None else tuple(wanted)
    candidates: list[RewriteVerdict] = []
    for v in exported:
        if asked is not None and v.rewrite not in asked:
            continue
        if not v.kept:
            deployment.skipped.append((v.rewrite, f"left out when the artifact was exported: {v.why}"))
            continue
        try:
            get_rewrite(v.rewrite)
        except ValueError:
            deployment.skipped.append((v.rewrite, "this kforge has no rewrite of that name (the artifact was exported "
                                                  "by another version): install that version, or export it again"))
            continue
        candidates.append(v)
    for name in asked or ():
        if name not in {v.rewrite for v in exported}:
            deployment.skipped.append((name, "the artifact carries no verdict on it: export it with "
                                             f"Session.export(path, rewrites=({name!r},))"))
    if not candidates:
        return deployment
    if not isinstance(model, torch.nn.Module) or not check:
        # NB: a deployment that is not for a module lists them in skipped as it installs (its compile makes them)
        why = "not checked on load (revalidate=False)" if check is False else "not checked on load: no nn.Module"
        deployment.rewrites = tuple(v.rewrite for v in candidates)
        deployment.rewrite_checks = [_unchecked(v, why) for v in candidates]
        return deployment
    if in_training(model):
        verdicts = [RewriteVerdict(v.rewrite, "eager", False, (), TRAINING) for v in candidates]
        deployment.rewrite_checks = verdicts
        deployment.skipped.extend((v.rewrite, v.why) for v in verdicts)
        return deployment
    batches, where, why_not = _batches_at_load(model, inputs, probe)
    if not batches:
        # NB: never made unchecked: a rewrite whose output nothing here can check stays out (a forged or damaged
        # manifest's verdict alone installs nothing); the load's own inputs check it
        why = (f"on load: {why_not}, so its output cannot be checked here: pass inputs= to kforge.load to "
               "check it on them (or revalidate=False to make it unchecked)")
        verdicts = [RewriteVerdict(v.rewrite, "eager", False, (), why) for v in candidates]
        deployment.rewrite_checks = verdicts
        deployment.skipped.extend((v.rewrite, v.why) for v in verdicts)
        return deployment
    verdicts = [_checked_at_load(v, deployment.kernels, model, batches, where) for v in candidates]
    deployment.rewrites = tuple(v.rewrite for v in verdicts if v.kept)
    deployment.rewrite_checks = verdicts
    deployment.skipped.extend((v.rewrite, v.why) for v in verdicts if not v.kept)
    return deployment


TRAINING = ("left out: the model is in training mode (a module's .training is True): a rewrite is for inference, "
            "and checking it would run forwards that update the batch norms' running statistics; call model.eval() "
            "first")


def in_training(model: Any) -> bool:
    """Whether any module of ``model`` (an nn.Module) is in training mode."""
    return isinstance(model, torch.nn.Module) and any(m.training for m in model.modules())


def _unchecked(v: RewriteVerdict, why: str) -> RewriteVerdict:
    return RewriteVerdict(v.rewrite, v.mode, True, (), f"{v.why}; {why}", v.comparison)


def _batches_at_load(model: torch.nn.Module, inputs: tuple[tuple, dict] | None, probe: Probe | str | None
                     ) -> tuple[list[tuple[tuple, dict]], str, str]:
    """The inputs a rewrite is checked on at load, what they are (for its verdict), and, where there are none, why."""
    device = _device_of(model)
    if inputs is not None:
        own = Probe.of(*inputs)
        drawn = [] if isinstance(own, str) else [own.draw(device, seed) for seed in range(PROBES_AT_LOAD - 1)]
        return [inputs, *drawn], f"the inputs given to kforge.load and {len(drawn)} drawn like them", ""
    if probe is None:
        return [], "", "the artifact records no probe input (an export before kforge recorded one, or a damaged manifest)"
    if isinstance(probe, str):
        return [], "", f"the artifact records no probe input ({probe})"
    size = sum(leaf.nbytes for leaf in probe.leaves if isinstance(leaf, ProbeTensor))
    if size > PROBE_LIMIT_BYTES:
        return [], "", (f"the artifact's probe describes inputs of {size / 2**30:.1f} GiB, more than the "
                        f"{PROBE_LIMIT_BYTES / 2**30:.0f} GiB kforge draws for a check")
    try:
        batches = [probe.draw(device, seed) for seed in range(PROBES_AT_LOAD)]
    except Exception as exc:  # noqa: BLE001 - a probe this torch cannot draw is no probe
        return [], "", f"the artifact's probe input cannot be drawn here ({type(exc).__name__}: {exc})"
    return batches, f"{len(batches)} probe inputs drawn like the exported session's", ""


def _checked_at_load(v: RewriteVerdict, kernels: Sequence[Any], model: torch.nn.Module,
                     batches: Sequence[tuple[tuple, dict]], where: str) -> RewriteVerdict:
    """``v`` (kept at export) made again on ``model`` and kept only where the output with it is the output without
    it on every batch."""
    plain = Deployment(list(kernels), model, stops_workers=False)
    dep = Deployment(list(kernels), model, stops_workers=False, rewrites=(v.rewrite,))

    def under(d: Deployment, args: tuple, kwargs: dict) -> Any:
        with d:
            return model(*args, **kwargs)

    def left_out(why: str, sites: tuple[str, ...] = ()) -> RewriteVerdict:
        return RewriteVerdict(v.rewrite, v.mode, False, sites, f"on load: {why}", v.comparison)

    with no_recompile_limit(), torch.no_grad():
        try:
            reference = under(plain, *batches[0])
        except Exception as exc:  # noqa: BLE001 - inputs that do not fit this model check nothing
            return left_out(f"the model does not run on {where} ({type(exc).__name__}: {str(exc)[:200]}); pass "
                            "inputs= to kforge.load (what the model runs on) to check it")
        out = under(dep, *batches[0])   # captures the forward and makes the rewrite
        sites = tuple(dep.rewritten)
        if dep.graph is not None and dep.graph.failure is not None:
            return left_out(dep.graph.failure)
        if not sites:
            return left_out(f"nothing in the loaded model's graph matches it (it changed {len(v.sites)} site(s) of "
                            "the exported model's)")
        for i, (args, kwargs) in enumerate(batches):
            if i:
                reference, out = under(plain, args, kwargs), under(dep, args, kwargs)
            why = wrong_output(relative_difference(reference, out, model), 0.0, reference, "eager", model=model)
            if why is not None:
                return left_out(f"on input {i + 1} of {where}: {why}", sites)
    moved = "" if len(sites) == len(v.sites) else f" (the exported model's: {len(v.sites)})"
    return RewriteVerdict(v.rewrite, v.mode, True, sites,
                          f"{v.why}; on load: made at {len(sites)} site(s){moved}, the output the model's without it "
                          f"on {where}", v.comparison)
