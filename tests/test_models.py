"""The seed-workload builders: published shapes, a forward pass and the operators capture finds.

Models run at reduced depth and size in float32 on the CPU; widths and heads stay as published.
The language models also shrink their vocabularies (and Qwen its expert count) through ``overrides``,
since random init of the published tables takes minutes on two cores; the meta-device test checks
the published sizes without allocating them.
"""
from __future__ import annotations

import collections
import contextlib
import importlib
import sys

import pytest
import torch

import kforge
from kforge import models

import extras


def _import_or_skip(name: str):
    if name != "torchvision":   # transformers, diffusers
        return extras.module(name, "models")
    try:
        return importlib.import_module(name)
    except Exception as exc:  # a CUDA-only torchvision raises RuntimeError/OSError on a CPU machine
        pytest.skip(f"{name} does not import here: {type(exc).__name__}: {exc} (pip install torchvision, the "
                    "build that matches your torch)")


def _capture(model, inputs, tmp_path) -> tuple[dict[str, int], kforge.Cards]:
    """Calls per operator, and the cards."""
    cards = kforge.Session(model, inputs, device="cpu", workdir=tmp_path).capture(timing_budget_ms=5)
    calls: collections.Counter[str] = collections.Counter()
    for card in cards:
        calls[card.op] += card.calls
    return dict(calls), cards


def _has(cards: kforge.Cards, op: str, **params) -> bool:
    return any(c.op == op and all(c.variant.param_dict.get(k) == v for k, v in params.items()) for c in cards)


SMALL_LM = {"vocab_size": 4096}


# ----------------------------------------------------------------------------- build()


def test_build_rejects_unknown_names_and_unused_options():
    with pytest.raises(ValueError, match="choose one of resnet50, sd35_transformer"):
        models.build("resnet")
    with pytest.raises(ValueError, match="resnet50 has no use for tokens="):
        models.build("resnet50", tokens=16)
    with pytest.raises(ValueError, match="sd35_vae_decoder has no use for layers="):
        models.build("sd35_vae_decoder", layers=2)


def test_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "diffusers", None)
    with pytest.raises(models.MissingDependency,
                       match=r"build\('sd35_vae_decoder'\) needs diffusers: pip install 'kforge\[models\]'"):
        models.build("sd35_vae_decoder")


# ----------------------------------------------------------------------------- ResNet-50


def test_resnet50_captures_its_cnn_operators(tmp_path):
    _import_or_skip("torchvision")
    model, images = models.build("resnet50", dtype=torch.float32, batch=1, resolution=64)
    assert images.shape == (1, 3, 64, 64)
    assert model(images).shape == (1, 1000)
    calls, _ = _capture(model, images, tmp_path)
    assert calls["conv2d"] == 53 and calls["batch_norm"] == 53 and calls["linear"] == 1
    assert calls["add"] >= 16 and calls["relu"] >= 17
    assert calls["max_pool2d"] == 1 and calls["adaptive_avg_pool2d"] == 1


# ----------------------------------------------------------------------------- SD3.5 Medium


def test_sd35_transformer_captures_layer_norm_tanh_gelu_and_attention(tmp_path):
    _import_or_skip("diffusers")
    model, inputs = models.build("sd35_transformer", dtype=torch.float32, layers=1, resolution=64, tokens=8)
    assert inputs["hidden_states"].shape == (1, 16, 8, 8)
    assert inputs["encoder_hidden_states"].shape == (1, 8, 4096)
    assert inputs["pooled_projections"].shape == (1, 2048)
    assert model.config.num_attention_heads == 24 and model.config.caption_projection_dim == 1536
    with torch.no_grad():
        assert model(**inputs).sample.shape == (1, 16, 8, 8)
    calls, cards = _capture(model, inputs, tmp_path)
    for op in ("layer_norm", "gelu", "linear", "scaled_dot_product_attention"):
        assert calls.get(op, 0) > 0, (op, calls)
    assert _has(cards, "gelu", approximate="tanh")


def test_sd35_vae_decoder_captures_group_norm_silu_conv_and_attention(tmp_path):
    _import_or_skip("diffusers")
    model, latents = models.build("sd35_vae_decoder", dtype=torch.float32, resolution=32)
    assert latents.shape == (1, 16, 4, 4)
    with torch.no_grad():
        assert model(latents).shape == (1, 3, 32, 32)
    calls, _ = _capture(model, latents, tmp_path)
    # 2 mid-block + 4x3 up-block resnets with two norms each, the mid attention's norm, the output norm
    assert calls["group_norm"] == 30 and calls["silu"] == 29
    assert calls["conv2d"] > 30 and calls["scaled_dot_product_attention"] == 1


