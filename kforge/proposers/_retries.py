"""Retries of LLM API calls: which failures are worth another attempt, and how long to wait first."""
from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded attempts with exponential backoff and jitter; a server's retry-after is honoured."""

    max_attempts: int = 4
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0   # cap on any one wait, a server's retry-after included

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay_s)
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
        return ceiling / 2 + rng.uniform(0.0, ceiling / 2)


@dataclass(frozen=True)
class Failure:
    """One failed request as the retry loop sees it."""

    message: str
    retryable: bool
    retry_after: float | None = None


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date), if present."""
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) * scale
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            continue
        return max(0.0, when.timestamp() - time.time())
    return None


def status_failure(status: int, headers: Mapping[str, str], detail: str, key_hint: str) -> Failure:
    """Classify an HTTP error status: 408, 409, 429 and 5xx (529 overloaded included) are retried."""
    retry_after = parse_retry_after(headers)
    if status == 401:
        return Failure(f"the API key was rejected (HTTP 401: {detail}); {key_hint}", False)
    if status == 404:
        return Failure(f"not found (HTTP 404: {detail}); check the model name and base_url", False)
    if status == 413:
        return Failure(f"the prompt is too large (HTTP 413: {detail})", False)
    retryable = status in (408, 409, 429) or status >= 500
    return Failure(f"HTTP {status}: {detail}", retryable, retry_after)
