"""Graph capture: the model's ATen graphs with the shapes it ran, its regions, and region cards.

``torch.compile(model, backend=<recorder>, dynamic=False)`` with AOTAutograd's forward compiler as
the hook: dynamo splits the model into graphs (graph breaks run eager in between, as they do for
any torch.compile), AOTAutograd lowers each to functional ATen with exact shapes, dtypes and
strides in every node's metadata, and no decomposition table is passed, so ``aten.gelu``,
``aten._softmax`` and ``aten.native_layer_norm`` stay whole. The compiled function the recorder
returns runs the graph node by node (``torch.fx.Interpreter``), counting each region's calls and
keeping its first input values as examples.
"""
from __future__ import annotations

import collections
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from ..deploy._graph import no_recompile_limit
from ..ops import Variant, get_spec, torch_dtype, without_prologue
from ..ops._functions import function_specs, graph_calls, hook_functions
from ._finder import FoundRegion


@dataclass
class _Record:
    variant: Variant
    traced: Variant | None = None   # a layout twin's call as the graph traced it (what eager ran)
    calls: int = 0
    examples: list[list[torch.Tensor]] = field(default_factory=list)


@dataclass(frozen=True)
class RegionCapture:
    """What graph capture saw: one record per region variant, how many graphs, and why it stopped."""

    records: tuple[_Record, ...]
    graphs: int
    error: str | None = None

    @property
    def graph_breaks(self) -> int:
        return max(self.graphs - 1, 0)


class _GraphRun:
    """The callable the recorder hands back for one graph: runs it, counting its regions."""

    def __init__(self, gm: fx.GraphModule, regions: list[FoundRegion], owner: "_GraphRecorder"):
        self.gm, self.regions, self.owner = gm, regions, owner
        self.watch: dict[fx.Node, list[tuple[FoundRegion, int]]] = collections.defaultdict(list)
        for r in regions:
            for i, n in enumerate(r.inputs):
                self.watch[n].append((r, i))

    def __call__(self, *args):
        if not self.owner.recording:
            return self.gm(*args)
        wanted = {r.variant.key for r in self.regions
                  if len(self.owner.record(r.variant).examples) < self.owner.examples_per_variant
                  and self.owner.small_enough(r.variant)}
        # NB: per region of the graph, not per variant: two calls of one signature in a graph have
        # inputs of their own, and an example must be one call's
        seen: dict[int, list] = {id(r): [None] * len(r.inputs) for r in self.regions if r.variant.key in wanted}
        watch = self.watch

        class _Interp(TracedLayoutInterpreter):
            def run_node(self, n):
                out = super().run_node(n)
                for r, i in watch.get(n, ()):
                    if id(r) not in seen or not isinstance(out, torch.Tensor):
                        continue
                    # NB: a bias prologue's kernel takes the convolution's output before its bias
                    value = self._without_bias(n, out) if r.peeled is n and i == 0 else out
                    want = r.variant.inputs[i] if i < len(r.variant.inputs) else None
                    if r.traced is not None and want is not None and tuple(value.shape) == want.shape \
                            and tuple(value.stride()) != want.stride \
                            and all(st != 0 or size == 1 for size, st in zip(want.shape, want.stride)):
                        # the card's layout (a channels-last twin), not the one this run made
                        seen[id(r)][i] = torch.empty_strided(want.shape, want.stride, dtype=value.dtype,
                                                             device=value.device).copy_(value)
                    else:
                        seen[id(r)][i] = value.detach().clone()
                return out

            def _without_bias(self, n, out):
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                bias = kwargs["bias"] if "bias" in kwargs else args[2]
                if "bias" in kwargs:
                    kwargs = {**kwargs, "bias": None}
                else:
                    args = (*args[:2], None, *args[3:])
                try:
                    return n.target(*args, **kwargs)
                except RuntimeError:   # NB: where the node itself needed TracedLayoutInterpreter's retry
                    return (out.float() - bias.float().reshape(1, -1, *([1] * (out.dim() - 2)))).to(out.dtype)

        with torch.no_grad():
            result = _Interp(self.gm).run(*args)
        for r in self.regions:
            rec = self.owner.record(r.variant)
            rec.traced = rec.traced or r.traced
            rec.calls += 1
            got = seen.get(id(r))
            if got is not None and all(t is not None for t in got) and len(rec.examples) < self.owner.examples_per_variant:
                rec.examples.append(got)
        return result


class TracedLayoutInterpreter(fx.Interpreter):
    """Runs an ATen graph node by node; a node that fails runs again with its arguments laid out as
    the trace saw them (``_with_traced_strides``)."""

    def run_node(self, n):
        try:
            return super().run_node(n)
        except RuntimeError:
            return _with_traced_strides(self, n)


