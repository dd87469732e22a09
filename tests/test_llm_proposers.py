"""The LLM proposers end to end against fake servers speaking the providers' real wire protocols."""
from __future__ import annotations

import sys
import types
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable

import pytest
import torch

from kforge.capture import Card
from kforge.evaluate import Evaluation, Status
from kforge.kernels import DeviceInfo
from kforge.ops import get_spec
from kforge.proposers import Attempt, Proposal, ProposalRequest, ProposerError, Usage, make_proposer
from kforge.proposers._anthropic import AnthropicProposer
from kforge.proposers._llm import (PricingWarning, RetryPolicy, build_prompt, example_kernel, extract_code,
                                   extract_intent, parse_retry_after)
from kforge.proposers._openai import OpenAIProposer
from kforge.proposers._pricing import PRICES, Price, cost

import extras
from llm_servers import (AnthropicServer, FakeServer, OpenAIServer, Scripted, anthropic_error, anthropic_message,
                         openai_completion, openai_error)

KERNEL = """#include "kforge.h"
__global__ void softmax_rows(const float* x, float* y) { /* one warp per row */ }
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    softmax_rows<<<4, 32, 0, (cudaStream_t)stream>>>((const float*)inputs[0].data, (float*)outputs[0].data);
    return (int)cudaGetLastError();
}
"""
ANSWER = f"Intent: one warp per row with shuffle reductions\n\n```cuda\n{KERNEL}```\n"
PARENT_SOURCE = "// parent kernel: blockDimx typo\n" + KERNEL
COMPILE_LOG = 'kernel.cu(2): error: identifier "blockDimx" is undefined'

ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "ANTHROPIC_PROFILE",
       "ANTHROPIC_CUSTOM_HEADERS", "OPENAI_API_KEY", "OPENAI_ADMIN_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID",
       "OPENAI_PROJECT_ID", "OPENAI_CUSTOM_HEADERS", "KFORGE_MODEL", "KFORGE_BASE_URL", "KFORGE_API_KEY",
       "KFORGE_MAX_TOKENS", "KFORGE_TIMEOUT_S", "KFORGE_MAX_ATTEMPTS", "KFORGE_MAX_WAIT_S")


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No real keys, endpoints or config file reach a test."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KFORGE_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path / "anthropic"))


def _card() -> Card:
    spec = get_spec("softmax")
    call = spec.bind(torch.randn(4, 8), -1)
    variant = spec.variant(call, [spec.reference(call.inputs, call.params)])
    return Card(variant, calls=1, eager_us=5.0, share=1.0, vendor=None)


def _attempt(cid: int, intent: str, evaluation: Evaluation, source: str = KERNEL) -> Attempt:
    return Attempt(cid, source, intent, evaluation)


H200 = DeviceInfo("cuda", "NVIDIA H200", "sm_90", 132, 4250.0, 60 << 20, 227 << 10)


def _request(backend: str = "cuda", with_parent: bool = True) -> ProposalRequest:
    if not with_parent:
        return ProposalRequest(_card(), backend, H200)
    parent = _attempt(3, "vectorised float4 loads", Evaluation(Status.COMPILE_ERROR, "nvcc failed",
                                                               compile_log=COMPILE_LOG), PARENT_SOURCE)
    lineage = (_attempt(1, "naive one thread per row", Evaluation(Status.SLOWER, speedup=0.6,
                                                                   candidate_us=8.3, eager_us=5.0)),)
    siblings = (_attempt(4, "shared-memory tiling", Evaluation(Status.WRONG_RESULT, "output 0 differs",
                                                               max_abs_error=0.25)),)
    return ProposalRequest(_card(), backend, H200, parent=parent, lineage=lineage, siblings=siblings)


# ----------------------------------------------------------------------------- one scenario, both providers


