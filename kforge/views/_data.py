"""What the views show, read from the store and the cards: small records the widgets sync.

Pure functions of the store, so views own no state and are tested without a front end.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..ops import CardStatus, get_spec

if TYPE_CHECKING:
    from ..ops import Cards
    from ..store import Candidate, Store


@dataclass(frozen=True)
class CardRow:
    """One row of the card table."""

    key: str
    op: str
    label: str                # op and a short signature: what a person reads instead of the key
    signature: str
    vendor: str               # the vendor library behind the op ("" when none)
    calls: int
    share: float
    judge_eager_us: float | None   # the judge's eager time: the baseline of the search's speedups (once searched)
    in_model_us: float        # capture: one call inside the model's forward (0: not timed there)
    winner_speedup: float | None   # the card's speedup (its verdict's); None without a winner
    speedup_low: float | None
    speedup_high: float | None
    best_candidate: float | None   # no winner: the best correct candidate's speedup so far, unconfirmed
    status: str               # "winner", "noisy", "eager", "searching", "not searched"
    candidates: int
    dollars: float


@dataclass(frozen=True)
class TreeRow:
    """One candidate of a search tree as the tree view shows it, small enough to ship hundreds at once."""

    id: int
    parent: int | None
    status: str               # an evaluation status, or "pending" before evaluation
    score: float              # the candidate's timings pooled (a candidate timing, not the card's); 0 for failures
    winner: bool              # the card's verdict installs this candidate: its speedup is the card's
    intent: str
    strategy: str


def card_rows(cards: "Cards", store: "Store", searching: str | None = None) -> list[dict[str, Any]]:
    """The card table: one row per card, with the search outcome read from the store. A card's speedup is
    its verdict's; a card without a winner shows its best candidate apart, as unconfirmed."""
    verdicts = store.results()
    best: dict[str, float] = {}
    counts: dict[str, int] = {}
    for c in store.candidates():
        counts[c.card_key] = counts.get(c.card_key, 0) + 1
        if c.status is not None and c.status.is_correct:
            best[c.card_key] = max(best.get(c.card_key, 0.0), c.score)
    dollars: dict[str, float] = {}
    for call in store.llm_calls():
        if call.card_key:
            dollars[call.card_key] = dollars.get(call.card_key, 0.0) + call.usage.dollars
    rows = []
    for card in cards:
        verdict = verdicts.get(card.key)
        if card.key == searching:
            status = CardStatus.SEARCHING.value
        elif verdict:
            status = verdict.status.value
        else:
            status = CardStatus.NOT_SEARCHED.value
        won = verdict is not None and verdict.status.has_winner and status != CardStatus.SEARCHING.value
        rows.append(asdict(CardRow(
            card.key, card.op, short_label(card), card.signature, card.vendor or "", card.calls, card.share,
            verdict.eager_us if verdict else None, card.in_model_us,
            verdict.winner_speedup if won else None, verdict.speedup_low if won else None,
            verdict.speedup_high if won else None, None if won else best.get(card.key),
            status, counts.get(card.key, 0), dollars.get(card.key, 0.0))))
    return rows


def short_label(card: Any, limit: int = 48) -> str:
    """A card as a person reads it, instead of its hex key: ``softmax(f32[64,1000], dim=1)``."""
    try:
        v = card.variant
        describe = getattr(get_spec(v.op), "describe", None)
        if describe is not None:  # a region: its operators, then its inputs (its IR is in the signature)
            text = describe(v)
            # NB: a region's describe() ends with " -> " and its outputs; a vendor chain's head is followed by " -> "
            # and its tail, which is the card's point (``addmm 32x64x64 NN float32 -> [gelu,add]``)
            sig = text if v.op == "vendor_chain" else text.split(" -> ")[0]
        else:
            parts = [s.short() for s in v.inputs if s is not None]
            parts += [f"{k}={val}" for k, val in v.params if val is not None and val is not False]
            sig = re.sub(r"\{[^}]*\}", "", f"{v.op}(" + ", ".join(parts) + ")")  # strides: in the full signature
    except Exception:  # a card of another shape: its full signature
        sig = card.signature
    return sig if len(sig) <= limit else sig[:limit - 1] + "…"


def tree_nodes(store: "Store", card_key: str) -> list[dict[str, Any]]:
    """Every candidate of a card's search tree, without sources (those are fetched on demand)."""
    verdict = store.result(card_key)
    winner = verdict.winner_id if verdict is not None and verdict.status.has_winner else None
    return [asdict(TreeRow(c.id, c.parent_id, c.status.value if c.status else "pending", c.score,
                            c.id == winner, _first_line(c.intent), c.strategy or ""))
            for c in store.candidates(card_key)]


