"""The last check before a kernel is installed: the kernel, as the model will call it.

The evaluator judges a candidate inside a sandboxed runner. A kernel could tell that runner from
where it is deployed (an environment variable, its parent, its working folder, its call rate) and
compute correctly only there. So before a winner is installed, the very launch the model will call
runs here, on the card's captured examples and on fresh random inputs, and its outputs are compared
with eager's; the inputs must be unchanged afterwards. A kernel that fails is refused and stays eager.
A CPU kernel is called through the sandboxed worker that will serve it (``deploy._worker``), strictly:
a worker that fails during the re-check refuses the kernel, where after install it would fall back to eager.

The re-check is not predictable: its fresh inputs come from the OS's randomness, it makes a random
number of calls, each followed by eager's own call of the operator (as a model interleaves them), and
compares the outputs on every call of a stretch of consecutive calls placed at random (more than half
of them) and on each set's first call, so a kernel right for its first N calls (N under 8 always), or
wrong on its k-th, is caught with high probability; the inputs must be unchanged after every call.

NB: a CUDA kernel runs in the user's process here by design (that is where it will run once installed);
this cannot make a hostile kernel safe, only catch one that computes differently here.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..ops import Variant, get_spec
from ._launch import _non_overlapping


#: calls of the kernel at apply, a number drawn between these; and fresh input sets beside the examples
CALLS = (16, 48)
FRESH_SETS = (2, 4)


@dataclass(frozen=True)
class Recheck:
    """The outcome of re-checking one kernel in this process."""

    ok: bool
    message: str
    sets: int          # input sets checked (examples + fresh)
    calls: int = 0     # calls of the kernel made
    compared: int = 0  # calls whose outputs were compared with eager's

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
            random_sets: int | None = None, seed: int | None = None, calls: int | None = None) -> Recheck:
    """Run ``launch`` (the installed kernel's call) on ``examples`` (blob paths, as the store gives them) and
    fresh input sets, ``calls`` times in all, and compare with eager's reference.

    Unless given, the number of fresh sets, their values, the number of calls, the order of the sets and the
    stretch of calls whose outputs are compared are drawn from the OS's randomness (``seed``: from it instead,
    for a reproducible test). Every set is called at least once; its reference is computed before the kernel
    first runs, from inputs the kernel never sees (each call gets a copy at a new address)."""
    from ..evaluate._arena import poison_value
    from ..evaluate._checks import compare, reference_outputs, same_bits

    rng = random.Random(seed) if seed is not None else random.SystemRandom()
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
    for i in range(random_sets if random_sets is not None else rng.randint(*FRESH_SETS)):
        sets.append((f"fresh set {i}", spec.random_inputs(variant, seed=rng.getrandbits(31))))
    if not sets:
        return Recheck(False, "nothing to re-check the kernel on (no examples and no fresh sets)", 0)
    # NB: laid out as the variant has them (a stored example is dense); each call gets its own copy, so a write
    # into an input is seen and the references, made here before any call, stay clean
    sets = [(label, [_fresh_like(t, sig) if t is not None else None for t, sig in zip(inputs, variant.inputs)])
            for label, inputs in sets]
    refs = [reference_outputs(spec, inputs, params) for _, inputs in sets]
    total = calls if calls is not None else rng.randint(max(CALLS[0], len(sets)), max(CALLS[1], 2 * len(sets)))
    total = max(total, len(sets))
    order = list(range(len(sets))) + [rng.randrange(len(sets)) for _ in range(total - len(sets))]
    rng.shuffle(order)
    length = rng.randint(total // 2 + 1, total) if total > 1 else 1
    first = rng.randint(0, total - length)
    stretch = range(first, first + length)
    n_sets = len(sets)
    seen: set[int] = set()
    compared = 0
    for n, s in enumerate(order):
        label, inputs = sets[s]
        where = f"{label}, call {n + 1} of {total}"
        copies = tuple(_fresh_like(t) if t is not None else None for t in inputs)
        with torch.no_grad():
            try:
                outs = list(launch(copies))
            except Exception as exc:  # a launch error here is a refusal, not a crash of the user's code
                return Recheck(False, f"{where}: the kernel failed where it is deployed ({exc})", n_sets, n + 1)
            # NB: eager's own call of the operator after each of the kernel's, as a model interleaves them: the
            # kernel cannot tell the re-check from the model by back-to-back calls
            eager = spec.run_eager(list(inputs), params)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        for c, t in zip(copies, inputs):
            if c is not None and not same_bits(c, t):
                return Recheck(False, f"{where}: the kernel modified an input in this process", n_sets, n + 1)
        if n in stretch or s not in seen:   # NB: every set's first call is compared too, wherever it falls
            seen.add(s)
            compared += 1
            if len(outs) != len(refs[s]):
                return Recheck(False, f"{where}: {len(outs)} outputs, eager gives {len(refs[s])}", n_sets, n + 1)
            for j, (o, r) in enumerate(zip(outs, refs[s])):
                m = compare(spec, o, r, f"{where}, output {j}")
                if not m.ok:
                    return Recheck(False, "computes differently in this process than where it was judged: "
                                   f"{m.message}", n_sets, n + 1, compared)
        # NB: outputs poisoned before they are freed: a kernel that leaves its output unwritten finds poison in the
        # block the allocator hands it next, never an earlier call's (or eager's) right answer for the same set
        held = {t.untyped_storage().data_ptr() for t in (*inputs, *copies) if t is not None}
        for t in [*outs, *(eager if isinstance(eager, (tuple, list)) else [eager])]:
            # NB: never an input's memory (an operator whose eager result is a view of its input)
            if isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().data_ptr() not in held:
                t.fill_(poison_value(t.dtype, n))
    return Recheck(True, f"matched eager on {n_sets} input sets in this process ({compared} of {total} calls compared)",
                   n_sets, total, compared)


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
        result = recheck(getattr(dk, "checked", dk), dk.variant, examples_of(dk.variant))
        dk.reset_calls()
        if result.ok:
            kept.append(dk)
        else:
            if hasattr(dk, "close"):
                dk.close()   # NB: a refused kernel's worker goes now, not when the kernel is collected
            refused.append((dk.variant.signature, f"refused at apply: {result.message}"))
            warnings.warn(f"kforge: {dk.variant.signature} stays on eager: refused at apply: {result.message}",
                          stacklevel=3)
    return kept, refused
