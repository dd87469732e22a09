"""Regions in the model's graph: a region winner replaces its subgraph with one ``kforge::run`` call.

The eager dispatcher cannot run a region kernel: it sees one torch call at a time, and a region is
several. Regions deploy in the model's graph instead: ``replace_regions`` rewrites an ATen FX graph
(the finder runs on it, and every region whose variant has a kernel becomes a call of the
``kforge::run`` custom op, the same op the dispatcher puts into compiled graphs). ``region_pass``
is registered with graph mode (``deploy.register_aten_pass``), so ``Session.compile``,
``Deployment.compile`` and ``kforge.load(...).compile`` run region winners, and so does an eager
deployment (``Session.apply``, ``kforge.load``), whose model's forward is that graph run op by op
(``deploy._graph.GraphForward``); ``regions_backend`` is the same pass as a torch.compile backend of
its own.
"""
from __future__ import annotations

import operator
from dataclasses import replace
from typing import Any, Callable, Collection, Iterable, Mapping

import torch
import torch.fx as fx

from ..deploy._graph import inductor_lowers, keeps_traced_layout
from ..ops import Unsupported, Variant, has_layout_twin, placed_in_aten_graph
from ._finder import FoundRegion, find_fused, find_layout_twin_calls, find_regions
from ._layout import channels_last_twin, inductor_lays_out_channels_last
from ._vendor_spec import VENDOR_CHAIN


def partition(gm: fx.GraphModule, *, plain_lone: bool = False,
              chains: bool | Collection[str] | Callable[[Variant], bool] = False) -> list[FoundRegion]:
    """The graph's regions and fused operators, split exactly as graph capture splits it (a fused
    operator's nodes join no region; where Inductor will lay the graph out channels-last, a fused
    operator's or a pointwise region's variant is its channels-last twin, and each call of an operator with a
    layout twin that no fused operator takes (``find_layout_twin_calls``) is one call, as its twin), so that what
    deploy finds has the keys capture gave.

    ``plain_lone`` (deploy): such a lone call without a twin (a graph laid out as traced, or one reading
    the graph's own input) is a call too, in its traced layout: where the dynamo graph's plain operator
    kernel stepped aside for a twin (``deploy._graph.replace_calls``), it is placed here instead. Capture
    leaves those out: the eager operator card already stands for them.

    ``chains``: the vendor-headed chains (``find_vendor_chains``) claimed before any region is found, so that a
    chain's head and tail join no region: all of them (True: capture with vendor chains on), none (False), those
    whose variant key is in the collection (deploy: the chains that have a kernel; the nodes of the others are left to
    the regions, as a capture with chains off split them), or those a predicate of the variant takes (capture's
    default on CUDA: the chains a built-in design computes)."""
    # NB: the nodes of a library function's call (traced through its graph twin: kforge.ops._functions) are its
    # operator card's; a region or fused operator inside it would count that time twice
    inside = frozenset(n for n in gm.graph.nodes if _in_function(n))
    fused = [f for f in find_fused(gm.graph) if not inside.intersection(f.nodes)]
    skip = frozenset(n for f in fused for n in f.nodes) | inside
    claimed = _chains(gm, skip, chains) if chains else []
    skip = skip | frozenset(n for c in claimed for n in c.nodes)
    found = find_regions(gm.graph, skip=skip) + fused
    lone = [f for f in find_layout_twin_calls(gm.graph) if not inside.intersection(f.nodes)]
    # NB: an eager deployment's graph runs op by op in the layouts it was traced with: a twin would be handed
    # contiguous buffers and copy them (``deploy._graph.keeps_traced_layout``)
    channels_last = bool(found or lone) and not keeps_traced_layout() and inductor_lays_out_channels_last(gm)

    def twin_of(f: FoundRegion) -> FoundRegion | None:
        twin = channels_last_twin(f.variant, [n.op == "placeholder" for n in f.inputs]) if channels_last else None
        return replace(f, variant=twin, traced=f.variant) if twin is not None else None

    # NB: a bias prologue only as a channels-last twin (the layout its kernel is written for, and where Inductor
    # peels the bias off); elsewhere the convolution keeps its bias and the fused operator is the plain one
    found = [twin_of(f) or f.without_prologue() for f in found]
    for f in lone:
        twin = twin_of(f)
        if twin is not None or plain_lone:
            found.append(twin or f)
    return found + claimed


