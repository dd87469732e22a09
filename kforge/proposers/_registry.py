"""Turning what a user writes (``proposer="anthropic:claude-sonnet-4-5"``) into a Proposer."""
from __future__ import annotations

from typing import Any

from ._base import Proposer

_FORMS = ('"builtin", "anthropic", "anthropic:<model>", "openai", "openai:<model>", '
          '"local:<base url>" (an OpenAI-compatible server such as vLLM, llama.cpp or Ollama), '
          'or a Proposer object')


def make_proposer(name_or_obj: str | Proposer, **options: Any) -> Proposer:
    """The proposer named by ``name_or_obj``; ``options`` go to its constructor.

    "builtin" needs no network and no key. "anthropic[:model]" and "openai[:model]" use those
    APIs; "local[:base_url]" uses an OpenAI-compatible server (no key needed). A Proposer object
    is returned as it is.
    """
    if not isinstance(name_or_obj, str):
        if not isinstance(name_or_obj, Proposer):
            raise TypeError(f"expected a proposer name or object, got {type(name_or_obj).__name__}; "
                            f"use {_FORMS}")
        if options:
            raise TypeError(f"options {sorted(options)} apply to a proposer made by name, not to an "
                            f"existing {type(name_or_obj).__name__}")
        return name_or_obj
    kind, _, rest = name_or_obj.strip().partition(":")
    kind = kind.lower()
    if kind == "builtin" and not rest:
        from .builtin import BuiltinProposer

        return BuiltinProposer(**options)
    if kind == "anthropic":
        from ._anthropic import AnthropicProposer

        return AnthropicProposer(**_with(options, "model", rest))
    if kind == "openai":
        from ._openai import OpenAIProposer

        return OpenAIProposer(**_with(options, "model", rest))
    if kind == "local":
        from ._llm import Settings
        from ._openai import OpenAIProposer

        options = _with(options, "base_url", rest)
        found = Settings(OpenAIProposer.section, options.get("config")).get(
            "base_url", options.get("base_url"), OpenAIProposer.base_url_env)
        if not found:
            raise ValueError(f"proposer {name_or_obj!r} needs the base URL of an OpenAI-compatible server, "
                             'e.g. "local:http://127.0.0.1:8000/v1", or KFORGE_BASE_URL set')
        return OpenAIProposer(**{"self_hosted": True, **options, "base_url": found})
    raise ValueError(f"unknown proposer {name_or_obj!r}; use {_FORMS}")


def _with(options: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    if not value:
        return options
    if options.get(key) not in (None, value):
        raise ValueError(f"{key} is given twice: {value!r} in the name and {options[key]!r} as an option")
    return {**options, key: value}
