"""OpenAI, and any server that speaks its Chat Completions API (vLLM, llama.cpp, Ollama, ...),
through the official ``openai`` SDK."""
from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from ._base import ProposerError, Usage
from ._llm import Failure, LLMProposer, Prompt, Reply, Settings, Stop, missing_key, status_failure

_STOPS = {"length": Stop.TRUNCATED, "content_filter": Stop.REFUSED}
_NO_KEY = "kforge-no-key"   # NB: the SDK insists on a key; self-hosted servers ignore it


class OpenAIProposer(LLMProposer):
    """Asks an OpenAI model, or a model behind any OpenAI-compatible ``base_url``, for each revision.

    With OpenAI's own endpoint (no ``base_url``) the key comes from the argument,
    ``OPENAI_API_KEY`` or ``[openai]`` in the config file, and is required. Any other endpoint is
    treated as self-hosted (``name == "local"``): the key is optional (argument, ``KFORGE_API_KEY``
    or the config file; OPENAI_API_KEY is never sent there), an unpriced model costs $0 without a
    warning, and without a model the first one the server lists is used. The base URL comes from
    the argument, ``KFORGE_BASE_URL``, ``OPENAI_BASE_URL`` or the config file.

    ``self_hosted`` overrides that guess from the URL: False for a gateway in front of OpenAI's
    own models (key required, OpenAI prices), True for a self-hosted server on an openai.com name.
    The other options are those of every LLM proposer (see docs/proposers.md).
    """

    section = "openai"
    base_url_env = ("KFORGE_BASE_URL", "OPENAI_BASE_URL")

    def __init__(self, model: str | None = None, *, self_hosted: bool | None = None, **options: Any):
        self._self_hosted = self_hosted
        super().__init__(model, **options)

    @property
    def name(self) -> str:  # type: ignore[override]
        return "openai" if self._official else "local"

    @property
    def default_model(self) -> str | None:  # type: ignore[override]
        return "gpt-6.1-sol" if self._official else None

    @property
    def _official(self) -> bool:
        if self._self_hosted is not None:
            return not self._self_hosted
        host = (urlparse(self.base_url).hostname or "") if self.base_url else "api.openai.com"
        return host == "openai.com" or host.endswith(".openai.com")

    def _api_key(self, settings: Settings, arg: str | None) -> str:
        if self._official:
            key = settings.get("api_key", arg, ("OPENAI_API_KEY",))
            if not key:
                raise missing_key("OpenAI", "OPENAI_API_KEY", self.section)
            return key
        return settings.get("api_key", arg, ("KFORGE_API_KEY",)) or _NO_KEY

    def _is_free(self) -> bool:
        return not self._official

    def _connect(self) -> Any:
        try:
            import openai
        except ImportError:
            raise ImportError("install kforge[llm] (or `pip install openai`) to use the OpenAI proposer, "
                              "or use proposer=\"builtin\"") from None
        self._sdk = openai
        # NB: the SDK's own retries are off so that RetryPolicy alone decides (and tests can see it).
        return openai.OpenAI(api_key=self.api_key, base_url=self.base_url, max_retries=0,
                             timeout=self.timeout_s)

    def _served_model(self) -> str:
        models = list(self._client.models.list())
        if not models:
            raise ProposerError(f"the server at {self.base_url} lists no models; pass model=...")
        return models[0].id

    def _send(self, prompt: Prompt) -> Reply:
        if self.model is None:
            self.model = self._served_model()
        # NB: OpenAI's newer models take only max_completion_tokens; self-hosted servers all know
        # max_tokens, not all know the newer name.
        limit = {"max_completion_tokens" if self._official else "max_tokens": self.max_tokens}
        response = self._client.chat.completions.create(
            model=self.model,
            messages=[{"role": "system", "content": prompt.system},
                      {"role": "user", "content": f"{prompt.card}\n\n{prompt.task}"}],
            **limit,
        )
        choice = response.choices[0]
        text = choice.message.content or ""
        stop = _STOPS.get(choice.finish_reason or "", Stop.COMPLETE)
        if choice.message.refusal:
            text, stop = text or choice.message.refusal, Stop.REFUSED
        u = response.usage
        details = getattr(u, "prompt_tokens_details", None)
        cached = (details.cached_tokens or 0) if details is not None else 0
        usage = Usage(model=response.model or self.model,
                      input_tokens=(u.prompt_tokens - cached) if u else 0,
                      output_tokens=u.completion_tokens if u else 0, cache_read_tokens=cached)
        return Reply(text, stop, usage)

    def _failure(self, exc: Exception) -> Failure | None:
        sdk = self._sdk
        if isinstance(exc, sdk.APITimeoutError):
            return Failure(f"no answer within {self.timeout_s:g} s", retryable=True)
        if isinstance(exc, sdk.APIConnectionError):
            return Failure(f"could not reach {self.base_url or 'api.openai.com'}: {exc}", retryable=True)
        if isinstance(exc, sdk.APIStatusError):
            body = exc.body if isinstance(exc.body, dict) else {}
            detail = ": ".join(str(x) for x in (body.get("type"), body.get("message")) if x) or exc.message
            hint = ("check OPENAI_API_KEY or the api_key you passed" if self._official
                    else "pass api_key=... or set KFORGE_API_KEY for this server")
            return status_failure(exc.status_code, exc.response.headers, detail, hint)
        return None
