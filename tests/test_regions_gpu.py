"""Region kernels on a CUDA GPU: every generated kernel (several launch choices each) against eager."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from kforge.evaluate._checks import compare
from kforge.kernels import Kernel, compile_source, device_info, param_vector
from kforge.ops import get_spec
from kforge.regions import generate, plan_variant
from kforge.regions._generator import default_config, valid_config

pytestmark = pytest.mark.gpu

from test_regions_generator import CASES  # noqa: E402


def _configs(variant, info):
    plan = plan_variant(variant)
    base = default_config(variant, info)
    if plan.red is None:
        tries = [{}, {"vec": 1}, {"waves": 4, "threads": 128}, {"fast": 0, "round": 1}, {"fast": 1, "round": 1}]
    else:
        tries = [{}, {"cache": 0}, {"vec": 1, "cache": 0}, {"threads": 128, "tpr": 8, "cache": 1},
                 {"threads": 128, "tpr": 128, "split": 2, "cache": 0, "vec": 1},
                 {"threads": 64, "tpr": 64, "split": 4, "cache": 0, "vec": 1}, {"fast": 0, "round": 1},
                 # the two-pass statistics from registers: a row per block (shared memory), a warp per row
                 {"threads": 256, "tpr": 256, "split": 1, "cache": 1, "vec": 1},
                 {"threads": 128, "tpr": 32, "split": 1, "cache": 1}, {"fast": 1}]
    out = []
    for t in tries:
        c = {**base, **t}
        if valid_config(variant, c, info) and c not in out:
            out.append(c)
    return out


def test_generated_cuda_kernels_match_eager():
    device = f"cuda:{torch.cuda.current_device()}"
    info = device_info(device)
    spec = get_spec("region")
    jobs = [(seed, v.on(device), c) for seed, v in CASES for c in _configs(v.on(device), info)]
    with ThreadPoolExecutor(8) as pool:
        built = list(pool.map(lambda j: compile_source(generate(j[1], "cuda", j[2], info), "cuda", info.arch), jobs))
    failures = []
    for (seed, variant, config), b in zip(jobs, built):
        kernel = Kernel(b.path)
        inputs = spec.random_inputs(variant, seed)
        refs = spec.reference(inputs, variant.param_dict)
        for attempt in range(2):
            outs = [torch.full(s.shape, float("nan"), device=device).to(getattr(torch, s.dtype))
                    .as_strided(s.shape, s.stride) for s in variant.outputs]
            ws = torch.empty(max(kernel.workspace_bytes, 1), dtype=torch.uint8, device=device)
            kernel.prepare(len(variant.inputs), len(variant.outputs), param_vector(variant)).launch(
                inputs, outs, ws, torch.cuda.current_stream(device).cuda_stream)
            torch.cuda.synchronize(device)
            for i, (o, r) in enumerate(zip(outs, refs)):
                m = compare(spec, o, r, f"output {i}")
                if not m.ok:
                    failures.append(f"seed {seed} {config}: {variant.signature}: {m.message}")
    assert not failures, "\n".join(failures[:20]) + f"\n({len(failures)} failures of {2 * len(jobs)} runs)"
