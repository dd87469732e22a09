"""The built-in strategies of vendor-headed chains: the C/OpenMP kernel (``_vendor_cpu.render_cpu``) and, on CUDA, one
strategy per CUTLASS design (``_vendor_cuda.design``), its configurations (``config_space``) as the search's knobs."""
from __future__ import annotations

from typing import Any

from ..kernels import DeviceInfo
from ..ops import Unsupported, Variant
from ._vendor_spec import VENDOR_CHAIN, vendor_chain

Config = dict[str, Any]
CUDA_DESIGNS = {
    "evt": "one TMA warp-specialised CUTLASS GEMM whose epilogue visitor tree computes the whole tail (bias, per-row "
           "and per-column vectors, a residual through the epilogue's source or auxiliary loads): the product is never "
           "written",
    "gemm_then_rows": "a TMA warp-specialised CUTLASS GEMM writing its float product to the workspace, then one kernel "
                      "for the tail (a block per row where it holds a reduction)",
    "conv": "CUTLASS's implicit-GEMM convolution (NHWC activations, KRSC filters, packed first) into a float "
            "workspace, then one kernel for the bias and the tail in the model's layout",
}


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("x"))


def _label(dims) -> str:
    return "x".join(str(int(d)) for d in dims)


def _cutlass(config: Config):
    from ..proposers.builtin._vendor_cuda import CutlassConfig

    return CutlassConfig(_dims(config["tile"]), _dims(config["cluster"]), 0, int(config["swizzle"]), "heuristic",
                         config["schedule"])


def _knobs(c) -> Config:
    return {"tile": _label(c.tile), "cluster": _label(c.cluster), "schedule": c.schedule, "swizzle": c.swizzle}


def _design(variant: Variant) -> str | None:
    from ..proposers.builtin._vendor_cuda import design

    try:
        return design(vendor_chain(variant))
    except (Unsupported, ValueError, KeyError):
        return None


def has_cuda_design(variant: Variant) -> bool:
    """Whether a built-in CUDA strategy computes the chain ``variant`` (one of ``CUDA_DESIGNS`` fits it)."""
    return _design(variant) is not None


def _cuda_default(variant: Variant, device: DeviceInfo) -> Config:
    from ..proposers.builtin._vendor_cuda import default_config

    return _knobs(default_config(vendor_chain(variant)))


def _cuda_valid(variant: Variant, config: Config, device: DeviceInfo) -> bool:
    from ..proposers.builtin._vendor_cuda import config_space

    try:
        return _cutlass(config) in set(config_space(vendor_chain(variant)))
    except (KeyError, ValueError):
        return False


def _render_cuda(variant: Variant, config: Config, device: DeviceInfo) -> str:
    from ..proposers.builtin._vendor_cuda import render_cuda

    return render_cuda(vendor_chain(variant), _cutlass(config))


def _render_cpu(variant: Variant, config: Config, device: DeviceInfo) -> str:
    from ..proposers.builtin._vendor_cpu import render_cpu

    return render_cpu(vendor_chain(variant))


def _cpu_applies(variant: Variant, device: DeviceInfo) -> bool:
    from ..proposers.builtin._vendor_tail import ROUND

    return variant.op == VENDOR_CHAIN and vendor_chain(variant).head.dtype in ROUND


def _cuda_space() -> dict[str, tuple]:
    # NB: every value config_space gives some chain; valid_fn keeps the chain's own
    return {"tile": ("64x128x64", "128x64x64", "128x128x64", "64x256x64", "128x256x64", "256x128x64"),
            "cluster": ("1x1", "1x2", "2x1"), "schedule": ("pingpong", "cooperative"), "swizzle": (1, 2, 4, 8)}


def register_strategies() -> None:
    from ..proposers.builtin._strategy import Strategy, get_strategy, register

    try:
        get_strategy(f"{VENDOR_CHAIN}.cpu.loops")
        return
    except KeyError:
        pass
    register(Strategy(
        f"{VENDOR_CHAIN}.cpu.loops", VENDOR_CHAIN, "cpu", 0,
        "the product by plain OpenMP loops (summed in double, rounded to the head's dtype as eager rounds it) into a "
        "float workspace, then the tail in one pass (a row per iteration where it holds a reduction): correct, not "
        "fast (MKL's GEMM is far ahead)", {}, _cpu_applies, lambda v, d: {}, _render_cpu))
    for name, doc in CUDA_DESIGNS.items():
        register(Strategy(
            f"{VENDOR_CHAIN}.cuda.{name}", VENDOR_CHAIN, "cuda", 2, doc, _cuda_space(),
            (lambda which: lambda v, d: _design(v) == which)(name), _cuda_default, _render_cuda,
            valid_fn=_cuda_valid,
            explain_fn=lambda v, c, doc=doc: f"{doc} [tile {c.get('tile')}, cluster {c.get('cluster')}, "
                                             f"{c.get('schedule')}, swizzle {c.get('swizzle')}]"))


__all__ = ["CUDA_DESIGNS", "has_cuda_design", "register_strategies"]
