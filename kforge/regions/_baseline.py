"""The second baseline of a region: Inductor's kernel for the same region, compiled alone."""
from __future__ import annotations

import torch

from ..ops import Variant, get_spec
from ..deploy._graph import no_recompile_limit as _no_recompile_limit
from ._spec import region_ir


def inductor_baseline_us(variant: Variant, device: str | None = None, *, budget_ms: float = 100.0) -> float:
    """Median time of one call of Inductor's code for the region (torch.compile of the region's
    reference, default mode, static shapes), timed by ``kforge.timing.bench``.

    On CUDA the compiled call is captured once in a CUDA graph and the graph is replayed, so the
    host cost of the compiled wrapper (guards, ~30 us) does not count: Inductor at its best. On the
    CPU Inductor needs a C++ compiler.
    """
    from ..timing import bench

    device = device or variant.device
    variant = variant.on(device)
    spec = get_spec(variant.op)
    inputs = spec.random_inputs(variant, seed=0)

    # NB: compiled from the printed reference, a fresh code object per call, so that dynamo's
    # cache (keyed by code object) holds no earlier region's guards and nothing else is reset.
    # A fused operator (find_fused) is compiled from its spec's reference.
    scope: dict = {}
    if variant.op == "region":
        exec(compile(region_ir(variant).source(list(variant.inputs)), f"<kforge region {variant.key}>", "exec"), scope)
        region = scope["region"]
    else:
        params = variant.param_dict
        exec(compile("def region(*xs):\n    return reference(list(xs), params)\n", f"<kforge {variant.key}>", "exec"),
             {"reference": spec.reference, "params": params}, scope)
        region = scope["region"]
    compiled = torch.compile(region, backend="inductor", dynamic=False, fullgraph=True)
    try:
        with torch.no_grad(), _no_recompile_limit():
            for _ in range(3):
                compiled(*inputs)
            if device.startswith("cuda"):
                stream = torch.cuda.Stream(device)
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    compiled(*inputs)
                torch.cuda.current_stream(device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    compiled(*inputs)
                fn = graph.replay
            else:
                fn = lambda: compiled(*inputs)  # noqa: E731, F821 - called before the finally deletes it
            return bench(fn, device=device, budget_ms=budget_ms, min_reps=10 if device == "cpu" else 50).median_us
    finally:
        del compiled
