"""Everything a run produces, on disk: SQLite for records, a blob folder for tensors.

Nothing that was paid for (a captured example, an LLM call, an evaluated candidate) lives only in
memory: each is written when it completes, so a dead kernel or a killed process loses nothing.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import torch

from ._redact import redact
from .evaluate import Evaluation, Status
from .ops import CardVerdict
from .ops._verdict import SpeedupEstimate, pool_timings
from .proposers._base import Usage

if TYPE_CHECKING:
    from .ops import Cards

def is_infra_failure(evaluation: Evaluation | None) -> bool:
    """An evaluation that failed outside the candidate's control (``INFRA_ERROR``): it counts for
    nothing, and is done again."""
    return evaluation is not None and not evaluation.status.blames_candidate


NOISE_CAP = 0.15  # the judge's largest noise margin (kforge/evaluate/_judge.py)


def timing_noise(evaluation: Evaluation) -> float:
    """The relative uncertainty of one timing's speedup: the judge's noise margin, the larger of the kernel's
    and eager's robust spreads, at most NOISE_CAP (the least, 2%, is the verdict's own floor).

    NB: the spreads are those of single timed batches; the settled time of many batches is known better,
    and the judge caps its margin for that reason: per-batch spreads of 30-130% on the loaded 2-core CPU
    (2026-12-06) would else put every interval across eager."""
    return min(NOISE_CAP, max(evaluation.candidate_spread or 0.0, evaluation.eager_spread or 0.0))


# 2: a candidate may have several confirmations (``confirmations`` keyed by candidate and index); a store of
# schema 1 (one confirmation a candidate) is migrated when it is opened for writing, and read as it is otherwise.
# 3: the candidates' column of the search's value is ``score`` (it was ``speedup``; a ratio is not 0 for a failure);
# an older store is migrated when opened for writing, and read as it is otherwise (no reader takes that column).
SCHEMA_VERSION = 3

_CONFIRMATIONS_TABLE = """CREATE TABLE IF NOT EXISTS confirmations (
    candidate_id INTEGER NOT NULL REFERENCES candidates(id), idx INTEGER NOT NULL, evaluation TEXT NOT NULL,
    created_at REAL NOT NULL, PRIMARY KEY (candidate_id, idx))"""

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
    score REAL,
    evaluation TEXT,
    dollars REAL NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    evaluated_at REAL);
CREATE INDEX IF NOT EXISTS candidates_card ON candidates(card_key);
CREATE TABLE IF NOT EXISTS results (card_key TEXT PRIMARY KEY, body TEXT NOT NULL, updated_at REAL NOT NULL);
{confirmations};
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
""".replace("{confirmations}", _CONFIRMATIONS_TABLE)


@dataclass(frozen=True)
class Candidate:
    """A candidate as recorded: the frozen row that views, exports and resumed searches read.

    A candidate has one speedup (``estimate``), and one search value, its ``score``: that speedup, 0 when it
    failed or is not evaluated yet. Once it has confirmations (timings taken after the
    search chose it, before its card is decided: one, or two where the first disagreed with the
    search's timing) that speedup is theirs alone: the search's own timing picked the candidate as the
    best of several, so it is biased upward by the noise that helped it win. Before any confirmation
    it is the search's timing. That first timing stays readable as ``first_speedup``.
    """

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
    confirmations: tuple[Evaluation, ...] = ()

    @property
    def confirmation(self) -> Evaluation | None:
        """The latest confirmation, if any."""
        return self.confirmations[-1] if self.confirmations else None

    @property
    def measured(self) -> Evaluation | None:
        """The evaluation that stands: the latest confirmation if there is one, else the first evaluation."""
        if self.confirmations:
            return self.confirmations[-1]
        return None if is_infra_failure(self.evaluation) else self.evaluation

    @property
    def timings(self) -> tuple[Evaluation, ...]:
        """The correct timings its speedup is read from: its confirmations once it has any, else its first
        evaluation."""
        timed = self.confirmations or ((self.evaluation,) if self.evaluation is not None else ())
        return tuple(e for e in timed if not is_infra_failure(e) and e.status.is_correct)

    @property
    def status(self) -> Status | None:
        ev = self.measured
        return ev.status if ev else None

    @property
    def is_evaluated(self) -> bool:
        """Evaluated for good (an evaluation that failed outside the candidate's control is redone)."""
        return self.measured is not None

    @property
    def estimate(self) -> SpeedupEstimate | None:
        """The speedup of its correct timings (``timings``) pooled, with their noise; None unless the
        standing evaluation and every confirmation are correct."""
        ev = self.measured
        if ev is None or not ev.status.is_correct or any(not e.status.is_correct for e in self.confirmations):
            return None
        return pool_timings([(e.speedup, timing_noise(e)) for e in self.timings])

    @property
    def score(self) -> float:
        """The search's value: the pooled speedup (``estimate``); 0 for failures and before evaluation."""
        est = self.estimate
        return est.speedup if est else 0.0

    @property
    def first_speedup(self) -> float:
        """The speedup of the first evaluation, before any confirmation (history)."""
        return self.evaluation.score if self.evaluation and not is_infra_failure(self.evaluation) else 0.0


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


