"""Static HTML renderings of the views: what a saved or shared notebook shows without a kernel.

Plain tables, lists and ``<pre>``, inline styles only, no script and no SVG, so they survive the
sanitizer of an untrusted notebook and render in nbconvert, nbviewer and GitHub. Colours come from
JupyterLab's theme variables with light fallbacks.
"""
from __future__ import annotations

import time
from html import escape
from typing import Any, Sequence

FG = "var(--jp-ui-font-color1, #1f2328)"
MUTED = "var(--jp-ui-font-color2, #656d76)"
BORDER = "var(--jp-border-color2, #d0d7de)"
STATUS_COLORS = {
    "faster": "#1a7f37", "winner": "#1a7f37", "no_gain": "#6e7781", "eager": "#6e7781", "slower": "#bf8700",
    "noisy": "#bf8700", "wrong_result": "#cf222e", "compile_error": "#8250df", "launch_error": "#bc4c00", "crashed": "#a40e26",
    "timed_out": "#953800", "pending": "#8c959f", "searching": "#0969da", "not searched": "#8c959f",
    "finished": "#1a7f37", "stopped": "#bf8700", "failed": "#cf222e", "running": "#0969da", "paused": "#bf8700",
}
SOURCE_LINES = 40
BOX = f"font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: 12.5px; color: {FG}; " \
      f"border: 1px solid {BORDER}; border-radius: 6px; padding: 8px 12px; margin: 4px 0"


def _status(status: str) -> str:
    color = STATUS_COLORS.get(status, "#6e7781")
    return f'<span style="color: {color}; font-weight: 600">{escape(status.replace("_", " "))}</span>'


def _x(v: float | None) -> str:
    return "–" if not v else f"{v:.2f}×"


def _us(v: float | None) -> str:
    return "–" if v is None else f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.1f} µs"


def _breakable(text: str) -> str:
    """``text`` escaped, with a zero-width space after each comma: a sanitizer may drop
    ``overflow-wrap``, and a region's label ("region(add,pow,mean,...)") has no other place to break."""
    return escape(text).replace(",", ",\u200b")


def _box(kind: str, title: str, body: str) -> str:
    return (f'<div class="kf-static kf-static-{kind}" style="{BOX}"><div style="font-weight: 600; margin-bottom: 6px">'
            f'{escape(title)}</div>{body}</div>')


def card_table(rows: Sequence[dict[str, Any]], selected: str = "", limit: int = 40) -> str:
    """The card table, largest share first; a summary line says what is left out.

    NB: an untrusted notebook's sanitizer may drop overflow styles, so the table must fit a narrow
    output (a 1024 px window beside JupyterLab's side bar leaves about 600 px): five columns, the
    card's label wraps, and its eager times, calls and cost go on a muted line under it.

    The speedup column is the card's (its verdict's); a card without a winner shows its best candidate
    there only as "cand." (an unconfirmed candidate timing), muted."""
    columns = (("card", "left"), ("speedup", "right"), ("status", "left"), ("share", "right"), ("tried", "right"))
    # NB: 5 px between the narrow columns: at 1024 px beside the side bar, 8 px ran the table 15 px out of its box
    th = "".join(f'<th style="text-align: {a}; padding: 2px 5px; color: {MUTED}">{n}</th>' for n, a in columns)
    body = []
    shown = sorted(rows, key=lambda r: -r["share"])[:limit]
    for r in shown:
        mark = "font-weight: 600; " if r["key"] == selected else ""
        speed = _x(r["winner_speedup"]) if r["winner_speedup"] else (
            f'<span style="color: {MUTED}" title="best candidate, unconfirmed: not the card\'s speedup">cand. '
            f'{_x(r["best_candidate"])}</span>' if r["best_candidate"] else "–")
        cells = [speed, _status(r["status"]), f"{r['share']:.1%}", str(r["candidates"] or "–")]
        facts = [f"eager (judge) {_us(r['judge_eager_us'])}", f"in model {_us(r['in_model_us'] or None)}",
                 f"{r['calls']} call{'s' * (r['calls'] != 1)}"]
        if r["dollars"]:
            facts.append(f"${r['dollars']:.3f}")
        label = (f'<td style="{mark}text-align: left; padding: 2px 8px; overflow-wrap: anywhere">{_breakable(r["label"])}'
                 f'<div style="color: {MUTED}; font-weight: 400; font-size: 11.5px">{" · ".join(facts)}</div></td>')
        body.append("<tr>" + label + "".join(
            f'<td style="{mark}text-align: {a}; padding: 2px 5px; white-space: nowrap; vertical-align: top">{c}</td>'
            for c, (_, a) in zip(cells, columns[1:])) + "</tr>")
    searched = sum(1 for r in rows if r["status"] != "not searched")
    winners = sum(1 for r in rows if r["status"] == "winner")
    more = f" (largest {limit} shown)" if len(rows) > limit else ""
    summary = f'<div style="color: {MUTED}; margin-top: 4px">{len(rows)} cards · {searched} searched · ' \
              f'{winners} with a winner{more}</div>'
    table = f'<table style="border-collapse: collapse"><thead><tr>{th}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    return _box("card-table", "Operator cards", table + summary)


