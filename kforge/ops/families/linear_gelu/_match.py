"""linear_gelu in an ATen graph: an ``addmm`` (with the views ``F.linear`` puts around it for a 3-d input) whose
output only the tanh GELU reads."""
from __future__ import annotations

import torch
import torch.fx as fx

from ..._aten import bind_node, is_call, tensor_nodes, val
from ..._family import FusedMatch
from ..._registry import Unsupported, get_spec

aten = torch.ops.aten

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)

# NB: on the CPU no built-in design beats MKL's GEMM with Inductor's GELU fused after it (the C loop ran 25x slower
# than eager on a 2-layer SD3.5 transformer's feed-forward, float32, on the 2-core development machine), so a CPU graph gives no linear_gelu card unless this is set
# (kforge's own tests, which check the finder and the placement on the CPU)
LINEAR_GELU_ON_CPU = False


def match(graph: fx.Graph) -> list[FusedMatch]:
    """Each ``gelu(addmm(bias, x, t(weight)), approximate="tanh")`` (a view of the product between them where
    ``x`` had leading dimensions: ``F.linear`` on a 3-d input) whose intermediates nothing else reads, as one
    ``linear_gelu(x, weight, bias)`` call: its nodes are the product, the view and the GELU (the input's view and
    the weight's transpose stay, for anything else that reads them, or go as dead code)."""
    spec = get_spec("linear_gelu")
    found = []
    for node in graph.nodes:
        if not is_call(node, aten.gelu.default):
            continue
        if node.kwargs.get("approximate", "none") != "tanh":   # NB: keyword-only in aten.gelu
            continue
        src, out_view = node.args[0], None
        if is_call(src, *_VIEWS):
            if len(src.users) != 1:
                continue
            out_view, src = src, src.args[0]
        if not is_call(src, aten.addmm.default) or len(src.users) != 1:
            continue
        a = bind_node(src)
        if a["beta"] != 1 or a["alpha"] != 1:
            continue
        bias, mat1, mat2 = a["self"], a["mat1"], a["mat2"]
        if not (is_call(mat2, aten.t.default) or (is_call(mat2, aten.permute.default) and list(mat2.args[1]) == [1, 0])):
            continue
        weight, x = mat2.args[0], mat1
        if out_view is not None:
            if not is_call(mat1, *_VIEWS):
                continue
            x = mat1.args[0]
        if not tensor_nodes(x, weight, bias):
            continue
        xv, wv, bv, yv = val(x), val(weight), val(bias), val(node)
        if xv.device.type == "cpu" and not LINEAR_GELU_ON_CPU:
            continue
        if wv.dim() != 2 or bv.dim() != 1 or bv.shape[0] != wv.shape[0] or xv.shape[-1] != wv.shape[1] \
                or not isinstance(yv, torch.Tensor) \
                or tuple(yv.shape) != tuple(xv.shape[:-1]) + (wv.shape[0],):
            continue
        try:
            variant = spec.variant(spec.bind(xv, wv, bv), [yv])
        except (Unsupported, TypeError, ValueError):
            continue
        nodes = (src,) + ((out_view,) if out_view is not None else ()) + (node,)
        found.append(FusedMatch(variant, nodes, (x, weight, bias), (node,)))
    return found
