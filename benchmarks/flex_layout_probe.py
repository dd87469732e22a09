"""Which layout Inductor hands a custom operator tagged flexible_layout (what kforge::run_flexible is) when its
input is a convolution's output (on CUDA Inductor peels the convolution's bias into a pointwise add), with and
without a 1x1 convolution also reading that output (the SD3.5 VAE's conv_shortcut). Prints the strides the op
got at run time and Inductor's code around its call.

    python benchmarks/flex_layout_probe.py cuda
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
seen = []
lib = torch.library.Library("probe", "DEF")
lib.define("f(Tensor x) -> Tensor", tags=(torch.Tag.flexible_layout,))
def f_impl(x):
    seen.append(tuple(x.stride()))
    return torch.empty_like(x, memory_format=torch.preserve_format).copy_(x)
lib.impl("f", f_impl, "CompositeExplicitAutograd")
@torch.library.register_fake("probe::f", lib=lib)
def _(x):
    return torch.empty_like(x, memory_format=torch.preserve_format)
class M(nn.Module):
    def __init__(s, shortcut):
        super().__init__()
        s.c0 = nn.Conv2d(32, 32, 3, padding=1); s.up = nn.Conv2d(32, 32, 3, padding=1)
        s.c1 = nn.Conv2d(32, 16, 3, padding=1); s.sc = nn.Conv2d(32, 16, 1) if shortcut else None
    def forward(s, x):
        x = s.c0(x)
        x = F.interpolate(x.float(), scale_factor=2.0, mode="nearest").to(x.dtype)
        y = s.up(x)
        h = torch.ops.probe.f(y)
        h = s.c1(h)
        return h + (s.sc(y) if s.sc is not None else 0)
dt = torch.bfloat16 if dev == "cuda" else torch.float32
for shortcut in (False, True):
    torch._dynamo.reset()
    m = M(shortcut).to(dev, dt).eval()
    x = torch.randn(1, 32, 16, 16, device=dev, dtype=dt)
    seen.clear()
    from torch._inductor.utils import run_and_get_code
    with torch.no_grad():
        _, codes = run_and_get_code(torch.compile(m), x)
    for code in codes:
        lines = code.splitlines()
        for i, line in enumerate(lines):
            if "probe.f" in line or "extern_kernels.convolution" in line:
                print("   ", " | ".join(l.strip() for l in lines[max(0, i - 2):i + 1]))
    print("shortcut", shortcut, "probe got strides", seen[-1:] , "channels-last would be", torch.empty(1,32,32,32).to(memory_format=torch.channels_last).stride())