def search_tree(nodes: Sequence[dict[str, Any]], best: Sequence[int], selected: int | None, label: str) -> str:
    """The search tree as an indented list: each candidate's status and speedup, the best path in bold."""
    if not nodes:
        return _box("search-tree", f"Search tree · {label}", f'<div style="color: {MUTED}">No candidates for this card.</div>')
    kids: dict[Any, list[dict[str, Any]]] = {}
    known = {n["id"] for n in nodes}
    for n in nodes:
        kids.setdefault(n["parent"] if n["parent"] in known else None, []).append(n)
    on_best, lines = set(best), []

    def walk(parent: Any, depth: int) -> None:
        for n in kids.get(parent, []):
            weight = "font-weight: 600; " if n["id"] in on_best else ""
            mark = " ◀ shown" if n["id"] == selected else ""
            speed = f" {n['score']:.2f}×" if n["score"] > 0 else ""
            speed += " (the card's winner)" if n.get("winner") else ""
            # NB: wrapped, with a hanging indent: a long intent must not run out of a narrow output
            lines.append(f'<div style="{weight}padding-left: {depth * 16 + 16}px; text-indent: -16px; '
                         f'overflow-wrap: anywhere">#{n["id"]} '
                         f'{_status(n["status"])}{speed} <span style="color: {MUTED}">{escape(n["strategy"])} · '
                         f'{escape(n["intent"][:80])}</span>{mark}</div>')
            walk(n["id"], depth + 1)
    walk(None, 0)
    if any(n.get("winner") for n in nodes):
        note = "bold: the path to the card's winner"
    elif best:
        note = "bold: the path to the fastest candidate (candidate timings, unconfirmed: the card has no winner)"
    else:
        note = "no candidate beat eager"
    return _box("search-tree", f"Search tree · {label}", "".join(lines) +
                f'<div style="color: {MUTED}; margin-top: 4px">{len(nodes)} candidates · {note} · '
                "×: each candidate's own timings over the judge's eager</div>")


def source_view(detail: dict[str, Any] | None) -> str:
    """One candidate: verdict, intent and source."""
    if not detail:
        return _box("source-view", "Candidate", f'<div style="color: {MUTED}">No candidate selected.</div>')
    ev = detail.get("evaluation")
    verdict = (f'<div>{_status(ev["status"])} {escape(ev["message"])}</div>' if ev else
               f'<div style="color: {MUTED}">not evaluated yet</div>')
    intent = f'<div style="margin: 4px 0; white-space: pre-wrap">{escape(detail["intent"])}</div>' if detail["intent"] else ""
    # NB: an untrusted notebook's sanitizer drops max-height and overflow, so a long source is cut here
    lines = detail["source"].splitlines()
    more = (f'<div style="color: {MUTED}">… {len(lines) - SOURCE_LINES} more lines</div>'
            if len(lines) > SOURCE_LINES else "")
    source = (f'<pre style="font-size: 11.5px; border: 1px solid {BORDER}; padding: 6px; margin: 4px 0 0">'
              f'{escape(chr(10).join(lines[:SOURCE_LINES]))}</pre>{more}')
    parent = f"parent #{detail['parent_id']}" if detail["parent_id"] is not None else "first candidate"
    return _box("source-view", f"Candidate #{detail['id']} · {detail['proposer']} · {parent}", verdict + intent + source)


def run_progress(state: str, done: int, total: int, cards_done: int, cards_total: int, started: float | None,
                 ended: float | None, best: dict[str, float], log: Sequence[str], notes: Sequence[str] = (), *,
                 evaluated: int | None = None, failures: int = 0, candidates: dict[str, float] | None = None) -> str:
    """The run's state, counts, elapsed time and latest events. ``done``: budget units used (``evaluated``
    candidates judged and ``failures`` of the proposer)."""
    elapsed = ((ended or time.time()) - started) if started else None
    evaluated = done if evaluated is None else evaluated
    failed = f", {failures} proposer failure{'s' * (failures != 1)}" if failures else ""
    parts = [_status(state), f"{evaluated} evaluated{failed}: {done} of a budget of {total}",
             f"{cards_done} / {cards_total} cards"]
    if elapsed is not None:
        parts.append(f"{elapsed:.0f} s")
    chips = " · ".join(f"{escape(k)} {v:.2f}×" for k, v in best.items())
    body = " · ".join(parts) + (f'<div style="margin-top: 4px">winners: {chips}</div>' if chips else "")
    searching = " · ".join(f"{escape(k)} {v:.2f}×" for k, v in (candidates or {}).items())
    if searching:
        body += (f'<div style="margin-top: 4px; color: {MUTED}">best candidate so far (one timing, unconfirmed): '
                 f'{searching}</div>')
    body += "".join(f'<div style="margin-top: 4px">{escape(n)}</div>' for n in notes)
    if log:
        body += f'<pre style="color: {MUTED}; font-size: 11px; margin: 6px 0 0">{escape(chr(10).join(log))}</pre>'
    return _box("run-progress", "Optimization run", body)


def page(title: str, parts: Sequence[str]) -> str:
    """A standalone HTML page of static renderings (the dashboard's export)."""
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title></head><body style=\"max-width: 1200px; margin: 16px auto; "
            f"font-family: system-ui, sans-serif\"><h2>{escape(title)}</h2>{''.join(parts)}</body></html>\n")
