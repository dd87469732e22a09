"""Operator cards: one per variant the model actually ran."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator, Mapping, Sequence

from ._registry import Variant, get_spec


@dataclass(frozen=True)
class Card:
    """One operator variant as the model ran it: how often, how long, and what share of the time."""

    variant: Variant
    calls: int
    eager_us: float            # one call replayed alone in the capturing process (not the judge's eager time,
                               # which is the search's baseline and lives in the card's verdict)
    share: float               # forward_us over the model's forward: what the model spends here
    vendor: str | None
    examples: int = 0          # examples stored on disk
    eager_spread: float = 0.0  # robust spread (1.4826 MAD / median) of the eager timing
    noisy: bool = False        # a timing of this card was too noisy to trust (see kforge.timing)
    forward_us: float = 0.0    # all its calls, timed inside the model's own warm forward (mean of several, outliers out)
    inductor_us: float | None = None  # regions: Inductor's kernel for the same region, compiled alone

    @property
    def key(self) -> str:
        return self.variant.key

    @property
    def op(self) -> str:
        return self.variant.op

    @property
    def signature(self) -> str:
        return self.variant.signature

    @property
    def in_model_us(self) -> float:
        """One call's time inside the model's forward (capture's), 0 where the forward was not timed."""
        return self.forward_us / self.calls if self.calls and self.forward_us > 0 else 0.0

    @property
    def total_us(self) -> float:
        return self.calls * self.eager_us

    @property
    def kind(self) -> str:
        return get_spec(self.op).kind

    @classmethod
    def for_call(cls, op: str, *args, calls: int = 1, eager_us: float = 1.0, share: float = 1.0, **kwargs) -> "Card":
        """A card for one call of ``op`` on these arguments, without a model (tests, benchmarks)."""
        spec = get_spec(op)
        call = spec.bind(*args, **kwargs)
        out = spec.reference(call.inputs, call.params)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return cls(spec.variant(call, outs), calls, eager_us, share, spec.vendor)

    def with_share(self, share: float) -> "Card":
        return replace(self, share=share)

    def roofline_us(self, bandwidth_gbs: float) -> float:
        """Time to move the variant's bytes once at ``bandwidth_gbs``."""
        return self.variant.io_bytes / (bandwidth_gbs * 1e9) * 1e6

    def to_json(self) -> dict:
        return {"variant": self.variant.to_json(), "calls": self.calls, "eager_us": self.eager_us,
                "share": self.share, "vendor": self.vendor, "examples": self.examples,
                "eager_spread": self.eager_spread, "noisy": self.noisy, "forward_us": self.forward_us,
                "inductor_us": self.inductor_us}

    @classmethod
    def from_json(cls, d: dict) -> "Card":
        return cls(Variant.from_json(d["variant"]), d["calls"], d["eager_us"], d["share"], d["vendor"],
                   d.get("examples", 0), d.get("eager_spread", 0.0), d.get("noisy", False), d.get("forward_us", 0.0),
                   d.get("inductor_us"))


@dataclass(frozen=True)
class Cards(Sequence[Card]):
    """The cards of one capture, sorted by share (largest first)."""

    items: tuple[Card, ...] = ()
    model_us: float | None = None     # the model's own eager forward time, per batch set
    uncaptured: tuple[tuple[str, int], ...] = field(default=())  # unsupported calls seen: (name, count)
    threads: int | None = None        # CPU: intra-op threads the capture measured with (this process only)
    outside: tuple[tuple[str, int], ...] = field(default=())  # computing calls no kforge operator covers
    model_noisy: bool = False         # the forward's own timing was too noisy to trust (this process only)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, str):
            for c in self.items:
                if c.key == i or c.key.startswith(i):
                    return c
            raise KeyError(f"no card with key {i!r}")
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Card]:
        return iter(self.items)

    @property
    def captured_us(self) -> float:
        """Time the captured operators take inside one forward (measured there, not replayed)."""
        return sum(c.forward_us for c in self.items)

    @property
    def coverage(self) -> float | None:
        """Share of the model's forward spent in captured operators (what kforge can reach), at most 1."""
        if not self.model_us:
            return None
        return min(1.0, sum(c.share for c in self.items))

    @property
    def noisy(self) -> list[Card]:
        """Cards whose timings were too noisy to trust."""
        return [c for c in self.items if c.noisy]

    def by_op(self, op: str) -> list[Card]:
        return [c for c in self.items if c.op == op]

    def to_frame(self):
        import pandas as pd

        def ops(c: Card) -> str:
            spec = get_spec(c.op)
            return ",".join(spec.ops_of(c.variant)) if hasattr(spec, "ops_of") else c.op

        from ._family import found_in_graph

        rows = [{"key": c.key, "kind": "region" if found_in_graph(c.op) else "op", "op": c.op, "ops": ops(c),
                 "signature": c.signature, "calls": c.calls, "eager_us": c.eager_us, "total_us": c.total_us,
                 "share": c.share, "vendor": c.vendor or "", "examples": c.examples, "forward_us": c.forward_us,
                 "eager_spread": c.eager_spread, "noisy": c.noisy, "inductor_us": c.inductor_us}
                for c in self.items]
        cols = ["key", "kind", "op", "ops", "signature", "calls", "eager_us", "total_us", "share", "vendor",
                "examples", "forward_us", "eager_spread", "noisy", "inductor_us"]
        return pd.DataFrame(rows, columns=cols)

    def table(self, limit: int | None = None, judge_eager_us: Mapping[str, float | None] | None = None) -> str:
        """One line per card. ``judge_eager_us`` (card key -> us, from the verdicts) adds the judge's eager
        time, the baseline the search timed speedups against."""
        judged = judge_eager_us is not None

        def us(x: float | None, width: int) -> str:
            return f"{x:{width}.2f}" if x else f"{'-':>{width}}"

        lines = [f"{'share':>6}  {'calls':>5}  {'in model us':>11}  {'replayed us':>11}  "
                 + (f"{'eager us (judge)':>16}  " if judged else "") + f"{'vendor':<6}  signature"]
        for c in self.items[:limit]:
            in_model = c.forward_us / c.calls if c.calls and c.forward_us > 0 else None
            judge = f"{us(judge_eager_us.get(c.key), 16)}  " if judged else ""
            lines.append(f"{c.share * 100:5.1f}%  {c.calls:5d}  {us(in_model, 11)}  {c.eager_us:11.2f}"
                         f"{'?' if c.noisy else ' '} {judge}{(c.vendor or '-'):<6}  {c.signature}")
        if self.coverage is not None:
            lines.append(f"captured operators: {self.coverage * 100:.0f}% of the model's {self.model_us:.0f} us "
                         "forward (share and in model us: measured inside the forward; replayed us: one call "
                         "replayed alone in this process)")
        lines.append("speedups are taken against the judge's eager time (eager us (judge): timed beside each "
                     "candidate in the evaluator), not against these capture figures"
                     + ("" if judged else "; the results table shows it once a card is searched"))
        from ._family import found_in_graph

        if any(found_in_graph(c.op) for c in self.items) and any(not found_in_graph(c.op) and c.share == 0
                                                                  for c in self.items):
            lines.append("share 0.0%: calls that lie inside region cards, whose time counts there; still searched, "
                         "for eager mode, where region kernels do not run (they run in compiled graphs)")
        if self.noisy:
            lines.append(f"warning: {len(self.noisy)} timing(s) marked '?' were too noisy to trust (a busy "
                         "machine?): capture again when it is quieter")
        if self.uncaptured:
            lines.append("not captured (call forms or dtypes kforge does not cover): "
                         + ", ".join(f"{n} x{k}" for n, k in self.uncaptured))
        if self.outside:
            lines.append("outside kforge's operators (run eagerly, not searched): "
                         + ", ".join(f"{n} x{k}" for n, k in self.outside))
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.table())