def _writable(path: Path) -> bool:
    """Whether this process may create files in the folder ``path``."""
    return os.access(path, os.W_OK | os.X_OK)


def _damaged(db: Path, exc: BaseException) -> WorkdirError:
    return WorkdirError(
        f"{db} is damaged ({exc}): start again in a new workdir, or keep what is readable with "
        f"`sqlite3 {db} .recover | sqlite3 NEWDIR/kforge.db` and copy {db.parent / 'blobs'} into NEWDIR")


class Store:
    """One session's records: ``<workdir>/kforge.db`` plus ``<workdir>/blobs/``.

    A workdir this process cannot write (a read-only copy, another user's folder) opens read-only:
    everything can be read, and a write raises WorkdirError saying so. ``readonly=True`` asks for that.
    """

    def __init__(self, workdir: str | Path, *, readonly: bool | None = None):
        self.workdir = Path(workdir)
        self.blobs = self.workdir / "blobs"
        db = self.workdir / "kforge.db"
        if readonly is None:
            readonly = db.exists() and not (_writable(self.workdir) and os.access(db, os.W_OK))
        self.readonly = readonly
        self.closed = False
        if not readonly:
            try:
                self.workdir.mkdir(parents=True, exist_ok=True)
                self.blobs.mkdir(exist_ok=True)
            except OSError as exc:
                raise WorkdirError(f"cannot create the session's folder {self.workdir} ({exc.strerror or exc}): "
                                   "pass a workdir you can write to (--workdir / workdir=)") from None
            if not _writable(self.workdir):
                raise WorkdirError(f"cannot write to the workdir {self.workdir}: pass a workdir you can write to "
                                   "(--workdir / workdir=)")
        elif not db.exists():
            raise WorkdirError(f"{self.workdir} holds no kforge session (no kforge.db) to open read-only")
        self._lock = threading.RLock()
        try:
            if readonly:
                # NB: immutable: a read-only folder cannot hold the WAL's shared-memory file.
                uri = f"{db.resolve().as_uri()}?mode=ro&immutable=1"
                self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
            else:
                self._db = sqlite3.connect(db, check_same_thread=False, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
            check = self._db.execute("PRAGMA quick_check").fetchone()
            if check and check[0] != "ok":
                raise sqlite3.DatabaseError(check[0])
            if not readonly:
                self._db.executescript(_SCHEMA)
            version = self.get_meta("schema_version")
        except sqlite3.DatabaseError as exc:
            if readonly or "readonly" not in str(exc):
                raise _damaged(db, exc) from None
            raise WorkdirError(f"cannot write to {db} ({exc}): open it read-only, or copy the workdir "
                               "somewhere writable") from None
        if version is not None and int(version) > SCHEMA_VERSION:
            raise WorkdirError(f"{self.workdir} was written by a newer kforge (schema {version}); upgrade kforge")
        if not readonly:
            self._migrate()
            if version is None or int(version) < SCHEMA_VERSION:
                self.set_meta("schema_version", SCHEMA_VERSION)

    def _migrate(self) -> None:
        """Bring a store of an older schema to this one, in one transaction."""
        with self._lock:
            confirmations = {row[1] for row in self._db.execute("PRAGMA table_info(confirmations)")}
            candidates = {row[1] for row in self._db.execute("PRAGMA table_info(candidates)")}
            if "idx" in confirmations and "score" in candidates:
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if "idx" not in confirmations:   # schema 1: one confirmation a candidate, keyed by the candidate
                    self._db.execute("ALTER TABLE confirmations RENAME TO confirmations_schema1")
                    self._db.execute(_CONFIRMATIONS_TABLE)
                    self._db.execute("INSERT INTO confirmations (candidate_id, idx, evaluation, created_at) "
                                     "SELECT candidate_id, 0, evaluation, created_at FROM confirmations_schema1")
                    self._db.execute("DROP TABLE confirmations_schema1")
                if "score" not in candidates:    # schema 2 and older: the search's value was in ``speedup``
                    self._db.execute("ALTER TABLE candidates RENAME COLUMN speedup TO score")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise WorkdirError(f"the store in {self.workdir} was closed (Session.close(), or the end of its with "
                               f"block): reopen the session with kforge.Session.open({str(self.workdir)!r})")

    def checkpoint(self, timeout_s: float = 5.0) -> None:
        """Move everything written so far from the write-ahead log into ``kforge.db`` itself, so that a copy
        of that one file (an archive of the workdir, a copy made while the session runs) holds all of it.

        Waits up to ``timeout_s`` for other connections that are reading the log; raises WorkdirError if
        they still are (a copy of kforge.db alone would then miss what sits in the log)."""
        if self.readonly:
            return
        with self._lock:
            (before,), = self._db.execute("PRAGMA busy_timeout").fetchall()
            self._db.execute(f"PRAGMA busy_timeout = {max(int(timeout_s * 1000), 0)}")
            try:
                (busy, _, _), = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                self._db.execute(f"PRAGMA busy_timeout = {before}")
        if busy:
            raise WorkdirError(
                f"cannot checkpoint {self.workdir / 'kforge.db'}: another connection kept reading it for "
                f"{timeout_s:g} s. Close the other sessions or processes that have this workdir open, then try again")

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        self._check_open()
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.DatabaseError as exc:
                if isinstance(exc, sqlite3.OperationalError) and "no such table" not in str(exc):
                    raise
                raise _damaged(self.workdir / "kforge.db", exc) from None

    def _write(self, sql: str, args: Sequence[Any] = ()) -> int:
        if self.readonly:
            raise WorkdirError(f"{self.workdir} is opened read-only (this process cannot write there): copy the "
                               "workdir somewhere writable to continue the session")
        self._check_open()
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
        self.set_meta("cards_meta", {"model_us": cards.model_us, "uncaptured": [list(u) for u in cards.uncaptured],
                                     "outside": [list(u) for u in cards.outside]})

    def load_cards(self) -> "Cards":
        from .ops import Card, Cards

        items = tuple(Card.from_json(json.loads(b)) for (b,) in self._rows("SELECT body FROM cards ORDER BY position"))
        meta = self.get_meta("cards_meta") or {}
        return Cards(items, meta.get("model_us"), tuple((n, c) for n, c in meta.get("uncaptured", [])),
                     outside=tuple((n, c) for n, c in meta.get("outside", [])))

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
            # NB: dense (a view with gaps, one of a split's parts, loses its strides here, as any tensor
            # moved off the GPU does): whoever runs a kernel on an example lays it out as the variant has it
            # (the judge's arenas, deploy._recheck)
            torch.save(cpu.clone(), tmp)
            tmp.replace(path)
        return digest

    def get_tensor(self, digest: str, device: str = "cpu") -> torch.Tensor:
        t = torch.load(self.blobs / f"{digest}.pt", map_location="cpu", weights_only=True)
        return t.to(device) if device != "cpu" else t

    def save_example(self, card_key: str, idx: int, inputs: Sequence[str | None], outputs: Sequence[str]) -> None:
        self._write("INSERT OR REPLACE INTO examples (card_key, idx, body) VALUES (?, ?, ?)",
                    (card_key, idx, json.dumps({"inputs": list(inputs), "outputs": list(outputs)})))

    def trim_examples(self, card_key: str, count: int) -> None:
        """Forget a card's stored examples from index ``count`` on (a new capture recorded fewer)."""
        self._write("DELETE FROM examples WHERE card_key = ? AND idx >= ?", (card_key, count))

    def example_refs(self, card_key: str) -> list[dict]:
        return [json.loads(b) for (b,) in self._rows(
            "SELECT body FROM examples WHERE card_key = ? ORDER BY idx", (card_key,))]

    def example_paths(self, card_key: str) -> list[tuple[list[str | None], list[str]]]:
        """Per stored example of a card: its input and reference-output blob files (None: not a tensor)."""
        return [([str(self.blobs / f"{d}.pt") if d else None for d in ref["inputs"]],
                 [str(self.blobs / f"{d}.pt") for d in ref["outputs"]]) for ref in self.example_refs(card_key)]

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
        self._write("UPDATE candidates SET status = ?, score = ?, evaluation = ?, evaluated_at = ? WHERE id = ?",
                    (evaluation.status.value, evaluation.score, json.dumps(evaluation.to_json()), time.time(),
                     candidate_id))

    def add_confirmation(self, candidate_id: int, evaluation: Evaluation) -> None:
        """Store one more timing of a candidate, taken after the search chose it; from then on the candidate's
        speedup is read from its confirmations."""
        with self._lock:
            (n,), = self._rows("SELECT COUNT(*) FROM confirmations WHERE candidate_id = ?", (candidate_id,))
            self._write("INSERT INTO confirmations (candidate_id, idx, evaluation, created_at) VALUES (?, ?, ?, ?)",
                        (candidate_id, n, json.dumps(evaluation.to_json()), time.time()))

    _CAND_COLS = ("c.id, c.card_key, c.parent_id, c.proposer, c.strategy, c.config, c.intent, c.source, c.evaluation,"
                  " c.dollars, c.created_at FROM candidates c")

    def _confirmations(self, where: str = "", args: Sequence[Any] = ()) -> dict[int, tuple[Evaluation, ...]]:
        # NB: by rowid, not idx: a store of schema 1 opened read-only (not migrated) has no idx column, and its
        # rowid is the candidate's id (one confirmation each); in schema 2 the rowid follows insertion
        out: dict[int, list[Evaluation]] = {}
        for cid, body in self._rows(f"SELECT candidate_id, evaluation FROM confirmations {where} "
                                    "ORDER BY candidate_id, rowid", args):
            out.setdefault(cid, []).append(Evaluation.from_json(json.loads(body)))
        return {cid: tuple(evs) for cid, evs in out.items()}

    @staticmethod
    def _candidate(row: tuple, confirmations: tuple[Evaluation, ...] = ()) -> Candidate:
        (cid, key, parent, proposer, strategy, config, intent, source, evaluation, dollars, created) = row
        ev = Evaluation.from_json(json.loads(evaluation)) if evaluation else None
        return Candidate(cid, key, parent, proposer, strategy, json.loads(config), intent, source, ev, dollars,
                         created, confirmations)

    def candidates(self, card_key: str | None = None) -> list[Candidate]:
        with self._lock:
            if card_key is None:
                rows = self._rows(f"SELECT {self._CAND_COLS} ORDER BY c.id")
                conf = self._confirmations()
            else:
                rows = self._rows(f"SELECT {self._CAND_COLS} WHERE c.card_key = ? ORDER BY c.id", (card_key,))
                conf = self._confirmations("WHERE candidate_id IN (SELECT id FROM candidates WHERE card_key = ?)",
                                           (card_key,))
        return [self._candidate(r, conf.get(r[0], ())) for r in rows]

    def candidate(self, candidate_id: int) -> Candidate:
        with self._lock:
            rows = self._rows(f"SELECT {self._CAND_COLS} WHERE c.id = ?", (candidate_id,))
            conf = self._confirmations("WHERE candidate_id = ?", (candidate_id,))
        if not rows:
            raise KeyError(f"no candidate {candidate_id} in {self.workdir}")
        return self._candidate(rows[0], conf.get(candidate_id, ()))

    def best(self, card_key: str) -> Candidate | None:
        """The fastest candidate of a card whose standing evaluation says FASTER (ties: the first)."""
        faster = [c for c in self.candidates(card_key) if c.status is Status.FASTER]
        return max(faster, key=lambda c: (c.score, -c.id)) if faster else None

    # ------------------------------------------------------------------ per-card verdicts

    def save_result(self, card_key: str, verdict: CardVerdict) -> None:
        self._write("INSERT OR REPLACE INTO results (card_key, body, updated_at) VALUES (?, ?, ?)",
                    (card_key, redact(json.dumps(verdict.to_json())), time.time()))

    def results(self) -> dict[str, CardVerdict]:
        """Every decided card's verdict, by card key."""
        return {k: CardVerdict.from_json(json.loads(b)) for k, b in self._rows("SELECT card_key, body FROM results")}

    def result(self, card_key: str) -> CardVerdict | None:
        rows = self._rows("SELECT body FROM results WHERE card_key = ?", (card_key,))
        return CardVerdict.from_json(json.loads(rows[0][0])) if rows else None

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