@dataclass
class Wire:
    """One provider's server and replies, so each scenario runs against both protocols."""

    server: Callable[[], FakeServer]
    make: Callable[..., Any]
    ok: Callable[..., Scripted]
    truncated: Callable[[str], Scripted]
    refusal: Callable[[], Scripted]
    error: Callable[..., Scripted]
    overloaded: int
    model: str
    price: Price

    def dollars(self, reply: Scripted) -> tuple[Usage, float]:
        """The tokens the proposer must store for ``reply`` and their dollars under the table."""
        u = reply.body["usage"]
        if "input_tokens" in u:
            usage = Usage(input_tokens=u["input_tokens"], output_tokens=u["output_tokens"],
                          cache_read_tokens=u["cache_read_input_tokens"],
                          cache_write_tokens=u["cache_creation_input_tokens"])
        else:
            cached = u["prompt_tokens_details"]["cached_tokens"]
            usage = Usage(input_tokens=u["prompt_tokens"] - cached, output_tokens=u["completion_tokens"],
                          cache_read_tokens=cached)
        p = self.price
        return usage, (usage.input_tokens * p.input + usage.output_tokens * p.output
                       + usage.cache_read_tokens * p.cache_read + usage.cache_write_tokens * p.cache_write) / 1e6


def _anthropic(url: str, **kw: Any) -> AnthropicProposer:
    return AnthropicProposer(**{"api_key": "sk-ant-test", "base_url": url, **kw})


def _sent_key(headers: dict[str, str]) -> str:
    """The Anthropic key as sent: x-api-key, or the bearer header the current SDK uses."""
    return headers.get("x-api-key") or headers["authorization"].removeprefix("Bearer ")


def _openai(url: str, **kw: Any) -> OpenAIProposer:
    # NB: self_hosted=False makes the fake behave as OpenAI's own endpoint (key, prices, parameters).
    return OpenAIProposer(**{"api_key": "sk-test", "base_url": url + "/v1", "self_hosted": False, **kw})


WIRES = {
    "anthropic": Wire(
        AnthropicServer, _anthropic,
        ok=lambda text=ANSWER, **kw: anthropic_message(text, **{"input_tokens": 1200, "output_tokens": 800,
                                                               "cache_write": 3000, **kw}),
        truncated=lambda text: anthropic_message(text, stop_reason="max_tokens", output_tokens=4096),
        refusal=lambda: anthropic_message("I can't help with that.", stop_reason="refusal", output_tokens=9),
        error=anthropic_error, overloaded=529, model="claude-sonnet-5-5",
        price=PRICES["claude-sonnet-5-5"]),
    "openai": Wire(
        OpenAIServer, _openai,
        ok=lambda text=ANSWER, **kw: openai_completion(text, **{"prompt_tokens": 5000, "cached_tokens": 4000,
                                                               "completion_tokens": 700, **kw}),
        truncated=lambda text: openai_completion(text, finish_reason="length", completion_tokens=4096),
        refusal=lambda: openai_completion(None, refusal="I can't help with that.", completion_tokens=9),
        error=openai_error, overloaded=503, model="gpt-6.1-sol", price=PRICES["gpt-6.1-sol"]),
}


# the proposers' own SDKs speak the wire protocols to the fake servers
needs_llm = extras.needs("llm")


@pytest.fixture(params=[pytest.param(name, marks=needs_llm) for name in sorted(WIRES)])
def wire(request) -> Wire:
    return WIRES[request.param]


@pytest.fixture
def sleeps() -> list[float]:
    return []


def _run(wire: Wire, *replies: Scripted, sleeps: list[float] | None = None, **kw: Any
         ) -> tuple[Proposal | ProposerError, FakeServer]:
    with wire.server() as server:
        server.respond(*replies)
        proposer = wire.make(server.url, sleep=(sleeps if sleeps is not None else []).append, **kw)
        try:
            return proposer.propose(_request()), server
        except ProposerError as e:
            return e, server


