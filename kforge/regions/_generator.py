"""The region generator as built-in strategies: its launch choices are the search's knobs."""
from __future__ import annotations

import functools
from typing import Any

from ..kernels import DeviceInfo
from ..ops import Unsupported, Variant
from ._codegen import math_knobs
from ._cpu import render_cpu
from ._cuda import max_vec, render_cuda
from ._plan import RegionPlan, plan_region
from ._spec import region_ir

Config = dict[str, Any]


@functools.lru_cache(maxsize=256)
def _plan_cached(variant: Variant) -> RegionPlan | None:
    try:
        return plan_region(region_ir(variant), [s for s in variant.inputs], list(variant.outputs))
    except Unsupported:
        return None


def plan_variant(variant: Variant) -> RegionPlan:
    """The kernel plan of a region variant (``plan_region`` of its IR and signatures, cached); Unsupported says why
    there is none."""
    plan = _plan_cached(variant)
    if plan is None:
        plan_region(region_ir(variant), list(variant.inputs), list(variant.outputs))  # raises with the reason
    return plan  # type: ignore[return-value]


def _is(variant: Variant, reduction: bool) -> bool:
    if variant.op != "region":
        return False
    plan = _plan_cached(variant)
    return plan is not None and (plan.red is not None) == reduction


def _math_default(plan: RegionPlan) -> Config:
    # NB: on CUDA a 16-bit chain starts with Inductor's numerics (float32 through the chain, hardware
    # approximations): per element, eager's rounding of every node and the accurate tanhf/expf cost
    # more instructions than the bytes take to move. The judge still holds it to the dtype's tolerance.
    fast, rounds = math_knobs(plan)
    return {"fast": int(fast), "round": 0 if rounds else 1}


def default_config(variant: Variant, device: DeviceInfo) -> Config:
    plan = plan_variant(variant)
    if device.backend == "cpu":
        return ({"chunk": 1024, "simd": 1, "round": 1} if plan.red is None
                else {"cache": 1 if plan.cols <= 16384 else 0, "rows_per_task": 1, "round": 1})
    vec = max_vec(plan)
    if plan.red is None:
        return {"threads": 256, "vec": vec, "waves": 0, **_math_default(plan)}
    cols = plan.cols
    # NB: rows per thread group sized so that a row is one pass of vec-wide loads where it can be.
    tpr = 32
    while tpr < 1024 and tpr * vec * 4 < cols:
        tpr *= 2
    threads = max(tpr, 128) if tpr <= 32 else tpr
    split = 1
    rows_per_wave = device.sm_count * max(1, 2048 // threads) * (threads // tpr)
    while split < 32 and plan.rows * split < rows_per_wave // 2 and cols // (split * 2) >= tpr * vec * 4:
        split *= 2
    items = -(-cols // (split * tpr * vec))
    return {"threads": threads, "tpr": tpr, "vec": vec, "split": split,
            "cache": 1 if split == 1 and items * vec <= 32 else 0, **_math_default(plan)}


def valid_config(variant: Variant, c: Config, device: DeviceInfo) -> bool:
    plan = _plan_cached(variant)
    if plan is None:
        return False
    fast, rounds = math_knobs(plan)
    if int(c.get("fast", 0)) and (device.backend == "cpu" or not fast):
        return False
    if not int(c.get("round", 1)) and not rounds:
        return False  # the same kernel as round=1
    if device.backend == "cpu":
        return not (plan.red is not None and c.get("cache") and plan.cols > 16384)
    vec = int(c.get("vec", 1))
    if vec > max_vec(plan) or max_vec(plan) % vec:
        return False
    if plan.red is None:
        return True
    threads, tpr, split = int(c["threads"]), int(c["tpr"]), int(c["split"])
    if tpr > threads or threads % tpr or (tpr > 32 and tpr != threads):
        return False
    if split > 1 and (threads != tpr or plan.cols // split < tpr * vec):
        return False
    items = -(-plan.cols // (split * tpr * vec))
    return not (c.get("cache") and (split > 1 or items * vec > 64))


def generate(variant: Variant, backend: str, config: Config | None = None, device: DeviceInfo | None = None) -> str:
    """One fused kernel source for a region variant (the kernel contract), default choices unless given."""
    from ..kernels import device_info

    device = device or (device_info(variant.device) if backend == variant.device.split(":")[0] or backend == "cpu"
                        else DeviceInfo("cuda", "H200", "sm_90", 132, 4250.0))
    plan = plan_variant(variant)
    c = {**default_config(variant, device), **(config or {})}
    if backend == "cpu":
        return render_cpu(plan, c)
    return render_cuda(plan, c, device.sm_count or 132)


def register_strategies() -> None:
    from ..proposers.builtin._strategy import Strategy, get_strategy, register

    try:
        get_strategy("region.cpu.fused")
        return
    except KeyError:
        pass
    render = lambda backend: (lambda v, c, d: generate(v, backend, c, d))  # noqa: E731
    register(Strategy(
        "region.cpu.fused", "region", "cpu", 1,
        "the whole pointwise chain in one OpenMP SIMD pass, broadcasting by index, values rounded per node "
        "as eager rounds them (round=1) or only at casts and outputs (round=0)",
        {"chunk": (256, 1024, 4096), "simd": (0, 1), "round": (1, 0)}, lambda v, d: _is(v, False), default_config,
        render("cpu"), valid_fn=valid_config))
    register(Strategy(
        "region.cpu.rows", "region", "cpu", 1,
        "one row per OpenMP iteration: prologue and statistics in one pass, epilogue in a second, the "
        "reduction's operand kept in a row buffer when it fits",
        {"cache": (0, 1), "rows_per_task": (1, 4, 16), "round": (1, 0)}, lambda v, d: _is(v, True), default_config,
        render("cpu"), valid_fn=valid_config))
    register(Strategy(
        "region.cuda.fused", "region", "cuda", 1,
        "the whole pointwise chain in one grid-stride pass, 16-byte vectors for operands contiguous "
        "along the last dim, one load per vector for operands broadcast along it; 16-bit chains in float32 "
        "with hardware tanh/exp (fast=1, round=0) or with eager's per-node rounding and libm (fast=0, round=1)",
        {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8), "waves": (0, 4, 16), "fast": (0, 1), "round": (1, 0)},
        lambda v, d: _is(v, False), default_config, render("cuda"), valid_fn=valid_config))
    register(Strategy(
        "region.cuda.rows", "region", "cuda", 1,
        "tpr threads per row (several rows per block for short rows), prologue and statistics in one "
        "pass, the row held in registers for the epilogue when it fits, or split over several blocks "
        "with partial statistics (Welford / online max-sum) merged through the workspace",
        {"threads": (64, 128, 256, 512, 1024), "tpr": (4, 8, 16, 32, 64, 128, 256, 512, 1024),
         "vec": (1, 2, 4, 8), "split": (1, 2, 4, 8, 16, 32), "cache": (0, 1), "fast": (0, 1), "round": (1, 0)},
        lambda v, d: _is(v, True), default_config, render("cuda"), valid_fn=valid_config))