def _with_traced_strides(interp: fx.Interpreter, n: fx.Node):
    """Run node ``n`` again with every tensor argument laid out as the trace saw it.

    NB: the ATen graph was traced on fake tensors, whose strides can differ from the real ones (on
    the SD3.5 VAE decoder an attention output reached ``native_group_norm`` in a layout the CPU kernel
    refused, which eager's own group_norm makes contiguous first): the graph's own semantics assume the
    traced layout, so the arguments are copied into it. Where that is not the cause, the node fails again
    and that error propagates."""
    args, kwargs = interp.fetch_args_kwargs_from_env(n)

    def relayout(value, node):
        want = node.meta.get("val") if isinstance(node, fx.Node) else None
        if isinstance(value, torch.Tensor) and isinstance(want, torch.Tensor) and value.shape == want.shape \
                and value.stride() != want.stride():
            out = torch.empty_strided(want.shape, want.stride(), dtype=value.dtype, device=value.device)
            return out.copy_(value)
        return value

    args = tuple(relayout(v, a) for v, a in zip(args, n.args))
    kwargs = {k: relayout(v, n.kwargs.get(k)) for k, v in kwargs.items()}
    return getattr(interp, n.op)(n.target, args, kwargs)


class _GraphRecorder:
    """The torch.compile backend of graph capture: records each graph's regions and fused operators (``_GraphRun``)."""

    def __init__(self, examples_per_variant: int, max_tensor_bytes: int | None = None, vendor_chains: Any = False):
        self.examples_per_variant = examples_per_variant
        self.vendor_chains = vendor_chains
        self.max_tensor_bytes = max_tensor_bytes
        self.records: dict[str, _Record] = {}
        self.graphs = 0
        self.recording = True

    def small_enough(self, variant: Variant) -> bool:
        """Whether ``variant``'s examples may be kept: none of its tensors over ``max_tensor_bytes`` (as operator
        capture has it: CaptureLimits). NB: the SD3.5 VAE's fused twins hold 512 MB bf16 tensors; two examples
        each, with their outputs, made gigabytes to clone, write and load again (capture 131 s on the H200)."""
        if self.max_tensor_bytes is None:
            return True
        sigs = [s for s in (*variant.inputs, *variant.outputs) if s is not None]
        return all(s.numel * torch_dtype(s.dtype).itemsize <= self.max_tensor_bytes for s in sigs)

    def record(self, variant: Variant) -> _Record:
        return self.records.setdefault(variant.key, _Record(variant))

    def compile(self, gm: fx.GraphModule, example_inputs) -> Callable:
        from ._deploy import partition

        self.graphs += 1
        # NB: split as deploy splits it: where Inductor will run the graph channels-last, a fused
        # operator's card is its channels-last twin (its examples laid out so: _GraphRun)
        return _GraphRun(gm, partition(gm, chains=self.vendor_chains), self)

    def backend(self):
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=self.compile)