def test_success_stores_source_intent_prompt_tokens_and_dollars(wire):
    reply = wire.ok()
    proposal, server = _run(wire, reply)
    assert isinstance(proposal, Proposal)
    assert proposal.source == KERNEL
    assert proposal.intent == "one warp per row with shuffle reductions"
    assert proposal.response == ANSWER
    tokens, dollars = wire.dollars(reply)
    assert proposal.usage == replace(tokens, model=wire.model, dollars=pytest.approx(dollars),
                                     latency_s=proposal.usage.latency_s)
    assert dollars > 0 and proposal.usage.latency_s > 0
    assert len(server.requests) == 1
    sent = server.requests[0].body
    # Everything the model was sent is in the stored prompt.
    texts = ([b["text"] for b in sent["system"]] + [b["text"] for b in sent["messages"][0]["content"]]
             if "system" in sent else [m["content"] for m in sent["messages"]])
    assert all(t in proposal.prompt for t in texts)
    for expected in ("inputs[0] input: float32, shape (4, 8), strides (8, 1)", "dim = 1 -> params[0]",
                     "torch.softmax(x[0]", PARENT_SOURCE.strip(), COMPILE_LOG, "KF_ENTRY int kf_launch",
                     "Eager: 5.00 us", "NVIDIA H200 (sm_90", "vectorised float4 loads",
                     "#1 naive one thread per row: slower, 0.60x",
                     "#4 shared-memory tiling: wrong_result: output 0 differs"):
        assert expected in proposal.prompt, expected