def best_path(nodes: list[dict[str, Any]]) -> list[int]:
    """Ids from the first candidate down to the card's winner; without one, down to the fastest candidate
    that beat eager (a candidate timing); empty when none did."""
    by_id = {n["id"]: n for n in nodes}
    node: dict[str, Any] | None = next((n for n in nodes if n.get("winner")), None)
    if node is None:
        correct = [n for n in nodes if n["score"] > 1.0 and n.get("status", "faster") == "faster"]
        if not correct:
            return []
        node = max(correct, key=lambda n: (n["score"], -n["id"]))
    path = []
    while node is not None:
        path.append(node["id"])
        node = by_id.get(node["parent"]) if node["parent"] is not None else None
    return path[::-1]


def line_diff(old: str, new: str) -> list[list]:
    """A unified line diff as [kind, text] pairs; kind is "+", "-", " " or "@"."""
    out: list[list] = []
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), "parent", "candidate", n=3, lineterm="")
    for line in list(lines)[2:]:
        kind = "@" if line.startswith("@@") else line[:1]
        out.append([kind, line if kind == "@" else line[1:]])
    return out


def candidate_detail(store: "Store", candidate_id: int) -> dict[str, Any]:
    """Everything the source view shows for one candidate: source, diff, log and validation."""
    cand = store.candidate(candidate_id)
    parent: Candidate | None = store.candidate(cand.parent_id) if cand.parent_id is not None else None
    return _detail(cand, parent)


def _detail(cand: "Candidate", parent: "Candidate | None") -> dict[str, Any]:
    ev = cand.measured or cand.evaluation  # the standing evaluation: the confirmation once there is one
    evaluation = None
    if ev is not None:
        evaluation = {"status": ev.status.value, "message": ev.message, "speedup": ev.speedup,
                      "candidate_us": ev.candidate_us, "eager_us": ev.eager_us,
                      "candidate_spread": ev.candidate_spread, "eager_spread": ev.eager_spread,
                      "max_abs_error": ev.max_abs_error, "max_rel_error": ev.max_rel_error,
                      "mismatch_fraction": ev.mismatch_fraction, "roofline_fraction": ev.roofline_fraction,
                      "compile_s": ev.compile_s, "wall_s": ev.wall_s, "checks": list(ev.checks)}
    return {"id": cand.id, "card_key": cand.card_key, "parent_id": cand.parent_id, "proposer": cand.proposer,
            "strategy": cand.strategy or "", "config": cand.config, "intent": cand.intent,
            "source": cand.source, "diff": line_diff(parent.source, cand.source) if parent else None,
            "compile_log": _tail(ev.compile_log, LOG_CHARS) if ev else "", "evaluation": evaluation,
            "dollars": cand.dollars}


def run_notes(run: Any, labels: "dict[str, str] | None" = None) -> list[str]:
    """Why a card of ``run`` got no new candidate (e.g. it was searched before to this budget)."""
    from .._events import EventKind

    labels = labels or {}
    resumed: dict[str, int] = {}
    new: dict[str, int] = {}
    notes = []
    for e in list(run.events):
        key = e.card_key or ""
        if e.kind is EventKind.CARD_STARTED:
            resumed[key] = int(e.data.get("resumed", 0))
            new[key] = 0
        elif e.kind in (EventKind.EVALUATED, EventKind.PROPOSER_FAILED):
            new[key] = new.get(key, 0) + 1
        elif e.kind is EventKind.CARD_FINISHED and not new.get(key):
            label = labels.get(key, key[:8])
            had, budget = resumed.get(key, 0), run.budget.iterations
            why = str(e.data.get("search_ended") or e.message)
            if had >= budget:
                why = (f"already searched: it has {had} candidates and the budget is {budget} per card; "
                       f"pass a larger iterations to search further")
            notes.append(f"{label}: nothing new ({why})")
    return notes


LOG_CHARS = 20_000


def all_details(store: "Store", card_keys: "set[str] | None" = None) -> dict[str, dict[str, Any]]:
    """Every candidate's detail by id (as a string: JSON keys), for views that need no round trip."""
    cands = store.candidates()
    by_id = {c.id: c for c in cands}
    return {str(c.id): _detail(c, by_id.get(c.parent_id) if c.parent_id is not None else None) for c in cands
            if card_keys is None or c.card_key in card_keys}


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"[… {len(text) - limit} characters cut]\n" + text[-limit:]


def _first_line(text: str, limit: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit - 1] + "…"