def _chains(gm: fx.GraphModule, skip: frozenset,
            chains: bool | Collection[str] | Callable[[Variant], bool]) -> list[FoundRegion]:
    """The vendor-headed chains of ``gm`` outside ``skip`` that ``chains`` asks for, as the finder lists regions."""
    from ._vendor import find_vendor_chains
    from ._vendor_spec import chain_variant

    out = []
    for fc in find_vendor_chains(gm.graph, skip=skip):
        try:
            variant = chain_variant(fc.chain)
        except Unsupported:
            continue
        if chains is True or (chains(variant) if callable(chains) else variant.key in chains):
            out.append(FoundRegion(variant, fc.nodes, fc.inputs, fc.outputs))
    return out


def _in_function(node: fx.Node) -> bool:
    """Whether AOTAutograd traced ``node`` from a call of a library function's graph twin (dynamo's node, which
    AOTAutograd's ATen nodes keep in ``source_fn_stack``)."""
    for entry in node.meta.get("source_fn_stack") or ():
        target = entry[1] if isinstance(entry, tuple) and len(entry) > 1 else None
        if getattr(target, "kforge_function", None):
            return True
    return False


def _call_site(graph: fx.Graph, region: FoundRegion) -> fx.Node | None:
    """The node the kernel's call goes before: the region's first node that comes after every input it reads (a
    fused operator's inputs may be made after its first node: a rotary embedding's cos and sin, unsqueezed just
    before the products that read them) and no later than its first output; None where there is none (then the region
    stays as it is)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    after = max((order[n] for n in region.inputs if n in order), default=-1)
    first_out = min(order[n] for n in region.outputs)
    site = min((n for n in region.nodes if order[n] > after), key=order.__getitem__, default=None)
    return site if site is not None and order[site] <= first_out else None


def replace_regions(gm: fx.GraphModule, kernels: Mapping[str, str], missed: list | None = None) -> list[str]:
    """Replace each region or fused operator of ``gm`` whose variant key is in ``kernels`` (key -> the
    kernel's ``DeployedKernel.run_name``) with a ``torch.ops.kforge.run`` call (``run_flexible`` for a
    channels-last twin); returns the keys replaced. ``missed`` (when given) gets each one of a kernel's
    operator ("region", a fused operator) that stayed, its variant: what an unplaced kernel is
    compared with (``deploy._graph.nearest_miss``).

    ``gm`` must be an ATen graph with "val" metadata (AOTAutograd's forward graph, or Inductor's
    graph before its decompositions), split as capture split it (``partition``), so that its regions
    have the signatures capture saw. A fused operator is placed here too, not in dynamo's graph:
    capture found it in this graph, with this graph's layouts, which are the layouts Inductor gives a
    custom operator's inputs (exact strides), unless Inductor lays the graph out channels-last, for
    which the twin and ``run_flexible`` stand; dynamo's own example values can differ (on the H200 two
    of the SD3.5 VAE's group_norm inputs were channels-last there and contiguous here).
    """
    import kforge.deploy._dispatch  # noqa: F401  (defines torch.ops.kforge.run)

    graph = gm.graph
    done: list[str] = []
    moved: dict[fx.Node, fx.Node] = {}  # an output of a region replaced earlier -> its getitem
    # NB: the graph's outputs as traced: a twin's layout must not reach the model's caller (Inductor,
    # tracing the rewritten graph again, would take the outputs' strides from it)
    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    returned = [(i, v) for i, v in enumerate(out_node.args[0] if isinstance(out_node.args[0], (list, tuple))
                                              else [out_node.args[0]]) if isinstance(v, fx.Node)]
    traced_out = {i: v.meta.get("val") for i, v in returned}
    flexible_any = False
    # NB: a chain only where it has a kernel: else its nodes stay the regions' they were with chains off
    for region in partition(gm, plain_lone=True, chains=frozenset(kernels)):
        name = kernels.get(region.variant.key)
        if name is None and region.peeled is not None:
            # NB: a kernel for the call without its bias prologue (a store searched before the prologue existed):
            # placed as it was then, the convolution keeping its bias
            plain = region.without_prologue()
            name = kernels.get(plain.variant.key)
            region = plain if name is not None else region
        if name is None:
            if missed is not None:
                missed.append(region.variant)
            continue
        # NB: a channels-last twin is called through the flexible op, so Inductor hands it its buffers as
        # they are, not copies in the traced layout
        flexible = region.traced is not None
        flexible_any = flexible_any or flexible
        op = torch.ops.kforge.run_flexible.default if flexible else torch.ops.kforge.run.default
        if region.peeled is not None:   # the kernel adds the convolution's bias: the convolution runs without it
            drop_conv_bias(region.peeled)
        site = _call_site(graph, region)
        if site is None:
            if missed is not None:
                missed.append(region.variant)
            continue
        with graph.inserting_before(site):
            args = [moved.get(n, n) for n in region.inputs]
            if flexible and inductor_lowers():
                args = [_in_layout(graph, a, sig) for a, sig in zip(args, region.variant.inputs)]
            call = graph.call_function(op, (name, args))
        for i, out in enumerate(region.outputs):
            with graph.inserting_after(call):
                item = graph.call_function(operator.getitem, (call, i))
            if "val" in out.meta:
                val = out.meta["val"]
                sig = region.variant.outputs[i] if i < len(region.variant.outputs) else None
                if flexible and isinstance(val, torch.Tensor) and sig is not None:
                    val = val.new_empty_strided(sig.shape, sig.stride)   # the kernel's layout, as its fake has it
                item.meta["val"] = val
            out.replace_all_uses_with(item)
            moved[out] = item
        for node in reversed(region.nodes):
            graph.erase_node(node)
        done.append(region.variant.key)
    if flexible_any:
        _keep_output_layouts(graph, out_node, traced_out)
    if done:
        graph.eliminate_dead_code()
        _stable_sort(graph)  # NB: the call went in before the region's first node; inputs may follow it
        graph.lint()
        gm.recompile()
    return done


def _in_layout(graph: fx.Graph, node: Any, sig: Any) -> Any:
    """``node`` as a twin's kernel takes it: a 4-d tensor through Inductor's ``inductor_force_stride_order`` with
    the kernel's strides, which costs nothing where Inductor lays the buffer out so anyway and otherwise makes the
    kernel that writes it write it so (a copy only where that kernel's layout is fixed). Only where Inductor
    compiles the graph: run as it is (aot_eager), that prim copies every input, whatever its layout.

    NB: on the H200 two of the SD3.5 VAE's twins (the group_norms after an upsampler, whose input a 1x1
    convolution reads too) got their input in another layout, and their calls paid a 512 MB copy each (5.1 ms
    a forward, 2026-12-03m)."""
    import torch._inductor.inductor_prims  # (defines prims.inductor_force_stride_order)

    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if sig is None or not isinstance(val, torch.Tensor) or val.dim() != 4 or tuple(val.shape) != tuple(sig.shape) \
            or not _dense(sig.shape, sig.stride):
        return node
    forced = graph.call_function(torch.ops.prims.inductor_force_stride_order.default, (node, list(sig.stride)))
    forced.meta["val"] = val.new_empty_strided(tuple(sig.shape), tuple(sig.stride))
    return forced


def _dense(shape, stride) -> bool:
    """Whether a tensor of ``shape`` laid out with ``stride`` covers its memory exactly once."""
    expect = 1
    for size, st in sorted((d for d in zip(shape, stride) if d[0] != 1), key=lambda d: d[1]):
        if st != expect:
            return False
        expect *= size
    return True


def drop_conv_bias(conv: fx.Node) -> None:
    """Make the ATen graph's convolution node ``conv`` run without its bias."""
    if "bias" in conv.kwargs:
        conv.update_kwarg("bias", None)
    else:
        conv.update_arg(2, None)