def test_sd35_default_inputs_are_1024px():
    _import_or_skip("diffusers")
    latents = models.sd35_vae_decoder.__kwdefaults__["resolution"] // 8
    assert latents == 128 and models.sd35_transformer.__kwdefaults__["tokens"] == 333


# ----------------------------------------------------------------------------- language models


def test_published_language_model_shapes_on_the_meta_device():
    transformers = _import_or_skip("transformers")
    with torch.device("meta"):
        gemma = transformers.Gemma4ForCausalLM._from_config(
            transformers.Gemma4TextConfig(**models.gemma4_e2b_config()), dtype=torch.bfloat16)
        qwen = transformers.Qwen3_5MoeForCausalLM._from_config(
            transformers.Qwen3_5MoeTextConfig(**models.qwen35_moe_config()), dtype=torch.bfloat16)
    g = dict(gemma.named_parameters())
    assert g["model.embed_tokens.weight"].shape == (262144, 1536)
    assert g["model.embed_tokens_per_layer.weight"].shape == (262144, 35 * 256)
    assert g["model.layers.0.self_attn.q_proj.weight"].shape == (8 * 256, 1536)
    assert g["model.layers.0.self_attn.k_proj.weight"].shape == (256, 1536)
    assert g["model.layers.4.self_attn.q_proj.weight"].shape == (8 * 512, 1536)
    assert g["model.layers.14.mlp.up_proj.weight"].shape == (6144, 1536)
    assert g["model.layers.15.mlp.up_proj.weight"].shape == (12288, 1536)
    assert "model.layers.15.self_attn.k_proj.weight" not in g  # KV-shared from layer 15 on
    assert gemma.config.layer_types[:5] == ["sliding_attention"] * 4 + ["full_attention"]
    q = dict(qwen.named_parameters())
    assert q["model.embed_tokens.weight"].shape == (248320, 2048)
    assert q["model.layers.0.linear_attn.conv1d.weight"].shape == (2 * 16 * 128 + 32 * 128, 1, 4)
    assert q["model.layers.0.mlp.experts.gate_up_proj"].shape == (256, 2 * 512, 2048)
    assert q["model.layers.0.mlp.shared_expert.up_proj.weight"].shape == (512, 2048)
    assert q["model.layers.3.self_attn.q_proj.weight"].shape == (2 * 16 * 256, 2048)  # with the output gate
    assert q["model.layers.3.self_attn.k_proj.weight"].shape == (2 * 256, 2048)
    assert qwen.config.layer_types[:4] == ["linear_attention"] * 3 + ["full_attention"]
    assert len(qwen.config.layer_types) == 40 and qwen.config.num_experts_per_tok == 8


@pytest.mark.parametrize("layers, shared, pattern", [(2, 0, "sf"), (6, 1, "ssssff"), (10, 5, "ssssfssssf")])
def test_shallow_gemma_keeps_the_pattern_and_some_kv_shared_layers(layers, shared, pattern):
    config = models.gemma4_e2b_config(layers)
    assert "".join(t[0] for t in config["layer_types"]) == pattern
    assert config["num_kv_shared_layers"] == shared


def test_gemma4_eager_attention_shows_its_softmax(tmp_path):
    _import_or_skip("transformers")
    model, ids = models.gemma4_e2b(dtype=torch.float32, layers=2, tokens=16, attn_implementation="eager",
                                   overrides={**SMALL_LM, "vocab_size_per_layer_input": 4096})
    assert ids.shape == (1, 16)
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 16, 4096) and logits.abs().max() <= 30.0  # final logit softcap
    calls, cards = _capture(model, ids, tmp_path)
    assert calls["softmax"] == 2  # one per layer: with SDPA it would be hidden
    assert calls["embedding"] == 2  # tokens and per-layer inputs
    for op in ("linear", "gelu", "mul"):
        assert calls.get(op, 0) > 0, (op, calls)
    assert _has(cards, "gelu", approximate="tanh")


