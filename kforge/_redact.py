"""Secrets scrubbed from text before kforge stores it or sends it to an LLM.

A candidate can get text into the store (its compile log, its crash message, its stderr) and,
from there, into the next prompt. ``redact`` removes what would hurt there: the values of
environment variables whose names say they are secret, strings shaped like known API keys and
tokens, and every secret-looking value of kforge's config file. Replaced by ``[redacted:WHAT]``.

Not caught: a secret transformed before it is printed (encoded, reversed, split over lines), or
one that matches no shape and lives in neither the environment nor the config file; the runner's
sandbox (no API keys in its environment) is what keeps those out.
"""
from __future__ import annotations

import os
import re
from typing import Any, Iterable

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|PRIVATE|SESSION|COOKIE", re.IGNORECASE)
_MIN_VALUE = 8    # shorter values ("1", "true") would redact ordinary words

_SHAPES: tuple[tuple[str, re.Pattern], ...] = (
    ("anthropic-key", re.compile(r"(?<![A-Za-z0-9])sk-ant-[A-Za-z0-9_\-]{8,}")),
    ("openai-key", re.compile(r"(?<![A-Za-z0-9])sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{16,}")),
    ("bearer-token", re.compile(r"(?i)(?<=bearer )[A-Za-z0-9._~+/=\-]{12,}")),
    ("aws-access-key", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b")),
    ("aws-secret", re.compile(r"(?i)(?<=aws_secret_access_key)[\s\"':=]+[A-Za-z0-9/+=]{30,}")),
    ("github-token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("google-key", re.compile(r"\bAIza[0-9A-Za-z_\-]{30,}")),
    ("huggingface-token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("slack-token", re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}")),
    ("private-key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)")),
)

_config_cache: dict[str, tuple[float, tuple[str, ...]]] = {}


def _config_secrets() -> tuple[str, ...]:
    """Secret-looking values of kforge's config file (keys named like KEY/TOKEN/SECRET, any table)."""
    try:
        from .proposers._llm import config_path

        path = config_path()
        mtime = path.stat().st_mtime
    except (OSError, ImportError):
        return ()
    cached = _config_cache.get(str(path))
    if cached and cached[0] == mtime:
        return cached[1]
    try:
        import tomllib

        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, ValueError):
        return ()
    found = tuple(v for k, v in _walk(data) if SECRET_NAME.search(k) and len(v) >= _MIN_VALUE)
    _config_cache[str(path)] = (mtime, found)
    return found


def _walk(obj: Any, key: str = "") -> Iterable[tuple[str, str]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, str(k))
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _walk(v, key)
    elif isinstance(obj, str):
        yield key, obj


def secret_values() -> dict[str, str]:
    """Secret value -> what to call it: the environment's and the config file's."""
    out: dict[str, str] = {}
    for name, value in os.environ.items():
        if SECRET_NAME.search(name) and len(value) >= _MIN_VALUE:
            out[value] = name
    for value in _config_secrets():
        out.setdefault(value, "config")
    return out


def redact(text: str | None) -> str | None:
    """``text`` with every secret replaced by ``[redacted:WHAT]`` (None stays None)."""
    if not text:
        return text
    values = secret_values()
    # NB: longest first, so a secret that contains another is replaced whole.
    for value in sorted(values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, f"[redacted:{values[value]}]")
    for what, pattern in _SHAPES:
        text = pattern.sub(f"[redacted:{what}]", text)
    return text