@needs_llm
def test_anthropic_wire_marks_the_repeating_prefix_for_caching():
    with AnthropicServer() as server:
        server.respond(WIRES["anthropic"].ok(), WIRES["anthropic"].ok(cache_write=0, cache_read=3000))
        proposer = _anthropic(server.url)
        proposer.propose(_request())
        second = proposer.propose(replace(_request(), parent=None))
    first, again = (r.body for r in server.requests)
    headers = server.requests[0].headers
    assert _sent_key(headers) == "sk-ant-test" and headers["anthropic-version"]
    assert first["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert first["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in first["messages"][0]["content"][1]
    # The cached blocks are identical from call to call on one card; only the task differs.
    assert first["system"] == again["system"]
    assert first["messages"][0]["content"][0] == again["messages"][0]["content"][0]
    assert first["messages"][0]["content"][1] != again["messages"][0]["content"][1]
    assert second.usage.cache_read_tokens == 3000 and second.usage.cache_write_tokens == 0


@needs_llm
def test_openai_wire_sends_system_then_user_and_bearer_key():
    with OpenAIServer() as server:
        server.respond(WIRES["openai"].ok())
        _openai(server.url).propose(_request())
    request = server.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert [m["role"] for m in request.body["messages"]] == ["system", "user"]
    assert request.body["max_completion_tokens"] == 32768 and "max_tokens" not in request.body


def test_prose_and_several_code_blocks_take_the_one_defining_kf_launch(wire):
    text = ("Let me think about the layout first.\n\n```python\nprint('sketch')\n```\n\n"
            "Intent: **split rows across warps**\n\nThe helper:\n```cuda\n__device__ float warp_max(float v);\n```\n"
            f"And the whole file:\n```cuda\n{KERNEL}```\n\nTo build it:\n```bash\nnvcc -O3 kernel.cu\n```\n")
    proposal, _ = _run(wire, wire.ok(text))
    assert proposal.source == KERNEL
    assert proposal.intent == "split rows across warps"


def test_a_reply_cut_at_max_tokens_is_an_error_that_keeps_the_paid_usage(wire):
    text = f"Intent: unrolled\n```cuda\n{KERNEL[:120]}"
    reply = wire.truncated(text)
    error, server = _run(wire, reply)
    assert isinstance(error, ProposerError)
    assert "max_tokens" in str(error)
    tokens, dollars = wire.dollars(reply)
    assert (error.usage.output_tokens, error.usage.dollars) == (tokens.output_tokens, pytest.approx(dollars))
    assert error.response == text and COMPILE_LOG in error.prompt
    assert len(server.requests) == 1  # a paid, complete answer is not retried


def test_a_refusal_is_an_error_that_keeps_the_paid_usage(wire):
    error, _ = _run(wire, wire.refusal())
    assert isinstance(error, ProposerError)
    assert "refusal" in str(error)
    assert error.usage.output_tokens == 9 and error.usage.dollars > 0
    assert "can't help" in error.response


def test_429_honours_retry_after_then_succeeds(wire, sleeps):
    busy = wire.error(429, "rate_limit_error", "slow down", {"retry-after": "7"})
    proposal, server = _run(wire, busy, wire.ok(), sleeps=sleeps)
    assert isinstance(proposal, Proposal)
    assert sleeps == [7.0]
    assert len(server.requests) == 2


def test_retry_after_is_capped(wire, sleeps):
    busy = wire.error(429, "rate_limit_error", "slow down", {"retry-after": "3600"})
    _run(wire, busy, wire.ok(), sleeps=sleeps, max_wait_s=20)
    assert sleeps == [20.0]


def test_500_backs_off_then_succeeds(wire, sleeps):
    proposal, server = _run(wire, wire.error(500, "api_error", "internal"), wire.ok(), sleeps=sleeps)
    assert isinstance(proposal, Proposal)
    assert len(sleeps) == 1 and 0.5 <= sleeps[0] <= 1.0
    assert len(server.requests) == 2


def test_overloaded_is_retried_with_growing_waits_then_gives_up(wire, sleeps):
    overloaded = wire.error(wire.overloaded, "overloaded_error", "Overloaded")
    error, server = _run(wire, overloaded, overloaded, overloaded, sleeps=sleeps, max_attempts=3)
    assert isinstance(error, ProposerError)
    assert f"HTTP {wire.overloaded}" in str(error) and "after 3 attempts" in str(error)
    assert len(server.requests) == 3
    assert 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0
    assert error.usage.dollars == 0


def test_a_rejected_key_is_not_retried(wire, sleeps):
    error, server = _run(wire, wire.error(401, "authentication_error", "invalid x-api-key"), sleeps=sleeps)
    assert isinstance(error, ProposerError)
    assert "API key was rejected" in str(error) and "invalid x-api-key" in str(error)
    assert len(server.requests) == 1 and sleeps == []


def test_a_hanging_server_times_out_and_is_retried(wire, sleeps):
    hang = replace(wire.ok(), hang_s=10.0)
    proposal, server = _run(wire, hang, wire.ok(), sleeps=sleeps, timeout_s=0.3, max_attempts=2)
    assert isinstance(proposal, Proposal)
    assert len(server.requests) == 2 and len(sleeps) == 1
    error, _ = _run(wire, hang, sleeps=sleeps, timeout_s=0.3, max_attempts=1)
    assert isinstance(error, ProposerError) and "no answer within 0.3 s" in str(error)


# ----------------------------------------------------------------------------- keys, endpoints, settings


@pytest.mark.parametrize("make, env", [(AnthropicProposer, "ANTHROPIC_API_KEY"), (OpenAIProposer, "OPENAI_API_KEY")])
def test_a_missing_key_says_how_to_provide_one_or_use_builtin(make, env):
    with pytest.raises(ProposerError, match=env) as info:
        make()
    assert 'proposer="builtin"' in str(info.value)


@needs_llm
def test_a_local_endpoint_needs_no_key_nor_model_and_costs_nothing(sleeps):
    with OpenAIServer(models=("qwen2.5-coder-32b-instruct",)) as server:
        server.respond(openai_completion(ANSWER, model="qwen2.5-coder-32b-instruct"))
        proposer = make_proposer(f"local:{server.url}/v1", sleep=sleeps.append)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            proposal = proposer.propose(_request())
    assert proposer.name == "local"
    assert [r.path for r in server.requests] == ["/v1/models", "/v1/chat/completions"]
    body = server.requests[1].body
    assert body["model"] == "qwen2.5-coder-32b-instruct" and body["max_tokens"] == 32768
    assert proposal.usage.model == "qwen2.5-coder-32b-instruct"
    assert proposal.usage.dollars == 0 and proposal.usage.input_tokens == 1000


@needs_llm
def test_an_unpriced_model_costs_zero_with_a_warning():
    with OpenAIServer() as server:
        server.respond(openai_completion(ANSWER, model="my-finetune-v2"))
        with pytest.warns(PricingWarning, match="my-finetune-v2"):
            proposal = _openai(server.url, model="my-finetune-v2").propose(_request())
    assert proposal.usage.dollars == 0 and proposal.usage.output_tokens == 500


@needs_llm
def test_settings_come_from_arguments_then_environment_then_config_file(monkeypatch, tmp_path):
    (tmp_path / "config.toml").write_text(
        '[anthropic]\nmodel = "claude-from-file"\napi_key = "key-from-file"\nmax_attempts = 7\n\n'
        '[pricing."claude-from"]\ninput = 1.0\noutput = 2.0\n')
    from_file = AnthropicProposer()
    assert (from_file.model, from_file.api_key, from_file.retry.max_attempts) == (
        "claude-from-file", "key-from-file", 7)
    monkeypatch.setenv("KFORGE_MODEL", "claude-from-env")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "key-from-env")
    from_env = AnthropicProposer()
    assert (from_env.model, from_env.api_key) == ("claude-from-env", "key-from-env")
    from_args = AnthropicProposer("claude-from-args", api_key="key-from-args", max_attempts=2)
    assert (from_args.model, from_args.api_key, from_args.retry.max_attempts) == (
        "claude-from-args", "key-from-args", 2)
    # The file's price applies to calls, and the key from the file is what the server sees.
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with AnthropicServer() as server:
        server.respond(anthropic_message(ANSWER, model="claude-from-env", input_tokens=1_000_000,
                                         output_tokens=1_000_000))
        proposal = AnthropicProposer(base_url=server.url).propose(_request())
    assert _sent_key(server.requests[0].headers) == "key-from-file"
    assert proposal.usage.dollars == pytest.approx(3.0)


