"""The base class of the LLM proposers: a provider module (``_anthropic``, ``_openai``) only says
how to send a :class:`Prompt` and how to read its SDK's reply and errors; everything a user could
notice (settings, retries, the prompt, reading the reply, accounting) is decided once, in this
package's ``_settings``, ``_retries``, ``_prompt`` and ``_reply`` modules, and here.
"""
from __future__ import annotations

import abc
import logging
import os
import random
import time
import warnings
from dataclasses import replace
from typing import Any, Callable, ClassVar, Mapping

from ._base import Proposal, ProposalRequest, ProposerError, Usage
from ._pricing import PriceLike, as_price, cost
from ._prompt import (COMPILE_LOG_CHARS, Prompt, build_prompt, card_prompt, code_language,  # noqa: F401
                      example_kernel, system_prompt, task_prompt, truncate_middle)
from ._reply import CodeBlock, Reply, Stop, code_blocks, extract_code, extract_intent  # noqa: F401
from ._retries import Failure, RetryPolicy, parse_retry_after, status_failure  # noqa: F401
from ._settings import Settings, config_path, load_config  # noqa: F401

log = logging.getLogger("kforge.proposers")

DEFAULT_MAX_TOKENS = 32768   # room for adaptive thinking before the code
DEFAULT_TIMEOUT_S = 600.0


class PricingWarning(UserWarning):
    """An LLM call was recorded at $0 because no price is known for its model."""


class LLMProposer(abc.ABC):
    """Shared behaviour of the LLM proposers: settings, prompt, retries, parsing and accounting.

    Subclasses set ``name``, ``section`` (their config-file table) and ``default_model``, and
    implement ``_connect``, ``_send`` and ``_failure``.
    """

    name: str
    section: ClassVar[str]
    default_model: ClassVar[str | None]
    base_url_env: ClassVar[tuple[str, ...]]

    def __init__(self, model: str | None = None, *, api_key: str | None = None,
                 base_url: str | None = None, max_tokens: int | None = None,
                 timeout_s: float | None = None, max_attempts: int | None = None,
                 max_wait_s: float | None = None, pricing: Mapping[str, PriceLike] | None = None,
                 config: str | os.PathLike | None = None, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None):
        settings = Settings(self.section, config)
        self.base_url: str | None = settings.get("base_url", base_url, self.base_url_env)
        self.model: str | None = settings.get("model", model, ("KFORGE_MODEL",)) or self.default_model
        self.api_key: str | None = self._api_key(settings, api_key)
        self.max_tokens: int = settings.get("max_tokens", max_tokens, ("KFORGE_MAX_TOKENS",), int) \
            or DEFAULT_MAX_TOKENS
        self.timeout_s: float = settings.get("timeout_s", timeout_s, ("KFORGE_TIMEOUT_S",), float) \
            or DEFAULT_TIMEOUT_S
        attempts = settings.get("max_attempts", max_attempts, ("KFORGE_MAX_ATTEMPTS",), int)
        wait = settings.get("max_wait_s", max_wait_s, ("KFORGE_MAX_WAIT_S",), float)
        self.retry = RetryPolicy(attempts or RetryPolicy.max_attempts, max_delay_s=wait or RetryPolicy.max_delay_s)
        if self.max_tokens < 1 or self.timeout_s <= 0 or self.retry.max_attempts < 1:
            raise ValueError("max_tokens and max_attempts must be at least 1 and timeout_s positive; got "
                             f"{self.max_tokens}, {self.retry.max_attempts}, {self.timeout_s}")
        self.pricing: dict[str, PriceLike] = {**settings.pricing, **(pricing or {})}
        for value in self.pricing.values():
            as_price(value)  # fail now, not after the first paid call
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._unpriced_warned: set[str] = set()
        self._client = self._connect()

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"{type(self).__name__}(model={self.model!r}{where})"

    # -- provider hooks

    @abc.abstractmethod
    def _api_key(self, settings: Settings, arg: str | None) -> str | None:
        """The key to send, or raise ProposerError saying how to provide one."""

    @abc.abstractmethod
    def _connect(self) -> Any:
        """The SDK client, with the SDK's own retries off (``max_retries=0``)."""

    @abc.abstractmethod
    def _send(self, prompt: Prompt) -> Reply:
        """One request; SDK exceptions propagate to ``_failure``."""

    @abc.abstractmethod
    def _failure(self, exc: Exception) -> Failure | None:
        """How the retry loop should treat ``exc``; None for an exception that is not the API's."""

    def _is_free(self) -> bool:
        """Whether calls cost nothing when the model has no price (self-hosted endpoints)."""
        return False

    # -- the call

    def propose(self, request: ProposalRequest) -> Proposal:
        prompt = build_prompt(request)
        start = time.perf_counter()
        reply = self._send_with_retries(prompt)
        usage = self._priced(reply.usage, time.perf_counter() - start)
        if reply.stop is Stop.REFUSED:
            raise ProposerError(f"{self.name}: the model declined to answer (refusal); the tokens were "
                                "recorded. Retry, or use another model", usage, prompt.text, reply.text)
        source = extract_code(reply.text, truncated=reply.stop is Stop.TRUNCATED)
        if source is None:
            reason = (f"the reply was cut off at max_tokens={self.max_tokens} before a complete code "
                      "block; raise max_tokens" if reply.stop is Stop.TRUNCATED
                      else "the reply has no C/CUDA code block")
            raise ProposerError(f"{self.name}: {reason}", usage, prompt.text, reply.text)
        return Proposal(source=source, intent=extract_intent(reply.text), usage=usage,
                        prompt=prompt.text, response=reply.text)

    def _send_with_retries(self, prompt: Prompt) -> Reply:
        for attempt in range(1, self.retry.max_attempts + 1):
            try:
                return self._send(prompt)
            except Exception as exc:
                failure = self._failure(exc)
                if failure is None:
                    raise
                if not failure.retryable or attempt == self.retry.max_attempts:
                    tries = f" (gave up after {attempt} attempts)" if failure.retryable else ""
                    raise ProposerError(f"{self.name} ({self.model}): {failure.message}{tries}",
                                        Usage(model=self.model or ""), prompt.text) from exc
                wait = self.retry.delay(attempt, failure.retry_after, self._rng)
                log.warning("%s: %s; retrying in %.1f s (attempt %d of %d)", self.name, failure.message,
                            wait, attempt + 1, self.retry.max_attempts)
                self._sleep(wait)
        raise AssertionError("unreachable: the loop returns or raises")

    def _priced(self, usage: Usage, latency_s: float) -> Usage:
        model = usage.model or self.model or ""
        price = cost(usage, model, self.pricing)
        if not price.priced and not self._is_free() and model not in self._unpriced_warned:
            self._unpriced_warned.add(model)
            warnings.warn(f"kforge has no price for model {model!r}: its calls are recorded at $0. Add "
                          f"[pricing.\"{model}\"] with input/output dollars per million tokens to "
                          f"{config_path()} or pass pricing={{...}}", PricingWarning, stacklevel=3)
        return replace(usage, model=model, dollars=price.dollars, latency_s=latency_s)


def missing_key(provider: str, env: str, section: str) -> ProposerError:
    return ProposerError(
        f"no {provider} API key: set {env}, pass api_key=..., or add api_key under [{section}] in "
        f"{config_path()}. To search without an LLM, use proposer=\"builtin\" (no key needed).")
