"""What an LLM call cost: dollars per million tokens by model, matched by longest prefix."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

from ._base import Usage

# NB: list prices checked on PRICES_AS_OF against platform.claude.com/docs (models overview and
# pricing) and OpenAI's pricing page. Prices change; override them with ``pricing=`` or a
# [pricing."<model prefix>"] table in ~/.config/kforge/config.toml rather than editing this file.
PRICES_AS_OF = "2026-11-01"


@dataclass(frozen=True)
class Price:
    """Dollars per million tokens. ``cache_write`` is Anthropic's 5-minute cache write rate."""

    input: float
    output: float
    cache_read: float = 0.0
    cache_write: float = 0.0


# A key prices a model whose name is the key, or the key followed by "-", "@", ":" or "[" (a date,
# a variant): "gpt-5" prices "gpt-5-2025-08-07" but not "gpt-5.5", which stays unpriced.
PRICES: dict[str, Price] = {
    # Anthropic: 5-minute cache writes at 1.25x input.
    "claude-fable-5-1": Price(10.00, 50.00, 0.25, 12.50),
    "claude-mythos-5-1": Price(10.00, 50.00, 0.25, 12.50),
    "claude-fable-5": Price(10.00, 50.00, 1.00, 12.50),
    "claude-mythos-5": Price(10.00, 50.00, 1.00, 12.50),
    "claude-opus-5-5": Price(4.00, 20.00, 0.20, 5.00),
    "claude-opus-5": Price(5.00, 25.00, 0.50, 6.25),
    "claude-opus-4-8": Price(5.00, 25.00, 0.50, 6.25),
    "claude-opus-4-7": Price(5.00, 25.00, 0.50, 6.25),
    "claude-opus-4-6": Price(5.00, 25.00, 0.50, 6.25),
    "claude-opus-4-5": Price(5.00, 25.00, 0.50, 6.25),
    "claude-opus-4": Price(15.00, 75.00, 1.50, 18.75),        # 4 and 4.1
    "claude-sonnet-5-5": Price(2.00, 10.00, 0.10, 2.50),      # cache reads cut to $0.10 on 2026-10-07
    "claude-sonnet-5": Price(2.00, 10.00, 0.20, 2.50),
    "claude-sonnet-4": Price(3.00, 15.00, 0.30, 3.75),        # 4, 4.5, 4.6
    "claude-3-7-sonnet": Price(3.00, 15.00, 0.30, 3.75),
    "claude-haiku-5-5": Price(0.10, 0.50, 0.01, 0.125),       # prompts up to 100k tokens
    "claude-haiku-4-5": Price(1.00, 5.00, 0.10, 1.25),
    "claude-3-5-haiku": Price(0.80, 4.00, 0.08, 1.00),
    "claude-3-haiku": Price(0.25, 1.25, 0.03, 0.30),
    # OpenAI: cached input is billed at the cache-read rate; writing the cache costs nothing extra.
    "gpt-6.1-sol": Price(2.00, 10.00, 0.10),
    "gpt-6-sol": Price(2.00, 10.00, 0.20),
    "gpt-6-luna": Price(0.10, 0.50, 0.01),
    "gpt-5.4": Price(2.50, 15.00, 0.25),
    "gpt-5.4-mini": Price(0.75, 4.50, 0.075),
    "gpt-5.2": Price(1.75, 14.00, 0.175),
    "gpt-5.1": Price(1.25, 10.00, 0.125),
    "gpt-5": Price(1.25, 10.00, 0.125),
    "gpt-5-mini": Price(0.25, 2.00, 0.025),
    "gpt-5-nano": Price(0.05, 0.40, 0.005),
    "gpt-5-pro": Price(15.00, 120.00),
    "gpt-4.1": Price(2.00, 8.00, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    "gpt-4o": Price(2.50, 10.00, 1.25),
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "o4-mini": Price(1.10, 4.40, 0.275),
    "o3": Price(2.00, 8.00, 0.50),
    "o3-mini": Price(1.10, 4.40, 0.55),
    "o3-pro": Price(20.00, 80.00),
    "o1": Price(15.00, 60.00, 7.50),
    "o1-mini": Price(1.10, 4.40, 0.55),
}

PriceLike = Union[Price, Mapping[str, float]]


@dataclass(frozen=True)
class Cost:
    """The dollars of one call, and whether a price was known (``priced`` False means $0 is a guess)."""

    dollars: float
    priced: bool
    matched: str | None = None   # the table or override key that priced the model


def as_price(value: PriceLike) -> Price:
    """A Price from a Price or a mapping with keys input, output[, cache_read, cache_write]."""
    if isinstance(value, Price):
        return value
    unknown = set(value) - {"input", "output", "cache_read", "cache_write"}
    if unknown or "input" not in value or "output" not in value:
        raise ValueError(f"a price needs 'input' and 'output' (dollars per million tokens) and may have "
                         f"'cache_read' and 'cache_write'; got keys {sorted(value)}")
    return Price(float(value["input"]), float(value["output"]), float(value.get("cache_read", 0.0)),
                 float(value.get("cache_write", 0.0)))


def _prices(key: str, model: str) -> bool:
    key = key.lower()
    return model == key or (model.startswith(key) and model[len(key)] in "-@:[")


def _longest_prefix(model: str, table: Mapping[str, PriceLike]) -> str | None:
    hits = [key for key in table if _prices(key, model)]
    return max(hits, key=len) if hits else None


def price_for(model: str, overrides: Mapping[str, PriceLike] | None = None) -> tuple[str, Price] | None:
    """The price of ``model``: the longest matching override key first, then the built-in table."""
    name = model.lower().rsplit("/", 1)[-1]  # "anthropic/claude-..." as routers spell it
    for table in (overrides or {}, PRICES):
        key = _longest_prefix(name, table)
        if key is not None:
            return key, as_price(table[key])
    return None


def cost(usage: Usage, model: str, overrides: Mapping[str, PriceLike] | None = None) -> Cost:
    """Dollars for ``usage``'s tokens under ``model``'s price; an unknown model costs 0, unpriced.

    ``usage.input_tokens`` counts input billed at the full rate, so cache reads and writes are
    not also counted there (Anthropic reports it that way; the OpenAI proposer subtracts).
    """
    found = price_for(model, overrides)
    if found is None:
        return Cost(0.0, priced=False)
    key, p = found
    dollars = (usage.input_tokens * p.input + usage.output_tokens * p.output
               + usage.cache_read_tokens * p.cache_read + usage.cache_write_tokens * p.cache_write) / 1e6
    return Cost(dollars, priced=True, matched=key)