def test_a_malformed_config_file_names_the_file(tmp_path):
    (tmp_path / "config.toml").write_text("[anthropic\n")
    with pytest.raises(ProposerError, match="config.toml is not valid TOML"):
        AnthropicProposer(api_key="k")


def test_missing_sdk_gives_an_actionable_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(ImportError, match=r"install kforge\[llm\]"):
        AnthropicProposer(api_key="k")


# ----------------------------------------------------------------------------- registry


@needs_llm
def test_make_proposer_understands_names_models_and_urls(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    claude = make_proposer("anthropic:claude-opus-4-5", max_tokens=8000)
    assert isinstance(claude, AnthropicProposer) and (claude.model, claude.max_tokens) == ("claude-opus-4-5", 8000)
    assert make_proposer("anthropic").model == "claude-sonnet-5-5"
    gpt = make_proposer("openai:gpt-4.1-mini")
    assert (gpt.name, gpt.model) == ("openai", "gpt-4.1-mini")
    local = make_proposer("local:http://127.0.0.1:8000/v1", model="qwen")
    assert (local.name, local.base_url, local.api_key) == ("local", "http://127.0.0.1:8000/v1", "kforge-no-key")
    assert make_proposer(claude) is claude
    with pytest.raises(ValueError, match="unknown proposer 'gemini'"):
        make_proposer("gemini")
    with pytest.raises(ValueError, match="needs the base URL"):
        make_proposer("local")
    with pytest.raises(TypeError, match="apply to a proposer made by name"):
        make_proposer(claude, model="x")


def test_make_proposer_imports_builtin_lazily(monkeypatch):
    class BuiltinProposer:
        name = "builtin"

        def __init__(self, **options):
            self.options = options

        def propose(self, request):
            raise NotImplementedError

    module = types.ModuleType("kforge.proposers.builtin")
    module.BuiltinProposer = BuiltinProposer
    monkeypatch.setitem(sys.modules, "kforge.proposers.builtin", module)
    made = make_proposer("builtin", seed=3)
    assert isinstance(made, BuiltinProposer) and made.options == {"seed": 3}


# ----------------------------------------------------------------------------- pricing, parsing, prompt


def test_pricing_matches_the_longest_prefix_and_honours_overrides():
    tokens = Usage(input_tokens=1_000_000, output_tokens=1_000_000, cache_read_tokens=1_000_000,
                   cache_write_tokens=1_000_000)
    assert cost(tokens, "claude-opus-4-5-20251101").dollars == pytest.approx(5 + 25 + 0.5 + 6.25)
    assert cost(tokens, "claude-opus-4-1-20250805").dollars == pytest.approx(15 + 75 + 1.5 + 18.75)
    assert cost(tokens, "gpt-4.1-mini-2025-04-14").matched == "gpt-4.1-mini"
    assert cost(tokens, "anthropic/claude-sonnet-5-5").matched == "claude-sonnet-5-5"
    assert not cost(tokens, "gpt-5.9").priced  # "gpt-5" does not price a newer "gpt-5.9"
    overridden = cost(tokens, "claude-opus-4-5", {"claude": {"input": 1, "output": 1}})
    assert (overridden.dollars, overridden.matched) == (2.0, "claude")
    unknown = cost(tokens, "mystery-model")
    assert (unknown.dollars, unknown.priced) == (0.0, False)
    with pytest.raises(ValueError, match="needs 'input' and 'output'"):
        AnthropicProposer(api_key="k", pricing={"x": {"inptu": 1}})


def test_code_extraction_edge_cases():
    assert extract_code("```cpp\nint small;\n```\n```c\nint the_longest_block;\n```", truncated=False) \
        == "int the_longest_block;\n"
    assert extract_code("```python\nx = 1\n```", truncated=False) is None
    cut = f"```cuda\n{KERNEL}```\nnow a long explanation that runs out of tok"
    assert extract_code(cut, truncated=True) == KERNEL          # complete block before the cut
    assert extract_code(f"```cuda\n{KERNEL}", truncated=True) is None
    assert extract_code(f"```cuda\n{KERNEL}", truncated=False) == KERNEL  # closing fence forgotten
    assert extract_intent("no intent line here") == "no intent given"


def test_retry_after_header_forms():
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert 0 <= parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) < 1
    assert parse_retry_after({}) is None
    assert RetryPolicy(max_delay_s=5).delay(10, None, __import__("random").Random(0)) <= 5