def test_qwen35_moe_captures_router_softmax_and_depthwise_conv(tmp_path):
    _import_or_skip("transformers")
    model, ids = models.qwen35_moe(dtype=torch.float32, layers=2, tokens=16,
                                   overrides={**SMALL_LM, "num_experts": 16})
    assert model.config.layer_types == ["linear_attention", "full_attention"]
    with torch.no_grad():
        assert model(ids).logits.shape == (1, 16, 4096)
    calls, cards = _capture(model, ids, tmp_path)
    assert calls["softmax"] == 2  # the router of each layer; attention runs in SDPA
    assert calls["conv1d"] == 1 and calls["scaled_dot_product_attention"] == 1
    for op in ("embedding", "linear", "silu"):
        assert calls.get(op, 0) > 0, (op, calls)
    assert _has(cards, "conv1d", groups=8192)


def test_saved_weights_load_back(tmp_path):
    _import_or_skip("transformers")
    model, ids = models.qwen35_moe(dtype=torch.float32, layers=1, tokens=8, overrides={**SMALL_LM, "num_experts": 8})
    model.save_pretrained(tmp_path)
    loaded, _ = models.build("qwen35_moe", dtype=torch.float32, tokens=8, weights=tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    with pytest.raises(ValueError, match="layers= cannot be combined with weights="):
        models.build("qwen35_moe", layers=1, weights=tmp_path)


@pytest.mark.slow
def test_gemma4_with_the_published_vocabulary_runs():
    _import_or_skip("transformers")
    model, ids = models.build("gemma4_e2b", layers=2, tokens=8)
    assert model.dtype == torch.bfloat16
    with torch.no_grad():
        assert model(ids).logits.shape == (1, 8, 262144)


# ----------------------------------------------------------------------------- decode


@contextlib.contextmanager
def _boosting(model, token: int, from_call: int = 1):
    """Inside: ``token`` wins every step from the ``from_call``-th forward on (a hook on the LM head)."""
    calls = []

    def boost(_module, _args, out):
        calls.append(1)
        if len(calls) >= from_call:
            out[..., token] += 1e4
        return out
    hook = model.lm_head.register_forward_hook(boost)
    try:
        yield
    finally:
        hook.remove()


def test_compare_decode_interleaves_its_arms_and_compares_with_the_first():
    _import_or_skip("transformers")
    import contextlib

    model, ids = models.gemma4_e2b(dtype=torch.float32, layers=1, tokens=8,
                                   overrides={**SMALL_LM, "vocab_size_per_layer_input": 4096})
    entered: list[str] = []

    def arm(label, inner=contextlib.nullcontext):
        @contextlib.contextmanager
        def enter():
            entered.append(label)
            with inner():
                yield
        return enter

    boosted = lambda: _boosting(model, 7)  # noqa: E731 -- token 7 wins every step: other tokens, other logits

    def broken():
        raise RuntimeError("this arm cannot build")

    arms = {"eager": arm("eager"), "same": arm("same"), "broken": broken, "boosted": arm("boosted", boosted)}
    result = models.compare_decode(model, ids, 4, arms, rounds=3)
    assert list(result) == ["eager", "same", "broken", "boosted"]
    ref = result["eager"]
    assert ref.ratio == 1.0 and ref.same_tokens and ref.decode.cache == "static" and len(ref.decode.tokens) == 4
    assert result["same"].same_tokens and result["same"].logit_rel_diff == 0.0 and result["same"].ratio > 0
    assert result["boosted"].decode.tokens == (7, 7, 7, 7) != ref.decode.tokens
    assert not result["boosted"].same_tokens and result["boosted"].logit_rel_diff > 0.1
    assert result["broken"].decode is None and "this arm cannot build" in result["broken"].error
    assert "failed: RuntimeError: this arm cannot build" in result["broken"].line("eager")
    # one warm-up each, then three rounds, each starting one arm further along
    live = ["eager", "same", "boosted"]
    assert entered[:3] == live
    rounds = [entered[3 + 3 * r: 6 + 3 * r] for r in range(3)]
    assert rounds == [live, live[1:] + live[:1], live[2:] + live[:2]]
    # the boosted arm took its hook off: decoding again gives the reference's tokens
    again = models.compare_decode(model, ids, 4, {"eager": contextlib.nullcontext}, rounds=1)
    assert again["eager"].decode.tokens == ref.decode.tokens


def test_decode_steps_compiles_the_steps_and_agreement_reads_the_common_context():
    """decode_steps sends the one-token steps to the compiled forward and the prompt to the model's own;
    an arm that parts from the reference at its third token agrees for two, and its logits are compared
    where both decoded from the same context (up to the first difference), not after it."""
    _import_or_skip("transformers")
    import contextlib

    model, ids = models.gemma4_e2b(dtype=torch.float32, layers=1, tokens=8,
                                   overrides={**SMALL_LM, "vocab_size_per_layer_input": 4096})
    shapes: list[int] = []

    def compiled(*args, **kwargs):
        shapes.append(kwargs["input_ids"].shape[1])
        return type(model).forward(model, *args, **kwargs)

    @contextlib.contextmanager
    def steps():
        shapes.clear()
        with models.forward_as(model, models.decode_steps(model, compiled)):
            yield

    ref = models.compare_decode(model, ids, 5, {"eager": contextlib.nullcontext}, rounds=1)["eager"].decode
    target = next(t for t in range(4096) if t != ref.tokens[2])

    late = lambda: _boosting(model, target, from_call=3)  # noqa: E731 -- from the third token on

    result = models.compare_decode(model, ids, 5, {"eager": contextlib.nullcontext, "steps": steps, "late": late},
                                   rounds=1)
    assert result["steps"].same_tokens and result["steps"].logit_rel_diff < 1e-5
    assert shapes and set(shapes) == {1}, "the compiled forward got the decode steps only"
    late_arm = result["late"]
    assert not late_arm.same_tokens and late_arm.agreed == 2 and late_arm.decode.tokens[2] == target
    assert late_arm.logit_rel_diff > 0.1, "the step where they part is compared (same context)"
    assert "tokens identical for the first 2 of 5" in late_arm.line("eager")
    assert ref.agreed(ref) == 5


def test_compare_decode_reads_a_slower_arm_as_slower_and_survives_an_arm_failing_later():
    """An arm that sleeps in every forward reads as far slower (the ratio's direction); an arm that
    fails in its second round is reported with the round and the others are still measured; rounds
    are rounded up to a multiple of the arms (each goes first equally often)."""
    _import_or_skip("transformers")
    import contextlib
    import time

    model, ids = models.gemma4_e2b(dtype=torch.float32, layers=1, tokens=8,
                                   overrides={**SMALL_LM, "vocab_size_per_layer_input": 4096})
    entered: list[str] = []

    @contextlib.contextmanager
    def slow():  # 0.3 s a forward: far beyond what a loaded CPU adds to this model's step
        entered.append("slow")
        hook = model.register_forward_pre_hook(lambda *_: time.sleep(0.3))
        try:
            yield
        finally:
            hook.remove()

    @contextlib.contextmanager
    def flaky():  # warm-up and the first round pass, the second round raises
        entered.append("flaky")
        if entered.count("flaky") == 3:
            raise RuntimeError("lost the device")
        yield

    @contextlib.contextmanager
    def eager():
        entered.append("eager")
        yield

    result = models.compare_decode(model, ids, 4, {"eager": eager, "slow": slow, "flaky": flaky}, rounds=2)
    assert result["slow"].ratio < 0.6 and result["slow"].same_tokens
    assert result["slow"].decode.tokens_per_s < result["eager"].decode.tokens_per_s
    assert result["flaky"].decode is None and result["flaky"].error.startswith("RuntimeError in round 2: lost the device")
    assert entered.count("eager") == entered.count("slow") == 1 + 3   # 2 rounds become 3 (three arms)
    assert entered.count("flaky") == 3


def test_compare_decode_rejects_what_it_cannot_measure():
    model = torch.nn.Linear(2, 2)
    ids = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="new_tokens must be at least 2"):
        models.compare_decode(model, ids, 1, {"eager": lambda: None})
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        models.compare_decode(model, ids, 4, {"eager": lambda: None}, rounds=0)
    with pytest.raises(ValueError, match="at least one arm"):
        models.compare_decode(model, ids, 4, {})


def test_forward_as_gives_back_what_the_instance_had():
    model = torch.nn.Linear(2, 2)
    own = lambda x: x  # noqa: E731
    with models.forward_as(model, own):
        with models.forward_as(model, lambda x: 2 * x):
            assert model.forward(1) == 2
        assert model.forward is own
    assert "forward" not in model.__dict__