def _keep_output_layouts(graph: fx.Graph, out_node: fx.Node, traced: dict[int, Any]) -> None:
    """Give every 4-d tensor the graph returns the layout it was traced with (contiguous or
    channels-last), as a copy where it differs: what the model returns keeps eager's layout whatever
    layout a twin's kernel made upstream (plain Inductor pays the same copy for a channels-last graph)."""
    args = out_node.args[0]
    many = isinstance(args, (list, tuple))
    values = list(args) if many else [args]
    changed = False
    for i, want in traced.items():
        v = values[i]
        if not isinstance(v, fx.Node) or not isinstance(want, torch.Tensor) or want.dim() != 4:
            continue
        fmt = (torch.contiguous_format if want.is_contiguous()
               else torch.channels_last if want.is_contiguous(memory_format=torch.channels_last) else None)
        if fmt is None:
            continue
        with graph.inserting_before(out_node):
            copy = graph.call_function(torch.ops.aten.clone.default, (v,), {"memory_format": fmt})
        copy.meta["val"] = want
        values[i] = copy
        changed = True
    if changed:
        out_node.args = (type(args)(values) if many else values[0],) + tuple(out_node.args[1:])


def _stable_sort(graph: fx.Graph) -> None:
    """Reorder ``graph`` in place so that every node follows its inputs, moving as little as possible."""
    import heapq

    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    waiting = {n: len({a for a in n.all_input_nodes}) for n in nodes}
    ready = [index[n] for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        n = nodes[heapq.heappop(ready)]
        order.append(n)
        for u in n.users:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, index[u])
    if len(order) != len(nodes):
        raise RuntimeError("replacing a region made a cycle in the graph")
    for prev, n in zip(order, order[1:]):
        prev.append(n)


