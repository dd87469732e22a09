"""Run a model eagerly under a recording mode and turn what ran into operator cards."""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode

from ..timing import Clock, Timing, bench, cpu_threads, measurement_threads
from ..ops import OpSpec, Unsupported, Variant, get_spec, inplace_binder, spec_for
from ..ops._functions import PASS, FunctionEntry, Hooks, function_specs, hook_functions, pop_handler, push_handler
from ..store import Store, iter_tensors
from ..ops import Card, Cards


class CaptureError(RuntimeError):
    """The model could not be captured as given; the message says what to do."""


class Batches(list):
    """Several example batches for one capture: ``kforge.Batches([batch1, batch2])``.

    Each batch is what ``example_inputs`` may be: a tensor, a tuple/list of positional
    arguments, or a dict of keyword arguments.
    """


@dataclass
class CaptureLimits:
    """Bounds on what a capture keeps."""

    examples_per_variant: int = 2
    max_example_bytes: int = 1 << 30   # all examples together, each distinct tensor counted once
    max_tensor_bytes: int = 256 << 20  # an example with a larger tensor is not stored


def split_batch(batch: Any) -> tuple[tuple, dict]:
    if isinstance(batch, dict):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)) and not isinstance(batch, Batches):
        return tuple(batch), {}
    return (batch,), {}


@dataclass
class _VariantRecord:
    variant: Variant
    calls: int = 0
    examples: list[tuple[list[str | None], list[str]]] = field(default_factory=list)


class _CallRecorder(TorchFunctionMode):
    """Sees every torch call in the model; records the ones a spec claims.

    NB: while a claimed call runs, this mode is popped, so the calls it makes internally
    (F.layer_norm calling torch.layer_norm) are not counted twice. An operator computed by a library's
    Python function (``OpSpec.functions``) is claimed at the function's hooks (``model``'s submodules and the
    module's global), and the torch calls inside it are not recorded.
    """

    def __init__(self, store: Store | None, limits: CaptureLimits, stored_bytes: list[int], seen_blobs: set[str],
                 timer: "_CallTimer | None" = None, model: Any = None):
        super().__init__()
        self.store = store
        self.limits = limits
        self.records: dict[str, _VariantRecord] = {}
        self.sequence: list[str] = []
        self.uncaptured: collections.Counter[str] = collections.Counter()
        self.outside: collections.Counter[str] = collections.Counter()
        self.timer = timer
        self.model = model
        self._stored_bytes = stored_bytes
        self._seen_blobs = seen_blobs
        self._muted = 0      # > 0 inside a claimed function: its torch calls are its own
        self._hooks: Hooks | None = None
        self._handler = self._on_function   # NB: one object, pushed and popped (each attribute read makes a new one)
        self._thread = threading.get_ident()

    def __enter__(self):
        specs = function_specs()
        self._hooks = hook_functions(specs, self.model) if specs else None
        for op in self._hooks.ops if self._hooks is not None else ():
            push_handler(op, self._handler)
        try:
            return super().__enter__()
        except BaseException:
            self._unhook()
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._unhook()

    def _unhook(self) -> None:
        if self._hooks is not None:
            for op in self._hooks.ops:
                pop_handler(op, self._handler)
            self._hooks.release()
            self._hooks = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._muted:
            return func(*args, **kwargs)
        spec = spec_for(func)
        if spec is None:
            result = func(*args, **kwargs)
            if _computes(result, args, kwargs):
                self.outside[getattr(func, "__name__", str(func))] += 1
            return result
        try:
            call = inplace_binder(spec, func)(*args, **kwargs)
        except (Unsupported, TypeError, ValueError):
            self.uncaptured[spec.name] += 1
            return func(*args, **kwargs)
        return self._claim(spec, call, lambda: func(*args, **kwargs),
                           lambda r: list(r) if isinstance(r, (tuple, list)) else [r])

    def _on_function(self, point: FunctionEntry, args: tuple, kwargs: dict) -> Any:
        """A call of an operator's Python function, at one of its hooks: recorded when this recorder's thread
        makes it (as its torch function mode sees that thread's calls only); another thread's is not its own."""
        if threading.get_ident() != self._thread:
            return PASS

        def run():
            # NB: with this mode popped, as torch pops it for a claimed torch call: muted but still on the stack,
            # each of the function's dozens of torch calls passed through it, inside the timed call (about 40%
            # of the gated delta rule's time on a CPU, found by review)
            self._muted += 1
            try:
                if torch.overrides._get_current_function_mode() is self:
                    with torch.overrides._pop_mode_temporarily():
                        return point.original(*args, **kwargs)
                return point.original(*args, **kwargs)
            finally:
                self._muted -= 1

        if self._muted:
            return run()
        try:
            call = point.target.binder(point.spec)(*args, **kwargs)
        except (Unsupported, TypeError, ValueError):
            self.uncaptured[point.spec.name] += 1
            return run()
        return self._claim(point.spec, call, run, point.target.outputs)

    def _claim(self, spec: OpSpec, call, run: Callable[[], Any], outputs_of: Callable[[Any], list]) -> Any:
        want_example = self._wants_example(spec, call)
        before = [t.detach().clone() if isinstance(t, torch.Tensor) else None for t in call.inputs] \
            if want_example and call.params.get("inplace") else None
        token = self.timer.start() if self.timer is not None else None
        result = run()
        if self.timer is not None:
            self.timer.stop(token)
        try:
            outputs = outputs_of(result)
        except (TypeError, ValueError):
            outputs = [result]
        if not all(isinstance(o, torch.Tensor) for o in outputs):
            self.uncaptured[spec.name] += 1
            return result
        try:
            variant = spec.variant(call, outputs)
        except TypeError:  # a dtype kforge does not handle
            self.uncaptured[spec.name] += 1
            return result
        if self.timer is not None:
            self.timer.name(token, variant.key)
        rec = self.records.setdefault(variant.key, _VariantRecord(variant))
        rec.calls += 1
        self.sequence.append(variant.key)
        if want_example and len(rec.examples) < self.limits.examples_per_variant:
            self._store_example(rec, before if before is not None else list(call.inputs), outputs)
        return result

    def _wants_example(self, spec: OpSpec, call) -> bool:
        if self.store is None:
            return False
        big = any(t is not None and t.numel() * t.element_size() > self.limits.max_tensor_bytes
                  for t in call.inputs if isinstance(t, torch.Tensor))
        return not big

    def _store_example(self, rec: _VariantRecord, inputs: Sequence, outputs: Sequence[torch.Tensor]) -> None:
        tensors = [t for t in list(inputs) + list(outputs) if t is not None]
        new_bytes = sum(t.numel() * t.element_size() for t in tensors)
        if self._stored_bytes[0] + new_bytes > self.limits.max_example_bytes:
            return
        ins = [self.store.put_tensor(t) if t is not None else None for t in inputs]
        outs = [self.store.put_tensor(o) for o in outputs]
        for digest, t in zip(ins + outs, list(inputs) + list(outputs)):
            if digest is not None and digest not in self._seen_blobs:
                self._seen_blobs.add(digest)
                self._stored_bytes[0] += t.numel() * t.element_size()
        rec.examples.append((ins, outs))


