"""Regions: chains of pointwise operators (plus at most one reduction) found in the model's graph,
each searched as one fused kernel; and vendor-headed chains (a matrix product or a convolution with the chain
after it), each searched as one kernel too."""
from __future__ import annotations

from ._ir import OPS, Node, Ref, RegionIR
from ._plan import RegionPlan, plan_region
from ._spec import REGION_SPEC, RegionSpec, region_ir, region_variant
from ._generator import generate, plan_variant, register_strategies

register_strategies()  # the region.* strategies join the built-in library

__all__ = ["OPS", "Node", "Ref", "RegionIR", "RegionPlan", "plan_region", "REGION_SPEC", "RegionSpec",
           "region_ir", "region_variant", "generate", "plan_variant"]

from ._capture import RegionCapture, capture_regions, covered_op_calls, region_cards  # noqa: E402
from ._finder import FoundRegion, find_regions  # noqa: E402

__all__ += ["RegionCapture", "capture_regions", "covered_op_calls", "region_cards", "FoundRegion", "find_regions"]

from ._baseline import inductor_baseline_us  # noqa: E402
from ._deploy import region_pass, regions_backend, replace_regions  # noqa: E402
from ..deploy import register_aten_pass  # noqa: E402

register_aten_pass(region_pass)  # region winners run in graph mode (Session.compile, kforge.load(...).compile)

__all__ += ["inductor_baseline_us", "region_pass", "regions_backend", "replace_regions"]

from ._vendor import FoundChain, VendorChain, find_vendor_chains  # noqa: E402
from ._vendor_spec import VENDOR_CHAIN, VENDOR_CHAIN_SPEC, chain_variant, vendor_chain  # noqa: E402
from ._vendor_strategies import register_strategies as _register_chain_strategies  # noqa: E402

_register_chain_strategies()  # the vendor_chain.* strategies join the built-in library

__all__ += ["FoundChain", "VendorChain", "VENDOR_CHAIN", "VENDOR_CHAIN_SPEC", "chain_variant", "find_vendor_chains",
            "vendor_chain"]
