"""Everything a run produces, on disk: SQLite for records, a blob folder for tensors.

Nothing that was paid for (a captured example, an LLM call, an evaluated candidate) lives only in
memory: each is written when it completes, so a dead kernel or a killed process loses nothing.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import torch

from ._redact import redact
from .evaluate import Evaluation, Status
from .proposers._base import Usage

if TYPE_CHECKING:
    from .capture import Cards

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cards (
    key TEXT PRIMARY KEY, position INTEGER NOT NULL, op TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS examples (
    card_key TEXT NOT NULL, idx INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (card_key, idx));
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    card_key TEXT NOT NULL,
    parent_id INTEGER REFERENCES candidates(id),
    proposer TEXT NOT NULL,
    strategy TEXT,
    config TEXT NOT NULL DEFAULT '{}',
    intent TEXT NOT NULL DEFAULT '',
    source TEXT NOT NULL,
    status TEXT,
    speedup REAL,
    evaluation TEXT,
    dollars REAL NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    evaluated_at REAL);
CREATE INDEX IF NOT EXISTS candidates_card ON candidates(card_key);
CREATE TABLE IF NOT EXISTS results (card_key TEXT PRIMARY KEY, body TEXT NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS llm_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    card_key TEXT,
    candidate_id INTEGER REFERENCES candidates(id),
    proposer TEXT NOT NULL,
    model TEXT NOT NULL,
    prompt TEXT NOT NULL,
    response TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cache_read_tokens INTEGER NOT NULL,
    cache_write_tokens INTEGER NOT NULL,
    dollars REAL NOT NULL,
    latency_s REAL NOT NULL,
    error TEXT,
    created_at REAL NOT NULL);
"""


@dataclass(frozen=True)
class Candidate:
    """A candidate as recorded: the frozen row that views, exports and resumed searches read."""

    id: int
    card_key: str
    parent_id: int | None
    proposer: str
    strategy: str | None
    config: dict[str, Any]
    intent: str
    source: str
    evaluation: Evaluation | None
    dollars: float
    created_at: float

    @property
    def status(self) -> Status | None:
        return self.evaluation.status if self.evaluation else None

    @property
    def is_evaluated(self) -> bool:
        return self.evaluation is not None

    @property
    def speedup(self) -> float:
        return self.evaluation.score if self.evaluation else 0.0


@dataclass(frozen=True)
class LLMCall:
    id: int
    card_key: str | None
    candidate_id: int | None
    proposer: str
    usage: Usage
    prompt: str
    response: str
    error: str | None
    created_at: float


class WorkdirError(RuntimeError):
    """The workdir cannot be used as asked (another model's session, a newer schema...)."""


