"""linear_gelu in a graph: a linear layer whose only reader is the tanh GELU, traced (``kforge.ops._pattern``): on a
2-d input ``addmm``, on a contiguous 3-d one the views ``F.linear`` puts around it (the specialised trace follows the
input's rank and layout)."""
from __future__ import annotations

import torch.nn.functional as F

from ..._pattern import Pattern, meta

# NB: on the CPU no built-in design beats MKL's GEMM with Inductor's GELU fused after it (the C loop ran 25x slower
# than eager on a 2-layer SD3.5 transformer's feed-forward, float32, on the 2-core development machine), so a CPU
# graph gives no linear_gelu card unless this is set (kforge's own tests, which check the finder and the placement
# on the CPU)
LINEAR_GELU_ON_CPU = False


def linear_gelu(input, weight, bias):
    return F.gelu(F.linear(input, weight, bias), approximate="tanh")


def _placed(values, out) -> bool:
    """Not on the CPU (``LINEAR_GELU_ON_CPU``), and a bias per output feature (addmm would broadcast others)."""
    x, w, b = values["input"], values["weight"], values["bias"]
    if x.device.type == "cpu" and not LINEAR_GELU_ON_CPU:
        return False
    return w.dim() == 2 and tuple(b.shape) == (w.shape[0],)


PATTERN = Pattern((linear_gelu,), ({"input": meta(3, 8), "weight": meta(5, 8), "bias": meta(5)},
                                   {"input": meta(2, 3, 8), "weight": meta(5, 8), "bias": meta(5)}), check=_placed)
