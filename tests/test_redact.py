"""Secrets never reach the store or a prompt: env values, key shapes and the config file's keys."""
from __future__ import annotations

import pytest
import torch

from kforge._redact import redact
from kforge.capture import Card
from kforge.evaluate import Evaluation, Status
from kforge.proposers._base import Usage
from kforge.store import Store

FAKE_ANTHROPIC = "sk-ant-api03-FAKEFAKEFAKE0123456789abcdefXYZ"
FAKE_DB = "correct-horse-battery-staple-42"


@pytest.fixture
def secrets_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_ANTHROPIC)
    monkeypatch.setenv("DB_PASSWORD", FAKE_DB)
    monkeypatch.setenv("SHORT_TOKEN", "abc")          # too short to be told from ordinary words
    config = tmp_path / "config.toml"
    config.write_text('[openai]\napi_key = "cfg-secret-value-0987654321"\nmodel = "gpt-x-mini-2026"\n')
    monkeypatch.setenv("KFORGE_CONFIG", str(config))
    return tmp_path


def test_env_values_key_shapes_and_config_keys_are_removed(secrets_env):
    text = (f"env dump ANTHROPIC_API_KEY={FAKE_ANTHROPIC}\0DB_PASSWORD={FAKE_DB}\n"
            "other sk-proj-AbCdEfGhIjKlMnOpQrStUvWx0123 and AKIAIOSFODNN7EXAMPLE,\n"
            "Authorization: Bearer eyJhbGciOi.JIUzI1NiJ9.payload and ghp_0123456789abcdefghijABCDEFGHIJ012345\n"
            "config cfg-secret-value-0987654321 model gpt-x-mini-2026 short abc")
    out = redact(text)
    for secret in (FAKE_ANTHROPIC, FAKE_DB, "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx0123", "AKIAIOSFODNN7EXAMPLE",
                   "eyJhbGciOi.JIUzI1NiJ9.payload", "ghp_0123456789abcdefghijABCDEFGHIJ012345",
                   "cfg-secret-value-0987654321"):
        assert secret not in out
    assert "[redacted:ANTHROPIC_API_KEY]" in out and "[redacted:DB_PASSWORD]" in out
    assert "[redacted:config]" in out
    # not secrets: a config value under a non-secret key, a short value, ordinary kernel text
    assert "gpt-x-mini-2026" in out and "short abc" in out


def test_ordinary_kernel_text_is_unchanged(secrets_env):
    text = ("kernel.c:12:5: error: 'mask' undeclared\n  float mask-sum = task-skipped_values_here;\n"
            "1.234x over eager (noise margin 2.0%)")
    assert redact(text) == text
    assert redact(None) is None and redact("") == ""


def test_store_write_boundary(secrets_env):
    store = Store(secrets_env / "work")
    card = Card.for_call("relu", torch.randn(4))
    cid = store.add_candidate(card.key, None, "llm", "int x;", intent=f"uses {FAKE_DB}")
    store.set_evaluation(cid, Evaluation(Status.CRASHED, f"crash; env had {FAKE_ANTHROPIC}",
                                         compile_log=f"warning: {FAKE_DB}"))
    call = store.add_llm_call("anthropic", Usage("m"), f"prompt {FAKE_ANTHROPIC}", f"reply {FAKE_DB}",
                              card_key=card.key, error=f"HTTP 401 for key {FAKE_ANTHROPIC}")
    store.save_result(card.key, {"reason": f"leak {FAKE_DB}"})
    store.close()
    raw = b"".join(p.read_bytes() for p in (secrets_env / "work").rglob("*") if p.is_file())
    assert FAKE_ANTHROPIC.encode() not in raw and FAKE_DB.encode() not in raw
    store = Store(secrets_env / "work")
    ev = store.candidate(cid).evaluation
    assert ev.status is Status.CRASHED and "[redacted:ANTHROPIC_API_KEY]" in ev.message
    assert store.llm_calls()[0].id == call and "[redacted:" in store.llm_calls()[0].error


def test_llm_prompt_is_redacted(secrets_env):
    """A crash message quoting a key reaches the next prompt only redacted."""
    from kforge.kernels import DeviceInfo
    from kforge.proposers._base import Attempt, ProposalRequest
    from kforge.proposers._llm import build_prompt

    card = Card.for_call("relu", torch.randn(4))
    parent = Attempt(1, "int x;", "try", Evaluation(Status.CRASHED, f"stderr: ANTHROPIC_API_KEY={FAKE_ANTHROPIC}",
                                                   compile_log=f"note: {FAKE_DB}"))
    prompt = build_prompt(ProposalRequest(card, "cpu", DeviceInfo("cpu", "cpu", "x86_64", 2, 20.0), parent=parent))
    assert FAKE_ANTHROPIC not in prompt.text and FAKE_DB not in prompt.text
    assert "[redacted:ANTHROPIC_API_KEY]" in prompt.text
