"""Altair charts of a session: best speedup over iterations, cost per card, time per operator.

Each function returns an ``alt.Chart``: display it live, or ``chart.save("x.png")`` / ``.svg``
for reports (needs vl-convert-python). Without network call ``alt.JupyterChart.enable_offline()``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._optional import require

if TYPE_CHECKING:
    from ..session import Session


def _alt() -> Any:
    return require("altair")


def _label(op: str, key: str) -> str:
    return f"{op} [{key[:6]}]"


def speedup_over_iterations(session: "Session") -> Any:
    """Best correct speedup so far, per searched card, against the candidates tried on it."""
    alt, pd = _alt(), require("pandas")
    ops = {c.key: c.op for c in session.cards}
    rows, best, count = [], {}, {}
    for c in session.store.candidates():
        if c.card_key not in ops:
            continue
        count[c.card_key] = count.get(c.card_key, 0) + 1
        best[c.card_key] = max(best.get(c.card_key, 0.0), c.speedup)
        rows.append({"card": _label(ops[c.card_key], c.card_key), "iteration": count[c.card_key],
                     "best speedup": best[c.card_key], "status": c.status.value if c.status else "pending"})
    data = pd.DataFrame(rows, columns=["card", "iteration", "best speedup", "status:N"])
    base = alt.Chart(data).encode(
        x=alt.X("iteration:Q", title="candidates tried", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("best speedup:Q", title="best speedup over eager (×)"),
        color=alt.Color("card:N", title="card"))
    eager = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[4, 4], color="#8c959f").encode(y="y:Q")
    chart = base.mark_line(interpolate="step-after") + base.mark_circle(size=40).encode(
        tooltip=["card:N", "iteration:Q", alt.Tooltip("best speedup:Q", format=".2f"), "status:N"])
    return (chart + eager).properties(title="Best speedup per card", width=420, height=240)


def cost_per_card(session: "Session") -> Any:
    """LLM dollars per card (bars) next to the run's cumulative spending over its calls (line)."""
    alt, pd = _alt(), require("pandas")
    ops = {c.key: c.op for c in session.cards}
    calls = session.store.llm_calls()
    per_card: dict[str, float] = {}
    cumulative, total = [], 0.0
    for i, call in enumerate(calls, 1):
        label = _label(ops.get(call.card_key or "", "?"), call.card_key or "------")
        per_card[label] = per_card.get(label, 0.0) + call.usage.dollars
        total += call.usage.dollars
        cumulative.append({"call": i, "dollars": total})
    bars = alt.Chart(pd.DataFrame([{"card": k, "dollars": v} for k, v in per_card.items()],
                                  columns=["card", "dollars"])).mark_bar(color="#0969da").encode(
        x=alt.X("dollars:Q", title="US dollars"), y=alt.Y("card:N", sort="-x", title=None),
        tooltip=["card:N", alt.Tooltip("dollars:Q", format="$.4f")]).properties(
        title="Cost per card", width=260, height=alt.Step(22))
    line = alt.Chart(pd.DataFrame(cumulative, columns=["call", "dollars"])).mark_line(
        color="#8250df", point=True).encode(
        x=alt.X("call:Q", title="LLM call", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("dollars:Q", title="cumulative US dollars"),
        tooltip=["call:Q", alt.Tooltip("dollars:Q", format="$.4f")]).properties(
        title=f"Cumulative cost (${total:.2f})", width=260, height=180)
    return alt.hconcat(bars, line)


def time_breakdown(session: "Session", top: int = 12) -> Any:
    """The model's time per operator before (eager) and after (with the winners), largest first."""
    alt, pd = _alt(), require("pandas")
    results = {r.key: r for r in session.results}
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    for card in session.cards:
        r = results.get(card.key)
        speedup = r.speedup if r is not None and r.status.has_winner and r.speedup > 0 else 1.0
        before[card.op] = before.get(card.op, 0.0) + card.total_us
        after[card.op] = after.get(card.op, 0.0) + card.total_us / speedup
    ops = sorted(before, key=lambda op: -before[op])[:top]
    rows = [{"op": op, "when": when, "time (µs)": t[op]} for op in ops
            for when, t in (("before", before), ("after", after))]
    data = pd.DataFrame(rows, columns=["op", "when", "time (µs)"])
    saved = sum(before.values()) - sum(after.values())
    return alt.Chart(data).mark_bar().encode(
        y=alt.Y("op:N", sort=ops, title=None),
        yOffset=alt.YOffset("when:N", sort=["before", "after"]),
        x=alt.X("time (µs):Q", title="time per forward (µs, captured operators)"),
        color=alt.Color("when:N", sort=["before", "after"], title=None,
                        scale=alt.Scale(range=["#8c959f", "#1a7f37"])),
        tooltip=["op:N", "when:N", alt.Tooltip("time (µs):Q", format=".1f")],
    ).properties(title=f"Time per operator, before and after ({saved:.0f} µs saved)", width=420,
                 height=alt.Step(11))
