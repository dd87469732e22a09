"""linear_gelu: a linear layer whose only reader is the tanh GELU (the SD3.5 transformer's feed-forward: GELU(
approximate="tanh") after its projection), as one operator.

Under torch.compile without max-autotune the GEMM is cuBLAS's, with the bias in its epilogue, and Inductor runs the
GELU as a pointwise kernel of its own: one more write and read of the GEMM's output (871 us of the SD3.5
transformer's 26.6 ms under reduce-overhead on the H200, profile of 2026-12-04i). A kernel doing both writes the
output once (cuBLASLt's GELU_BIAS epilogue, which PyTorch's own cuBLASLt path takes for this tanh form;
tests/test_linear_gelu.py checks it on a GPU in float32). A CPU graph gives no such card (``_pattern.LINEAR_GELU_ON_CPU``).
"""
from __future__ import annotations

import torch.nn.functional as F

from ..._family import Epilogue, Family, register_family
from ..._registry import Call, OpSpec
from ._pattern import PATTERN


def _bind(input, weight, bias=None):
    return Call((input, weight, bias), {})


def _reference(x: list, p: dict):
    return F.gelu(F.linear(x[0], x[1], x[2]), approximate="tanh")


# NB: no ``reads``: in dynamo's graph a plain linear kernel keeps its call even where the GELU alone reads it
LINEAR_GELU = register_family(Family(
    OpSpec(name="linear_gelu", kind="vendor", vendor="cublas", targets=(),
           inputs=("input", "weight", "bias"), params=(), bind=_bind, reference=_reference,
           doc="gelu(x @ weight.T + bias, approximate='tanh'): a linear layer whose only reader is the tanh GELU "
               "(found in the model's graph: no eager spelling)"),
    doc="gelu(x @ weight.T + bias, approximate='tanh'), the GELU the product's only reader",
    graph="aten", epilogue=Epilogue("linear", "gelu"), pattern=PATTERN,
    strategies=(f"{__name__}.strategies",)))
