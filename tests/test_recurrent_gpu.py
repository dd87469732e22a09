"""The gated delta rule's CUDA strategy on a real GPU: every configuration against the reference, in the
layouts models hand it (Qwen 3.5's token-major projection views, and contiguous tensors), with and without
a state carried in and out. Skipped where there is no GPU (CI); run on the device."""
from __future__ import annotations

import pytest
import torch

from kforge.deploy._launch import DeployedKernel
from kforge.kernels import Kernel, compile_source, device_info
from kforge.ops import get_spec
from kforge.proposers.builtin import strategies_for

pytestmark = pytest.mark.gpu


def _variant(tokens: int, token_major: bool, state: bool, final: bool):
    spec = get_spec("gated_delta_rule")
    hk, hv, dk, dv = 4, 8, 128, 64
    width = 2 * hk * dk + hv * dv
    mixed = (torch.randn(1, width, tokens, device="cuda").transpose(1, 2) if token_major
             else torch.randn(1, tokens, width, device="cuda")).to(torch.bfloat16)
    q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], -1)
    q, k, v = q.reshape(1, tokens, hk, dk), k.reshape(1, tokens, hk, dk), v.reshape(1, tokens, hv, dv)
    g = -torch.rand(1, tokens, hv, device="cuda") * 2
    beta = torch.rand(1, tokens, hv, device="cuda").to(torch.bfloat16)
    s0 = torch.randn(1, hv, dk, dv, device="cuda") * 0.1 if state else None
    call = spec.bind(q, k, v, g, beta, initial_state=s0, output_final_state=final, use_qk_l2norm_in_kernel=True)
    ref = spec.reference(list(call.inputs), call.params)
    ref = ref if isinstance(ref, tuple) else (ref,)
    return spec, spec.variant(call, ref), list(call.inputs), ref


# NB: one token on a state is a decode step (transformers' token-by-token function)
@pytest.mark.parametrize("tokens,token_major,state,final", [(77, True, False, True), (77, False, True, True),
                                                            (77, True, True, False), (1, True, True, True)])
def test_every_configuration_matches_the_reference(tokens, token_major, state, final):
    spec, variant, inputs, ref = _variant(tokens, token_major, state, final)
    info = device_info("cuda")
    (strategy,) = strategies_for("gated_delta_rule", "cuda")
    assert strategy.applies(variant, info)
    rtol, atol = spec.tolerance("bfloat16")
    for config in strategy.configs(variant, info):
        dk = DeployedKernel(variant, Kernel(compile_source(strategy.render(variant, config, info), "cuda",
                                                           info.arch).path))
        got = dk(tuple(inputs))
        assert len(got) == len(ref)
        scale = ref[0].float().abs().max().item()
        err = (got[0].float() - ref[0].float()).abs()
        assert (err <= atol * scale + rtol * ref[0].float().abs()).all(), (config, err.max().item())
        if final:
            assert torch.allclose(got[1], ref[1], rtol=1e-3, atol=1e-4), (config, (got[1] - ref[1]).abs().max().item())