def _computes(result: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a call made new tensor data (not a view, not an input handed back, not a size)."""
    if not isinstance(result, torch.Tensor) or result._is_view():
        return False
    return not any(result is a for a in (*args, *kwargs.values()))


def _check_devices(model: Any, batches: Sequence[Any], device: str) -> None:
    want = torch.device(device).type
    for b in batches:
        for t in iter_tensors(split_batch(b)):
            if t.device.type != want:
                raise CaptureError(
                    f"an example input is on {t.device} but the session's device is {device!r}: move the "
                    f"inputs with .to({device!r}) or create the session with device={t.device.type!r}")
    if isinstance(model, torch.nn.Module):
        for name, p in list(model.named_parameters())[:1000]:
            if p.device.type != want:
                raise CaptureError(
                    f"model parameter {name!r} is on {p.device} but the session's device is {device!r}: "
                    f"call model.to({device!r}) first, or create the session with device={p.device.type!r}")


def _run(model: Callable, batch: Any) -> Any:
    args, kwargs = split_batch(batch)
    try:
        return model(*args, **kwargs)
    except Exception as exc:
        raise CaptureError(
            f"the model raised {type(exc).__name__} while running on the example inputs: {exc}. "
            "Check that model(*example_inputs) runs on its own before capturing it") from exc


def capture_cards(model: Callable, batches: Sequence[Any], *, device: str, store: Store | None,
                  limits: CaptureLimits | None = None, timing_budget_ms: float = 100.0,
                  check_repeatable: bool = True, clock: Clock | None = None) -> Cards:
    """Run ``model`` on each batch under the recorder, then measure each variant twice.

    Share: the variant's time inside the model's own warm forwards (where it happens), over the
    forward's time, both the mean over the forwards of a window (on the CPU 50 x
    ``timing_budget_ms``; on CUDA 5 x). Eager time: one call replayed in isolation the way candidates are timed (the
    baseline of speedups). On the CPU both run with no more threads than the idle cores
    (``kforge.timing.measurement_threads``). ``clock``: a nanosecond clock for CPU timings (tests).
    """
    limits = limits or CaptureLimits()
    _check_devices(model, batches, device)
    stored, seen = [0], set()
    records: dict[str, _VariantRecord] = {}
    uncaptured: collections.Counter[str] = collections.Counter()
    outside: collections.Counter[str] = collections.Counter()
    with torch.no_grad():
        for i, batch in enumerate(batches):
            rec = _CallRecorder(store, limits, stored, seen, model=model)
            with rec:
                _run(model, batch)
            if check_repeatable:
                again = _CallRecorder(None, limits, [0], set(), model=model)
                with again:
                    _run(model, batch)
                if again.sequence != rec.sequence:
                    raise CaptureError(
                        f"batch {i}: the model ran different operators on two runs of the same inputs "
                        "(data-dependent control flow or randomness such as dropout). Call model.eval(), fix "
                        "the seed, or pass check_repeatable=False to capture the first run as it is")
            for key, r in rec.records.items():
                mine = records.setdefault(key, _VariantRecord(r.variant))
                mine.calls += r.calls
                room = limits.examples_per_variant - len(mine.examples)
                mine.examples.extend(r.examples[:max(room, 0)])
            uncaptured.update(rec.uncaptured)
            outside.update(rec.outside)
    if not records:
        raise CaptureError(
            "no operator kforge supports ran in this model"
            + (f" (unsupported call forms seen: {dict(uncaptured)})" if uncaptured else "")
            + ". See kforge.ops.all_specs() for the supported operators")

    threads = measurement_threads() if device == "cpu" else None
    if clock is None and threads == 1:
        # NB: on one thread, torch's CPU operators do all their work on this thread, and its CPU
        # time leaves out the moments another process held the core: the work, not the wait.
        clock = time.thread_time_ns
    cards = []
    with cpu_threads(threads):
        window_ms = timing_budget_ms * (_CPU_WINDOW_BUDGETS if device == "cpu" else _CUDA_WINDOW_BUDGETS)
        attribution = _attribute(model, batches, limits, device, window_ms, clock)
        for key, r in records.items():
            if store is not None:
                # NB: recorded before the eager timing reads them back, and rows past this capture's count
                # dropped: a store resumed without its blobs (or captured on other inputs) must not be read.
                for idx, (ins, outs) in enumerate(r.examples):
                    store.save_example(key, idx, ins, outs)
                store.trim_examples(key, len(r.examples))
            timing = time_variant(r.variant, store, key, device, timing_budget_ms, threads=threads, clock=clock)
            noisy = timing.noisy or attribution.noisy.get(key, False)
            cards.append(Card(r.variant, r.calls, timing.median_us, attribution.share.get(key, 0.0),
                              _vendor(r.variant.op, device), len(r.examples), timing.robust_spread, noisy,
                              attribution.forward_us.get(key, 0.0)))
    cards.sort(key=lambda c: (-c.share, -c.total_us))
    return Cards(tuple(cards), attribution.model.mean_us, tuple(sorted(uncaptured.items())), threads=threads,
                 model_noisy=attribution.model.noisy, outside=tuple(sorted(outside.items(), key=lambda kv: (-kv[1], kv[0]))))


# What eager dispatches to on the CPU, for the operators that call a vendor library on CUDA.
_CPU_VENDOR = {"conv1d": "onednn", "conv2d": "onednn", "linear": "blas", "matmul": "blas"}


def _vendor(op: str, device: str) -> str | None:
    """The library eager calls for ``op`` on ``device`` (None: torch's own kernels)."""
    if device == "cpu":
        return _CPU_VENDOR.get(op)
    return get_spec(op).vendor


class _CallTimer:
    """Times each claimed call inside a forward, where it happens.

    CPU: a clock around the call. CUDA: events recorded on the current stream before and after
    the call, so a call's time is the stream's time from its first launch to its last kernel's end;
    calls do not overlap on the stream, so their times cannot add up past the forward's.
    """

    def __init__(self, device: str, clock: Clock | None):
        self.cuda = device.startswith("cuda")
        self.clock = clock or time.perf_counter_ns
        self.calls: list[list] = []   # [start, end, variant key or None]

    def start(self) -> int:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.calls.append([ev, None, None])
        else:
            self.calls.append([self.clock(), None, None])
        return len(self.calls) - 1

    def stop(self, token: int) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.calls[token][1] = ev
        else:
            self.calls[token][1] = self.clock()

    def name(self, token: int, key: str) -> None:
        self.calls[token][2] = key

    def per_key_us(self) -> dict[str, float]:
        """Total time per variant key over the calls of this forward."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = collections.defaultdict(float)
        for start, end, key in self.calls:
            if key is None or end is None:
                continue
            out[key] += start.elapsed_time(end) * 1e3 if self.cuda else (end - start) / 1e3
        return dict(out)


# NB: on a shared CPU the machine's speed changes over hundreds of milliseconds (other processes,
# other virtual machines on the host), and not by the same factor for every operator; shares are
# stable only when the forwards are timed over a window long enough to average those states out
# (benchmarks/share_stability.py). On the CPU the window is this many timing budgets (1 s at the
# session's default 20 ms); on CUDA, where events are steady, 5.
_CPU_WINDOW_BUDGETS = 50
_CUDA_WINDOW_BUDGETS = 5
# A card whose share in the first half of the window differs from its share in the second half by
# more than this (a fraction of the forward) is noisy: another capture could differ as much.
SHARE_HALVES_AGREE = 0.10


@dataclass(frozen=True)
class _Attribution:
    """What the timed forwards say: per variant key its time inside one forward, its share of the
    forward and whether that is too noisy to trust; and the plain forward's timing."""

    forward_us: dict[str, float]
    share: dict[str, float]
    noisy: dict[str, bool]
    model: Timing


def _shares(per_forward: Sequence[dict[str, float]], plain_us: Sequence[float],
            ) -> tuple[dict[str, Timing], Timing, dict[str, float]]:
    """Per-key and plain-forward timings of these forwards, and each key's share of the forward.

    NB: the mean of the repetitions, outliers left out (``Timing.mean_us``), not the median: the time
    a machine spends in slow and fast states mixes into a mean in proportion, while a median jumps
    from one state to the other. The parts of one forward cannot sum past the whole; when the
    parts' means add up to more than the forward's (noise), the parts are the whole.
    """
    keys = sorted({k for f in per_forward for k in f})
    parts = {k: Timing.of([f.get(k, 0.0) for f in per_forward]) for k in keys}
    model = Timing.of(plain_us)
    total = max(model.mean_us, sum(t.mean_us for t in parts.values())) or 1.0
    return parts, model, {k: t.mean_us / total for k, t in parts.items()}


def _attribute(model: Callable, batches: Sequence[Any], limits: CaptureLimits, device: str, window_ms: float,
               clock: Clock | None, min_forwards: int = 6, max_forwards: int = 1000) -> _Attribution:
    """Time each variant where it happens: inside the model's own warm forwards, for ``window_ms``.

    Plain forwards alternate with recorded ones, so both see the same machine: a busy moment slows
    both, not one. A card is noisy when its time varies too much between forwards
    (``Timing.noisy``) or when the two halves of the window give it shares further apart than
    ``SHARE_HALVES_AGREE``.
    """
    per_forward: list[dict[str, float]] = []
    plain_us: list[float] = []
    deadline = time.monotonic() + window_ms / 1e3
    with torch.no_grad():
        while len(per_forward) < max_forwards and (len(per_forward) < min_forwards or time.monotonic() < deadline):
            whole = _CallTimer(device, clock)
            token = whole.start()
            for batch in batches:
                _run(model, batch)
            whole.stop(token)
            whole.name(token, "forward")
            plain_us.append(whole.per_key_us()["forward"])
            totals: dict[str, float] = collections.defaultdict(float)
            for batch in batches:
                timer = _CallTimer(device, clock)
                with _CallRecorder(None, limits, [0], set(), timer, model=model):
                    _run(model, batch)
                for key, us in timer.per_key_us().items():
                    totals[key] += us
            per_forward.append(totals)
    parts, plain, share = _shares(per_forward, plain_us)
    half = len(per_forward) // 2
    *_, first = _shares(per_forward[:half], plain_us[:half])
    *_, second = _shares(per_forward[half:], plain_us[half:])
    noisy = {k: t.noisy or abs(first.get(k, 0.0) - second.get(k, 0.0)) > SHARE_HALVES_AGREE
             for k, t in parts.items()}
    threads = torch.get_num_threads() if device == "cpu" else None
    return _Attribution({k: t.mean_us for k, t in parts.items()}, share, noisy, replace(plain, threads=threads))


def time_variant(variant: Variant, store: Store | None, key: str, device: str, budget_ms: float, *,
                 threads: int | None = None, clock: Clock | None = None):
    """Eager time of one call of ``variant``, replayed in isolation on its stored or fresh inputs.

    The same method that times candidates (inputs cold, L2 flushed): the baseline of speedups.
    """
    spec = get_spec(variant.op)
    examples = store.load_examples(key, device) if store is not None else []
    inputs = examples[0][0] if examples else spec.random_inputs(variant, seed=0)
    params = variant.param_dict
    with torch.no_grad():
        return bench(lambda: spec.run_eager(inputs, params), device=device, budget_ms=budget_ms,
                     min_reps=10 if device == "cpu" else 50, max_rounds=4, threads=threads, clock=clock)
