"""Altair charts of a session: best candidate timing over iterations, cost per card, time per operator.

Each function returns an ``alt.Chart`` (``chart.save("x.png")`` / ``.svg`` for reports, needs
vl-convert-python). ``live(fn, session)`` shows one that redraws from the run's events and
carries a PNG snapshot, which a saved notebook shows without a kernel. Without network call
``alt.renderers.enable("jupyter", offline=True)`` and ``alt.JupyterChart.enable_offline()`` first (the tutorials
do): else a plain chart asks a CDN for its JavaScript.
"""
from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, Callable

from ._optional import require

if TYPE_CHECKING:
    from ._run import Run
    from ._session import Session


def _alt() -> Any:
    return require("altair")


def _labels(session: "Session") -> dict[str, str]:
    from ._data import short_label

    return {c.key: short_label(c) for c in session.cards}


_INK = "#8c959f"   # NB: a mid grey that reads on JupyterLab's light and dark themes alike


def _themed(chart: Any) -> Any:
    """No background of its own and grey text and rules, so the chart reads in light and dark themes
    (Vega draws into SVG/canvas and cannot use JupyterLab's CSS variables)."""
    return (chart.configure(background="transparent")
            .configure_axis(labelColor=_INK, titleColor=_INK, domainColor=_INK, tickColor=_INK, gridOpacity=0.25)
            .configure_legend(labelColor=_INK, titleColor=_INK, labelLimit=320)
            .configure_title(color=_INK)
            .configure_view(stroke=_INK, strokeOpacity=0.3))


def _no_data(title: str, why: str) -> Any:
    """The chart's place while there is nothing to draw: says so instead of an empty frame."""
    alt, pd = _alt(), require("pandas")
    return alt.Chart(pd.DataFrame({"text": [f"no data yet: {why}"]})).mark_text(
        fontSize=13, color=_INK).encode(text="text:N").properties(title=title, width=420, height=80)


def _int_axis(title: str, largest: int) -> Any:
    """An axis of whole numbers with each tick once (no "1 2 2")."""
    alt = _alt()
    step = max(1, -(-largest // 10))
    return alt.Axis(title=title, values=list(range(1, largest + 1, step)), format="d")


# NB: 20 colours: the default 10 gave two of a 17-card run's lines the same one
_CARDS = {"scheme": "category20"}


def speedup_over_iterations(session: "Session") -> Any:
    """The best candidate's timing so far, per searched card, against the candidates tried on it.

    Candidate timings, labelled as such: a card's own speedup is its verdict's (``session.results``), drawn
    here as a diamond at the end of its line once the card has a winner."""
    alt, pd = _alt(), require("pandas")
    labels = _labels(session)
    rows, best, count = [], {}, {}
    for c in session.store.candidates():
        if c.card_key not in labels:
            continue
        count[c.card_key] = count.get(c.card_key, 0) + 1
        best[c.card_key] = max(best.get(c.card_key, 0.0), c.score)
        rows.append({"card": labels[c.card_key], "iteration": count[c.card_key],
                     "best speedup": best[c.card_key], "status": c.status.value if c.status else "pending"})
    title = "Best candidate timing per card (unconfirmed; ◆ the card's speedup)"
    if not rows:
        return _themed(_no_data(title, "no candidate evaluated"))
    # NB: on a log scale: a ratio's 0.5x and 2x lie as far from eager, and one noisy timing (a rejected candidate
    # read 17x once) no longer flattens every other card's line; a card with no correct candidate yet has no point
    rows = [r for r in rows if r["best speedup"] > 0]
    if not rows:
        return _themed(_no_data(title, "no correct candidate yet"))
    data = pd.DataFrame(rows, columns=["card", "iteration", "best speedup", "status"])
    base = alt.Chart(data).encode(
        x=alt.X("iteration:Q", axis=_int_axis("candidates tried", max(count.values()))),
        y=alt.Y("best speedup:Q", title="best candidate over the judge's eager (×, log scale)",
                scale=alt.Scale(type="log")),
        color=alt.Color("card:N", title="card", scale=alt.Scale(**_CARDS)))
    eager = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[4, 4], color=_INK).encode(y="y:Q")
    chart = base.mark_line(interpolate="step-after") + base.mark_circle(size=40).encode(
        tooltip=["card:N", "iteration:Q", alt.Tooltip("best speedup:Q", format=".2f", title="best candidate"),
                 "status:N"])
    won = [{"card": labels[r.key], "iteration": count.get(r.key, 1), "card speedup": r.winner_speedup}
           for r in session.results.winners if r.key in labels]
    if won:
        chart += alt.Chart(pd.DataFrame(won, columns=["card", "iteration", "card speedup"])).mark_point(
            shape="diamond", size=120, filled=True).encode(
            x="iteration:Q", y="card speedup:Q", color=alt.Color("card:N", title="card", scale=alt.Scale(**_CARDS)),
            tooltip=["card:N", alt.Tooltip("card speedup:Q", format=".2f")])
    return _themed((chart + eager).properties(title=title, width=420, height=240))


def cost_per_card(session: "Session") -> Any:
    """LLM dollars per card (bars) next to the run's cumulative spending over its calls (line)."""
    alt, pd = _alt(), require("pandas")
    labels = _labels(session)
    calls = session.store.llm_calls()
    if not calls:
        return _themed(_no_data("Cost per card", "no LLM call made"))
    per_card: dict[str, float] = {}
    cumulative, total = [], 0.0
    for i, call in enumerate(calls, 1):
        label = labels.get(call.card_key or "", "(no card)")
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
        x=alt.X("call:Q", axis=_int_axis("LLM call", len(calls))),
        y=alt.Y("dollars:Q", title="cumulative US dollars"),
        tooltip=["call:Q", alt.Tooltip("dollars:Q", format="$.4f")]).properties(
        title=f"Cumulative cost (${total:.2f})", width=260, height=180)
    return _themed(alt.hconcat(bars, line))


