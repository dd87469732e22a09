"""Claude through the official ``anthropic`` SDK (Messages API), with prompt caching."""
from __future__ import annotations

from typing import Any

from ._base import Usage
from ._llm import Failure, LLMProposer, Prompt, Reply, Settings, Stop, missing_key, status_failure

_STOPS = {"max_tokens": Stop.TRUNCATED, "model_context_window_exceeded": Stop.TRUNCATED,
          "refusal": Stop.REFUSED}


class AnthropicProposer(LLMProposer):
    """Asks Claude for each revision.

    Settings come from the arguments, then the environment (``ANTHROPIC_API_KEY``,
    ``ANTHROPIC_BASE_URL``, ``KFORGE_MODEL``, ``KFORGE_MAX_TOKENS``, ``KFORGE_TIMEOUT_S``,
    ``KFORGE_MAX_ATTEMPTS``, ``KFORGE_MAX_WAIT_S``), then ``[anthropic]`` in the config file.
    The contract and the card description are sent as cached prefix blocks, so repeated calls
    on one card pay the cache-read rate for them.
    """

    name = "anthropic"
    section = "anthropic"
    default_model = "claude-sonnet-5-5"
    base_url_env = ("ANTHROPIC_BASE_URL",)

    def _api_key(self, settings: Settings, arg: str | None) -> str:
        key = settings.get("api_key", arg, ("ANTHROPIC_API_KEY",))
        if not key:
            raise missing_key("Anthropic", "ANTHROPIC_API_KEY", self.section)
        return key

    def _connect(self) -> Any:
        try:
            import anthropic
        except ImportError:
            raise ImportError("install kforge[llm] (or `pip install anthropic`) to use the Anthropic "
                              "proposer, or use proposer=\"builtin\"") from None
        self._sdk = anthropic
        # NB: the SDK's own retries are off so that RetryPolicy alone decides (and tests can see it).
        return anthropic.Anthropic(api_key=self.api_key, base_url=self.base_url, max_retries=0,
                                   timeout=self.timeout_s)

    def _send(self, prompt: Prompt) -> Reply:
        cached = {"type": "ephemeral"}
        message = self._client.messages.create(
            model=self.model,
            max_tokens=self.max_tokens,
            system=[{"type": "text", "text": prompt.system, "cache_control": cached}],
            messages=[{"role": "user", "content": [
                {"type": "text", "text": prompt.card, "cache_control": cached},
                {"type": "text", "text": prompt.task},
            ]}],
        )
        text = "".join(block.text for block in message.content if block.type == "text")
        u = message.usage
        usage = Usage(model=message.model or self.model, input_tokens=u.input_tokens,
                      output_tokens=u.output_tokens, cache_read_tokens=u.cache_read_input_tokens or 0,
                      cache_write_tokens=u.cache_creation_input_tokens or 0)
        return Reply(text, _STOPS.get(message.stop_reason or "", Stop.COMPLETE), usage)

    def _failure(self, exc: Exception) -> Failure | None:
        sdk = self._sdk
        if isinstance(exc, sdk.APITimeoutError):
            return Failure(f"no answer within {self.timeout_s:g} s", retryable=True)
        if isinstance(exc, sdk.APIConnectionError):
            return Failure(f"could not reach {self.base_url or 'api.anthropic.com'}: {exc}", retryable=True)
        if isinstance(exc, sdk.APIStatusError):
            detail = ": ".join(x for x in (exc.type, exc.api_message) if x) or exc.message
            return status_failure(exc.status_code, exc.response.headers, detail,
                                  "check ANTHROPIC_API_KEY or the api_key you passed")
        return None