def test_first_candidate_prompt_on_the_cpu_backend():
    cpu = DeviceInfo("cpu", "AMD EPYC", "x86_64", 16, 80.0)
    prompt = build_prompt(replace(_request("cpu", with_parent=False), device=cpu))
    assert "gcc -O3" in prompt.system and "```c\n" in prompt.system and "cudaStream_t)stream" not in prompt.system
    assert "Write the first candidate" in prompt.task
    assert "AMD EPYC (16 cores, 80 GB/s" in prompt.card


def test_a_long_compile_log_is_cut_in_the_middle():
    log = "error: first problem\n" + "x" * 50_000 + "\nlast line"
    request = _request()
    request = replace(request, parent=replace(request.parent, evaluation=Evaluation(
        Status.COMPILE_ERROR, compile_log=log)))
    task = build_prompt(request).task
    assert "error: first problem" in task and "last line" in task and "characters cut" in task
    assert len(task) < 10_000


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_the_example_kernel_shown_to_the_model_satisfies_the_contract(backend, monkeypatch, tmp_path):
    from kforge.kernels import Kernel, compile_source, find_nvcc

    if backend == "cuda" and find_nvcc() is None:
        pytest.skip("nvcc is not installed")
    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path))
    built = compile_source(example_kernel(backend), backend, "sm_90" if backend == "cuda" else "native")
    if backend == "cuda" and not torch.cuda.is_available():
        return  # compiled against the contract; running it needs a GPU
    device = "cuda" if backend == "cuda" else "cpu"
    x = torch.randn(1000, device=device)
    y = torch.full_like(x, float("nan"))
    Kernel(built.path).launch([x], [y], [0.0])
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(y, torch.relu(x))