def time_breakdown(session: "Session", top: int = 12) -> Any:
    """The model's time per operator before (eager) and after (with the winners), largest first."""
    alt, pd = _alt(), require("pandas")
    results = {r.key: r for r in session.results}
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    for card in session.cards:
        r = results.get(card.key)
        speedup = r.winner_speedup if r is not None and r.status.has_winner and r.winner_speedup else 1.0
        # NB: time inside the forward, where a region's card has taken over the calls inside it
        spent = card.forward_us if card.forward_us > 0 else card.total_us * (card.share > 0)
        before[card.op] = before.get(card.op, 0.0) + spent
        after[card.op] = after.get(card.op, 0.0) + spent / speedup
    ops = sorted(before, key=lambda op: -before[op])[:top]
    rows = [{"op": op, "when": when, "time (µs)": t[op]} for op in ops
            for when, t in (("before", before), ("after", after))]
    data = pd.DataFrame(rows, columns=["op", "when", "time (µs)"])
    saved = sum(before.values()) - sum(after.values())
    return _themed(alt.Chart(data).mark_bar().encode(
        y=alt.Y("op:N", sort=ops, title=None),
        yOffset=alt.YOffset("when:N", sort=["before", "after"]),
        x=alt.X("time (µs):Q", title="time per forward (µs, measured inside it)"),
        color=alt.Color("when:N", sort=["before", "after"], title=None,
                        scale=alt.Scale(range=["#8c959f", "#1a7f37"])),
        tooltip=["op:N", "when:N", alt.Tooltip("time (µs):Q", format=".1f")],
    ).properties(title=f"Time per operator, before and after ({saved:.0f} µs saved)", width=420,
                 height=alt.Step(11)))


def png(chart: Any, scale: float = 1.0) -> bytes:
    """The chart as PNG bytes (vl-convert-python)."""
    vlc = require("vl_convert")
    return vlc.vegalite_to_png(chart.to_json(), scale=scale)


def static_images(session: "Session") -> list[str]:
    """The session's charts as ``<img>`` tags with inline PNGs (for static exports)."""
    out = []
    for fn in (speedup_over_iterations, time_breakdown, cost_per_card):
        data = base64.b64encode(png(fn(session))).decode()
        out.append(f'<div><img alt="{fn.__name__}" src="data:image/png;base64,{data}"></div>')
    return out


class LiveChart:
    """A chart that redraws from a run's events (``live(fn, session)``); its output also carries a
    PNG of the drawing, sent again when the run ends, which a saved or shared notebook shows without
    a kernel."""

    def __init__(self, build: Callable[["Session"], Any], session: "Session",
                 run: "Run | None" = None, interval: float = 1.0):
        from ._pump import EventPump

        from ._snapshot import SnapshotDisplay

        alt = _alt()
        self.build, self.session = build, session
        self.widget = alt.JupyterChart(build(session))
        run = run if run is not None else session.run
        self.snapshot = SnapshotDisplay(self._repr_mimebundle_)
        self.pump = EventPump([self.redraw, self.snapshot.apply], interval=interval)
        if run is not None and not run.done:
            self.pump.follow(run)

    def redraw(self, _events: Any = ()) -> None:
        """Rebuild the chart from the store (what a batch of events triggers)."""
        self.widget.chart = self.build(self.session)

    @property
    def chart(self) -> Any:
        return self.widget.chart

    def _ipython_display_(self) -> None:
        """Shown under a display id: the output's PNG is drawn again when the run ends."""
        self.snapshot.show()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        try:
            image = png(self.widget.chart)
        except Exception:  # no vl-convert: the live chart alone
            return bundle
        if isinstance(data, dict):
            data["image/png"] = base64.b64encode(image).decode()
        return bundle


def live(build: Callable[["Session"], Any], session: "Session", run: "Run | None" = None) -> LiveChart:
    """``build(session)`` shown live: redrawn as ``run`` (default: the session's) evaluates candidates."""
    return LiveChart(build, session, run)
