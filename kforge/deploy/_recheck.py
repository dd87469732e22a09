"""The last check before a kernel runs in the user's process: the kernel, as it will be called there.

The evaluator judges a candidate inside a sandboxed runner. A kernel could tell that process from
the user's (an environment variable, its parent, its working folder, its call rate) and compute
correctly only there. So before a winner is installed, the very launcher the model will call runs
here, on the card's captured examples and on fresh random inputs, and its outputs are compared with
eager's; the inputs must be unchanged afterwards. A kernel that fails is refused and stays eager.

NB: this runs the kernel in the user's process by design (that is where it will run once installed);
it cannot make a hostile kernel safe, only catch one that computes differently here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..ops import Variant, get_spec
from ._launch import _non_overlapping


@dataclass(frozen=True)
class Recheck:
    """The outcome of re-checking one kernel in this process."""

    ok: bool
    message: str
    sets: int          # input sets checked (examples + fresh)

    def __bool__(self) -> bool:
        return self.ok


def _load(path: str | None, device: str) -> torch.Tensor | None:
    if path is None:
        return None
    return torch.load(path, map_location="cpu", weights_only=True).to(device)


def _fresh_like(t: torch.Tensor, sig=None) -> torch.Tensor:
    """A copy of ``t`` at a new address, laid out as the variant's input ``sig`` has it (the kernel reads by those
    strides, and the store keeps examples dense), or as ``t`` is (without ``sig``, or where ``sig``'s layout is a
    broadcast no copy can take)."""
    stride = tuple(sig.stride) if sig is not None and tuple(sig.shape) == tuple(t.shape) else t.stride()
    if not _non_overlapping(t.shape, stride):
        stride = t.stride()
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t)


def recheck(launch: Callable[[tuple], Sequence[torch.Tensor]], variant: Variant,
            examples: Sequence[tuple[Sequence[str | None], Sequence[str]]] = (), *,
            random_sets: int = 2, seed: int = 0x4B46) -> Recheck:
    """Run ``launch`` (the installed kernel's call) on ``examples`` (blob paths, as the store gives
    them) and ``random_sets`` fresh input sets, and compare with eager's reference."""
    from ..evaluate._checks import compare, reference_outputs, same_bits

    spec = get_spec(variant.op)
    params = variant.param_dict
    device = variant.device
    sets: list[tuple[str, list]] = []
    for i, (ins, _outs) in enumerate(examples):
        try:
            sets.append((f"example {i}", [_load(p, device) for p in ins]))
        except (OSError, RuntimeError) as exc:
            return Recheck(False, f"example {i} could not be read ({exc}); capture again or pass "
                           "recheck=False to install without this check", 0)
    for i in range(random_sets):
        sets.append((f"fresh set {i}", spec.random_inputs(variant, seed=seed + i)))
    for label, inputs in sets:
        # NB: laid out as the variant has them (a stored example is dense), then copied for the kernel, so a
        # write into an input is seen and the reference stays clean
        inputs = [_fresh_like(t, sig) if t is not None else None for t, sig in zip(inputs, variant.inputs)]
        refs = reference_outputs(spec, inputs, params)
        copies = tuple(_fresh_like(t) if t is not None else None for t in inputs)
        with torch.no_grad():
            try:
                outs = list(launch(copies))
            except Exception as exc:  # a launch error here is a refusal, not a crash of the user's code
                return Recheck(False, f"{label}: the kernel failed in this process ({exc})", len(sets))
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        for c, t in zip(copies, inputs):
            if c is not None and not same_bits(c, t):
                return Recheck(False, f"{label}: the kernel modified an input in this process", len(sets))
        if len(outs) != len(refs):
            return Recheck(False, f"{label}: {len(outs)} outputs, eager gives {len(refs)}", len(sets))
        for j, (o, r) in enumerate(zip(outs, refs)):
            m = compare(spec, o, r, f"{label}, output {j}")
            if not m.ok:
                return Recheck(False, f"computes differently in this process than where it was judged: {m.message}",
                               len(sets))
    return Recheck(True, f"matched eager on {len(sets)} input sets in this process", len(sets))


def example_paths_of(store, key: str) -> list[tuple[list[str | None], list[str]]]:
    """The card's captured examples as blob paths (none without a store)."""
    return [] if store is None else store.example_paths(key)


def refuse_failing(kernels: Sequence, examples_of: Callable[[Variant], Sequence] = lambda v: ()
                   ) -> tuple[list, list[tuple[str, str]]]:
    """``kernels`` (DeployedKernels) split into those that pass :func:`recheck` here and
    ``(signature, reason)`` for each refused one; ``examples_of(variant)`` gives a kernel's captured
    examples. Each refusal is warned about: the operator stays eager."""
    import warnings

    kept, refused = [], []
    for dk in kernels:
        result = recheck(dk, dk.variant, examples_of(dk.variant))
        dk.reset_calls()
        if result.ok:
            kept.append(dk)
        else:
            refused.append((dk.variant.signature, f"refused at apply: {result.message}"))
            warnings.warn(f"kforge: {dk.variant.signature} stays on eager: refused at apply: {result.message}",
                          stacklevel=3)
    return kept, refused