def regions_backend(kernels: Iterable[Any], inner: str = "eager"):
    """A torch.compile backend that runs the region (and vendor chain) winners among ``kernels`` (``DeployedKernel``s)
    and nothing else of kforge's: graph mode's backend with those kernels. ``inner``: "eager" runs
    the rest of the graph op by op, "inductor" hands the rewritten graph to Inductor (default options)."""
    from ..deploy._graph import KforgeBackend

    return KforgeBackend([dk for dk in kernels if dk.variant.op in ("region", VENDOR_CHAIN)], inner=inner)


def region_pass(kernels: Iterable[Any]):
    """The ATen pass that puts the region and fused-operator winners among ``kernels`` into a graph
    (None without any); after each run its ``missed`` lists what stayed (``replace_regions``).
    A kernel it puts in is registered for ``kforge::run`` (else the call runs the region's reference)."""
    from ..deploy._runop import RUN_TABLE

    # NB: every kernel of an operator with a layout twin: a plain one that stepped aside in dynamo's graph for a twin
    # that the ATen graph then has no place for (partition's plain_lone) takes its call here
    regions = {dk.variant.key: dk for dk in kernels if placed_in_aten_graph(dk.variant) or has_layout_twin(dk.variant.op)}
    if not regions:
        return None
    table = {key: dk.run_name for key, dk in regions.items()}

    def apply(gm: fx.GraphModule) -> list[str]:
        apply.missed = []
        done = replace_regions(gm, table, apply.missed)
        for key in done:
            RUN_TABLE.register(regions[key])
        return [regions[key].variant.signature for key in done]

    apply.missed = []
    return apply