def capture_regions(model: Callable, batches: Sequence[Any], *, examples_per_variant: int = 2,
                    max_tensor_bytes: int | None = None, vendor_chains: Any = False) -> RegionCapture:
    """Run ``model`` once per batch under a recording torch.compile backend and collect its regions (and, with
    ``vendor_chains``, its vendor-headed chains, claimed before the regions: ``partition``'s ``chains``).

    A model dynamo cannot trace gives no regions and the reason (``error``), never an exception:
    its operator cards do not depend on it.
    """
    from ..capture import split_batch

    rec = _GraphRecorder(examples_per_variant, max_tensor_bytes, vendor_chains)
    # NB: a library function an operator names is traced as its graph twin, so that its nodes can be told apart
    # (partition leaves them to the function's operator card)
    specs = function_specs()
    hooks = hook_functions(specs, model) if specs else None
    try:
        compiled = torch.compile(model, backend=rec.backend(), dynamic=False, fullgraph=False)
        with torch.no_grad(), no_recompile_limit(), graph_calls():
            for batch in batches:
                args, kwargs = split_batch(batch)
                compiled(*args, **kwargs)
    except Exception as exc:  # NB: dynamo's errors are many types; any of them means "no graph"
        return RegionCapture((), rec.graphs, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        rec.recording = False
        if hooks is not None:
            hooks.release()
    return RegionCapture(tuple(rec.records.values()), rec.graphs)


def chains_by_default(device: str) -> Callable[[Variant], bool] | bool:
    """Which vendor-headed chains a capture claims unless told: none yet, on either backend.

    A chain claims its tail's nodes, which were a region card of their own; a chain without a winner leaves them on
    eager at deploy. On the CPU no C loop beats MKL's GEMM or oneDNN's convolution (as the fused GEMM + GELU family
    is off there). On CUDA the CUTLASS designs (16-bit products only: a float32 one would run in TF32, which eager does not
    use) build in the judge but have not run on a GPU yet, and their default cluster (1x2) launches with a launch
    attribute the CUDA recorder refuses, so such a winner would stay on eager with replay on (docs/architecture.md,
    "Vendor-headed chains"): claiming them by default could cost a model its region kernels. ``has_cuda_design`` is
    the rule to turn on once the GPU benchmark shows them placed and faster (``vendor_chains=True`` claims all)."""
    return False


def covered_op_calls(variant: Variant) -> collections.Counter:
    """The operator-card keys one call of the region stands for (its operators run op by op; a vendor chain's as the
    model spells them, ``VendorChainSpec.replay``: the linear or convolution call, a batch norm's one call)."""
    from ..capture._capture import CaptureLimits
    from ..capture._capture import _CallRecorder

    spec = get_spec(variant.op)
    inputs = spec.random_inputs(variant, seed=0)
    rec = _CallRecorder(None, CaptureLimits(), [0], set())
    with torch.no_grad(), rec:
        getattr(spec, "replay", spec.reference)(inputs, variant.param_dict)   # a region's reference: its IR op by op
    return collections.Counter(rec.sequence)


def region_cards(model: Callable, batches: Sequence[Any], op_cards, *, device: str, store=None,
                 timing_budget_ms: float = 20.0, examples_per_variant: int = 2, inductor: bool = False,
                 max_tensor_bytes: int | None = None, vendor_chains: bool | None = False):
    """``op_cards`` plus one card per region variant of the model's graph (and per vendor-headed chain with
    ``vendor_chains``; None: on ``device`` a built-in design computes them, ``chains_by_default``), shares recomputed
    so that a region's card replaces the operator calls inside it (shares of one forward sum to at most 1)."""
    from ..capture import Card
    from ..capture._capture import time_variant

    found = capture_regions(model, batches, examples_per_variant=examples_per_variant, max_tensor_bytes=max_tensor_bytes,
                            vendor_chains=chains_by_default(device) if vendor_chains is None else vendor_chains)
    if store is not None:
        store.set_meta("regions", {"graphs": found.graphs, "graph_breaks": found.graph_breaks,
                                   "regions": len(found.records), "error": found.error})
    if found.error:
        warnings.warn(f"kforge: no region cards, the model's graph could not be captured ({found.error}); "
                      "its operator cards are complete", stacklevel=3)
    covered: collections.Counter = collections.Counter()
    new_cards = []
    for rec in found.records:
        variant = rec.variant
        key = variant.key
        if store is not None:
            for idx, ins in enumerate(rec.examples):
                outs = get_spec(variant.op).reference(ins, variant.param_dict)
                outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
                store.save_example(key, idx, [store.put_tensor(t) for t in ins], [store.put_tensor(o) for o in outs])
            store.trim_examples(key, len(rec.examples))
        timing = time_variant(variant, store, key, device, timing_budget_ms)
        inductor_us = None
        if inductor:
            from ._baseline import inductor_baseline_us

            try:
                inductor_us = inductor_baseline_us(variant, device)
            except Exception as exc:  # NB: an Inductor failure costs the column, not the capture
                warnings.warn(f"kforge: Inductor baseline of {variant.signature} failed: {exc}", stacklevel=2)
        new_cards.append(Card(variant, rec.calls, timing.median_us, 0.0, None, len(rec.examples), timing.spread,
                              inductor_us=inductor_us))
        # NB: a layout twin stands for the calls as traced (eager ran and captured them so)
        # NB: without a bias prologue: eager runs that bias inside its convolution, not as an add of its own
        for op_key, n in covered_op_calls(without_prologue(rec.traced or variant)).items():
            covered[op_key] += n * rec.calls
    op_list = list(op_cards)
    by_key = {c.key: c for c in op_list}
    uncovered = {c.key: max(c.calls - covered.get(c.key, 0), 0) for c in op_list}
    items = [replace(c, forward_us=c.forward_us * uncovered[c.key] / c.calls if c.calls else 0.0) for c in op_list]
    # NB: a region is timed alone; its time inside the forward is that, scaled by how the operator
    # calls it stands for compare inside the forward with alone (1 where none of them was captured).
    inside = sum(by_key[k].forward_us / by_key[k].calls * n for k, n in covered.items() if k in by_key)
    alone = sum(by_key[k].eager_us * n for k, n in covered.items() if k in by_key)
    scale = inside / alone if inside > 0 and alone > 0 else 1.0
    items += [replace(c, forward_us=c.total_us * scale) for c in new_cards]
    total = max(op_cards.model_us or 0.0, sum(c.forward_us for c in items)) or 1.0
    items = sorted((c.with_share(c.forward_us / total) for c in items), key=lambda c: (-c.share, -c.total_us))
    return replace(op_cards, items=tuple(items))
