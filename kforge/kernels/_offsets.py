"""C expressions for element offsets: shared by the generated kernels of the built-in strategies and of regions."""
from __future__ import annotations

import math
from typing import Sequence


def lin(var: str, sizes: Sequence[int], strides: Sequence[int]) -> str:
    """A C expression for the element offset of linear (row-major) index ``var`` over ``sizes`` in a tensor with
    ``strides`` (a broadcast dimension: stride 0). A dense layout gives ``var`` times one factor."""
    dims = [(s, st) for s, st in zip(sizes, strides) if s > 1]
    if not dims or all(st == 0 for _, st in dims):
        return "0L"
    dense = [math.prod(sizes[d + 1:]) for d in range(len(sizes))]
    base = None
    for d, (s, st) in enumerate(zip(sizes, strides)):
        if s > 1:
            ratio = st / dense[d] if dense[d] else 0
            base = ratio if base is None else base
            if st != base * dense[d] or base != int(base):
                base = None
                break
    if base is not None and base > 0:
        return f"({var})" if base == 1 else f"(({var}) * {int(base)}L)"
    terms = []
    for d, (s, st) in enumerate(zip(sizes, strides)):
        if s == 1 or st == 0:
            continue
        coord = f"({var})" if dense[d] == 1 else f"(({var}) / {dense[d]}L)"
        if d > 0 and any(x > 1 for x in sizes[:d]):
            coord = f"({coord} % {s}L)"
        terms.append(f"{coord} * {st}L")
    return "(" + " + ".join(terms) + ")"