class Store:
    """One session's records: ``<workdir>/kforge.db`` plus ``<workdir>/blobs/``."""

    def __init__(self, workdir: str | Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.blobs = self.workdir / "blobs"
        self.blobs.mkdir(exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.workdir / "kforge.db", check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        version = self.get_meta("schema_version")
        if version is None:
            self.set_meta("schema_version", SCHEMA_VERSION)
        elif int(version) > SCHEMA_VERSION:
            raise WorkdirError(f"{self.workdir} was written by a newer kforge (schema {version}); upgrade kforge")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _write(self, sql: str, args: Sequence[Any] = ()) -> int:
        with self._lock:
            cur = self._db.execute(sql, args)
            return cur.lastrowid or 0

    # ------------------------------------------------------------------ meta

    def get_meta(self, key: str) -> Any:
        rows = self._rows("SELECT value FROM meta WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: Any) -> None:
        self._write("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    # ------------------------------------------------------------------ cards and examples

    def save_cards(self, cards: "Cards") -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM cards")
            for i, card in enumerate(cards):
                self._db.execute("INSERT INTO cards (key, position, op, body) VALUES (?, ?, ?, ?)",
                                 (card.key, i, card.op, json.dumps(card.to_json())))
            self._db.execute("COMMIT")
        self.set_meta("cards_meta", {"model_us": cards.model_us, "uncaptured": [list(u) for u in cards.uncaptured]})

    def load_cards(self) -> "Cards":
        from .capture import Card, Cards

        items = tuple(Card.from_json(json.loads(b)) for (b,) in self._rows("SELECT body FROM cards ORDER BY position"))
        meta = self.get_meta("cards_meta") or {}
        return Cards(items, meta.get("model_us"), tuple((n, c) for n, c in meta.get("uncaptured", [])))

    def put_tensor(self, t: torch.Tensor) -> str:
        """Store a tensor once by content (same bytes, same dtype/shape/strides: same blob)."""
        cpu = t.detach().to("cpu")
        raw = cpu.contiguous().view(-1).view(torch.uint8) if cpu.numel() else torch.empty(0, dtype=torch.uint8)
        h = hashlib.blake2b(digest_size=16)
        h.update(repr((tuple(cpu.shape), tuple(cpu.stride()), str(cpu.dtype))).encode())
        h.update(raw.numpy().tobytes())
        digest = h.hexdigest()
        path = self.blobs / f"{digest}.pt"
        if not path.exists():
            tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
            torch.save(cpu.clone(), tmp)
            tmp.replace(path)
        return digest

    def get_tensor(self, digest: str, device: str = "cpu") -> torch.Tensor:
        t = torch.load(self.blobs / f"{digest}.pt", map_location="cpu", weights_only=True)
        return t.to(device) if device != "cpu" else t

    def save_example(self, card_key: str, idx: int, inputs: Sequence[str | None], outputs: Sequence[str]) -> None:
        self._write("INSERT OR REPLACE INTO examples (card_key, idx, body) VALUES (?, ?, ?)",
                    (card_key, idx, json.dumps({"inputs": list(inputs), "outputs": list(outputs)})))

    def example_refs(self, card_key: str) -> list[dict]:
        return [json.loads(b) for (b,) in self._rows(
            "SELECT body FROM examples WHERE card_key = ? ORDER BY idx", (card_key,))]

    def load_examples(self, card_key: str, device: str = "cpu") -> list[tuple[list, list]]:
        """The stored (inputs, reference outputs) of a card, on ``device``."""
        out = []
        for ref in self.example_refs(card_key):
            ins = [self.get_tensor(d, device) if d else None for d in ref["inputs"]]
            outs = [self.get_tensor(d, device) for d in ref["outputs"]]
            out.append((ins, outs))
        return out

    # ------------------------------------------------------------------ candidates

    def add_candidate(self, card_key: str, parent_id: int | None, proposer: str, source: str, *,
                      strategy: str | None = None, config: dict | None = None, intent: str = "",
                      dollars: float = 0.0) -> int:
        return self._write(
            "INSERT INTO candidates (card_key, parent_id, proposer, strategy, config, intent, source, dollars,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (card_key, parent_id, proposer, strategy, redact(json.dumps(config or {}, default=str)), redact(intent), source,
             dollars, time.time()))

    def set_evaluation(self, candidate_id: int, evaluation: Evaluation) -> None:
        # NB: the write boundary for text a candidate controls (its compile log, crash message, stderr).
        evaluation = replace(evaluation, message=redact(evaluation.message), compile_log=redact(evaluation.compile_log))
        self._write("UPDATE candidates SET status = ?, speedup = ?, evaluation = ?, evaluated_at = ? WHERE id = ?",
                    (evaluation.status.value, evaluation.score, json.dumps(evaluation.to_json()), time.time(),
                     candidate_id))

    _CAND_COLS = "id, card_key, parent_id, proposer, strategy, config, intent, source, evaluation, dollars, created_at"

    @staticmethod
    def _candidate(row: tuple) -> Candidate:
        (cid, key, parent, proposer, strategy, config, intent, source, evaluation, dollars, created) = row
        ev = Evaluation.from_json(json.loads(evaluation)) if evaluation else None
        return Candidate(cid, key, parent, proposer, strategy, json.loads(config), intent, source, ev, dollars,
                         created)

    def candidates(self, card_key: str | None = None) -> list[Candidate]:
        if card_key is None:
            rows = self._rows(f"SELECT {self._CAND_COLS} FROM candidates ORDER BY id")
        else:
            rows = self._rows(f"SELECT {self._CAND_COLS} FROM candidates WHERE card_key = ? ORDER BY id", (card_key,))
        return [self._candidate(r) for r in rows]

    def candidate(self, candidate_id: int) -> Candidate:
        rows = self._rows(f"SELECT {self._CAND_COLS} FROM candidates WHERE id = ?", (candidate_id,))
        if not rows:
            raise KeyError(f"no candidate {candidate_id} in {self.workdir}")
        return self._candidate(rows[0])

    def best(self, card_key: str) -> Candidate | None:
        rows = self._rows(f"SELECT {self._CAND_COLS} FROM candidates WHERE card_key = ? AND status = ? "
                          "ORDER BY speedup DESC, id LIMIT 1", (card_key, Status.FASTER.value))
        return self._candidate(rows[0]) if rows else None

    # ------------------------------------------------------------------ per-card verdicts

    def save_result(self, card_key: str, body: dict) -> None:
        self._write("INSERT OR REPLACE INTO results (card_key, body, updated_at) VALUES (?, ?, ?)",
                    (card_key, redact(json.dumps(body)), time.time()))

    def results(self) -> dict[str, dict]:
        return {k: json.loads(b) for k, b in self._rows("SELECT card_key, body FROM results")}

    # ------------------------------------------------------------------ LLM calls and cost

    def add_llm_call(self, proposer: str, usage: Usage, prompt: str, response: str, *, card_key: str | None = None,
                     candidate_id: int | None = None, error: str | None = None) -> int:
        return self._write(
            "INSERT INTO llm_calls (card_key, candidate_id, proposer, model, prompt, response, input_tokens,"
            " output_tokens, cache_read_tokens, cache_write_tokens, dollars, latency_s, error, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (card_key, candidate_id, proposer, usage.model, redact(prompt), redact(response), usage.input_tokens,
             usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens, usage.dollars,
             usage.latency_s, redact(error), time.time()))

    def link_llm_call(self, call_id: int, candidate_id: int) -> None:
        self._write("UPDATE llm_calls SET candidate_id = ? WHERE id = ?", (candidate_id, call_id))

    def llm_calls(self, card_key: str | None = None) -> list[LLMCall]:
        sql = ("SELECT id, card_key, candidate_id, proposer, model, input_tokens, output_tokens, cache_read_tokens,"
               " cache_write_tokens, dollars, latency_s, prompt, response, error, created_at FROM llm_calls")
        rows = self._rows(sql + (" WHERE card_key = ?" if card_key else "") + " ORDER BY id",
                          (card_key,) if card_key else ())
        return [LLMCall(r[0], r[1], r[2], r[3], Usage(r[4], r[5], r[6], r[7], r[8], r[9], r[10]), r[11], r[12],
                        r[13], r[14]) for r in rows]

    def dollars(self, card_key: str | None = None) -> float:
        if card_key is None:
            rows = self._rows("SELECT COALESCE(SUM(dollars), 0) FROM llm_calls")
        else:
            rows = self._rows("SELECT COALESCE(SUM(dollars), 0) FROM llm_calls WHERE card_key = ?", (card_key,))
        return float(rows[0][0])


def iter_tensors(obj: Any) -> Iterable[torch.Tensor]:
    """Every tensor inside nested tuples, lists and dicts."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from iter_tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from iter_tensors(o)
