"""The kforge command line, for headless GPU boxes and scripts.

Everyday mistakes end in one line on stderr naming the thing and the fix, exit code 2. With
``--json`` stdout carries one JSON document and nothing else; progress goes to stderr. Ctrl-C
during ``optimize`` stops after the evaluation in progress, keeps everything in the store, prints
the resume command and exits with 130.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import socket
import sys
import time
from typing import Any, Sequence
from urllib.parse import urlparse

from ._version import __version__

INTERRUPTED = 130


class UsageError(Exception):
    """A mistake in how kforge was called: the message says what to do instead."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"kforge: error: {message} (see `{self.prog} --help`)\n")


def _out(args: argparse.Namespace):
    """Where human-readable text goes: stdout, or stderr when stdout is for JSON."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout


# ----------------------------------------------------------------------------- the model


def _load_model(args: argparse.Namespace) -> tuple[Any, Any]:
    from .examples import example

    if not args.model:
        return example(args.example, device=args.device or "cpu")
    spec = args.model
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise UsageError(f"--model takes 'module:function' (a function returning (model, example_inputs)), "
                         f"got {spec!r}; e.g. --model mymodel:build for build() in mymodel.py")
    # NB: like `python -m` and pytest, a module in the current folder is importable.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.split(".")[0] == exc.name.split(".")[0]:
            raise UsageError(f"--model {spec}: no module {module!r} in {os.getcwd()} or on PYTHONPATH; run kforge "
                             f"from the folder that holds {module.split('.')[0]}.py, or add that folder to "
                             "PYTHONPATH") from None
        raise UsageError(f"--model {spec}: importing {module!r} failed ({type(exc).__name__}: {exc}); "
                         f"`python -c 'import {module}'` shows where") from None
    except Exception as exc:
        raise UsageError(f"--model {spec}: importing {module!r} failed ({type(exc).__name__}: {exc}); "
                         f"`python -c 'import {module}'` shows where") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise UsageError(f"--model {spec}: {module!r} has no function {attr!r}; name a function that returns "
                         "(model, example_inputs)")
    try:
        built = fn()
    except Exception as exc:
        raise UsageError(f"--model {spec}: {attr}() raised {type(exc).__name__}: {exc}") from None
    if not (isinstance(built, (tuple, list)) and len(built) == 2 and callable(built[0])):
        raise UsageError(f"--model {spec}: {attr}() must return (model, example_inputs), got "
                         f"{type(built).__name__}{'' if not isinstance(built, (tuple, list)) else f' of {len(built)}'}")
    return built[0], built[1]


def _session(args: argparse.Namespace):
    from .capture import CaptureError
    from .session import Session, as_flags, resolve_device

    if getattr(args, "resume", False):
        return _resumed(args)
    try:
        args.device = resolve_device(args.device)
    except CaptureError as exc:
        raise UsageError(as_flags(str(exc))) from None
    model, inputs = _load_model(args)
    return Session(model, inputs, device=args.device, workdir=args.workdir)


def _resumed(args: argparse.Namespace):
    """The session a resumed run continues, with the model its first run was made from (``--model`` given now, else
    the built-in example or ``--model`` the store records), so that the run can time it; without one, the session
    alone (its cards and candidates; the model is not timed)."""
    from pathlib import Path

    from .session import Session
    from .store import Store

    path = Path(args.workdir)
    if not (path / "kforge.db").exists():
        return Session.open(args.workdir)   # NB: says what to do
    store = Store(path)
    source = (store.get_meta(_RUN_META) or {}).get("model") or {}
    device = store.get_meta("device") or "cpu"
    store.close()
    if args.model:
        source = {"model": args.model}
    if not source:
        return Session.open(args.workdir)
    args.model, args.example = source.get("model"), source.get("example") or args.example
    args.device = device
    model, inputs = _load_model(args)
    return Session.open(args.workdir, model=model, inputs=inputs)


def _model_source(args: argparse.Namespace, session) -> dict | None:
    """What the session's model was made from, for a resume to make it again (None: not by this command line)."""
    if session.model is None:
        return None
    return {"model": args.model} if args.model else {"example": args.example}


# ----------------------------------------------------------------------------- a run's options

# What `kforge optimize` searches with, and the defaults of a fresh run; a resumed run takes those not given on its
# command line from the run it continues, which its store keeps (meta _RUN_META): resuming an LLM run with the
# command kforge prints must not switch it to the built-in proposer, nor drop its dollar limit.
_RUN_OPTIONS = {"proposer": "builtin", "policy": "mcts", "iterations": 50, "dollars": None, "ops": None,
                "include_vendor": False, "max_cards": None}
_RUN_META = "cli_optimize"


def _flag(name: str, value) -> str:
    flag = "--" + name.replace("_", "-")
    return flag if value is True else f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"


def _run_options(args: argparse.Namespace, store) -> tuple[float | None, float | None]:
    """Fill in the run's options left out on the command line (``store``: the resumed session's, else None).

    Returns this run's dollar limit (a resumed run's: what is left of the limit it had) and the store's spending when
    that limit began (None: from now)."""
    given = {k for k in _RUN_OPTIONS if getattr(args, k) is not None}
    stored = store.get_meta(_RUN_META) if store is not None else None
    for key, value in {**_RUN_OPTIONS, **((stored or {}).get("options") or {})}.items():
        if key not in given:
            setattr(args, key, value)
    run_dollars, since = args.dollars, None
    if stored is not None and "dollars" not in given and args.dollars is not None:
        since = float(stored.get("dollars_before") or 0.0)
        spent = store.dollars() - since
        if spent >= args.dollars:
            raise UsageError(f"the run in {args.workdir} had --dollars {args.dollars:g} and has spent ${spent:.2f} of "
                             "it; pass --dollars to allow this run more")
        run_dollars = args.dollars - spent
    if store is not None:
        kept = [_flag(k, getattr(args, k)) for k in _RUN_OPTIONS
                if k not in given and getattr(args, k) not in (None, False)]
        what = ("the options of the run it continues: " + " ".join(kept) if stored is not None and kept else
                "no options of an earlier `kforge optimize` run are stored in this session: the defaults apply")
        now = " ".join(_flag(k, getattr(args, k)) for k in _RUN_OPTIONS if k in given)
        left = f"; ${run_dollars:.2f} of its dollar limit left" if since is not None else ""
        print(f"kforge: resuming with {what}{left}" + (f"; given now: {now}" if now else ""), file=sys.stderr)
    return run_dollars, since


# ----------------------------------------------------------------------------- checks before work


def check_optimize_args(args: argparse.Namespace) -> list[str] | None:
    """Budgets and operator names, before anything runs. Returns the --ops list."""
    from .ops import all_specs

    if args.iterations < 1:
        raise UsageError(f"--iterations must be at least 1 (got {args.iterations}): it is the number of "
                         "candidates tried per card")
    if args.dollars is not None and not args.dollars > 0:
        raise UsageError(f"--dollars must be a positive amount (got {args.dollars:g}); leave it out for no "
                         "dollar limit")
    if args.max_cards is not None and args.max_cards < 1:
        raise UsageError(f"--max-cards must be at least 1 (got {args.max_cards})")
    if not args.ops:
        return None
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    known = sorted(s.name for s in all_specs())
    for op in ops:
        if op not in known:
            close = difflib.get_close_matches(op, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(f"--ops: kforge has no operator {op!r}; {hint}known: {', '.join(known)}")
    return ops


def _end_to_end_modes(spec: str) -> tuple[str, ...] | None:
    """--end-to-end's modes: the torch.compile modes to time beside eager (eager is always timed), or None for
    none at all."""
    from .deploy import MODES

    known = ("eager", *MODES)
    words = [w.strip() for w in (spec or "").split(",") if w.strip()]
    if words == ["none"]:
        return None
    for w in words:
        if w not in known:
            close = difflib.get_close_matches(w, (*known, "none"), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(f"--end-to-end: no mode {w!r}; {hint}use {', '.join(known)}, or none")
    return tuple(w for w in words if w != "eager")


def _rewrites(spec: str | None) -> tuple[str, ...]:
    """--rewrites' names (kforge.rewrites), each known, before anything runs."""
    from .rewrites import rewrite_names

    names = tuple(dict.fromkeys(w.strip() for w in (spec or "").split(",") if w.strip()))
    for name in names:
        if name not in rewrite_names():
            close = difflib.get_close_matches(name, rewrite_names(), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(f"--rewrites: kforge has no rewrite {name!r}; {hint}use {', '.join(rewrite_names())}")
    return names


def _cluster(spec: str | None):
    """The Ray cluster of ``--cluster ray[:ADDRESS]`` (Ray importable), before anything runs; None without it."""
    from .cluster import RayCluster

    if spec is None:
        return None
    try:
        return RayCluster.from_spec(spec)
    except (ValueError, ImportError) as exc:
        raise UsageError(f"--cluster {spec}: {exc}") from None


def checked_proposer(name: str):
    from .proposers import make_proposer
    from .proposers._base import ProposerError

    try:
        proposer = make_proposer(name)
    except (ValueError, ProposerError, ImportError) as exc:
        raise UsageError(f"--proposer {name}: {exc}") from None
    url = getattr(proposer, "base_url", None)
    if getattr(proposer, "name", "") == "local" and url:
        _reachable(url, name)
    return proposer


def _reachable(url: str, name: str, timeout_s: float = 3.0) -> None:
    """Fail at once when nothing listens at a local proposer's URL (not after a whole run)."""
    parts = urlparse(url)
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not host:
        raise UsageError(f"--proposer {name}: {url!r} is not a URL; use local:http://HOST:PORT/v1")
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"--proposer {name}: cannot reach the server at {url} ({reason}); start it or fix the "
                         "URL") from None


def _check_cache() -> None:
    from .kernels._compile import cache_dir

    path = os.environ.get("KFORGE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kforge")
    try:
        path = cache_dir()
    except OSError as exc:
        raise UsageError(f"cannot create the kernel cache {path} ({exc.strerror or exc}): set KFORGE_CACHE to a "
                         "folder you can write to") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"the kernel cache {path} is not writable: set KFORGE_CACHE to a folder you can write to")


# ----------------------------------------------------------------------------- capture


def _capture_summary(session, cards) -> list[str]:
    lines = [f"kforge {__version__}: {len(cards)} operator variants captured on {session.device}"
             + (f" (timed on {cards.threads} thread{'s' if cards.threads != 1 else ''})" if cards.threads else "")
             + f"; store in {session.workdir}"]
    if cards.noisy or cards.model_noisy:
        lines.append(f"warning: {len(cards.noisy)} card timing(s)"
                     + (" and the forward's own timing" if cards.model_noisy else "")
                     + " were too noisy to trust (the machine is busy?); capture again when it is quieter")
    return lines


def _cards_json(cards) -> dict:
    return {"model_us": cards.model_us, "coverage": cards.coverage, "threads": cards.threads,
            "noisy": [c.key for c in cards.noisy], "model_noisy": cards.model_noisy,
            "uncaptured": dict(cards.uncaptured), "outside": dict(cards.outside),
            "cards": [c.to_json() | {"key": c.key, "signature": c.signature} for c in cards]}


def cmd_capture(args: argparse.Namespace) -> int:
    session = _session(args)
    cards = session.capture(vendor_chains=args.vendor_chains)
    if args.json:
        for line in _capture_summary(session, cards):
            print(line, file=sys.stderr)
        print(json.dumps({"workdir": str(session.workdir), "device": session.device, **_cards_json(cards)},
                         indent=2, default=str))
    else:
        print("\n".join(_capture_summary(session, cards)))
        print(cards.table(args.limit))
    return 0


# ----------------------------------------------------------------------------- optimize


class _Progress:
    """Prints events to stderr, with a progress line (``kforge.search.Progress``) as each card starts and ends
    and every ``every_s`` seconds between, and keeps what the summary needs."""

    def __init__(self, quiet: bool, cards_total: int = 0, iterations: int = 0, every_s: float = 10.0):
        from .search import print_progress

        self._print = None if quiet else print_progress
        self.events: list = []
        self.cards_total, self.iterations, self.every_s = cards_total, iterations, every_s
        self._last_line = 0.0
        self.evaluated: set[str] = set()
        self.proposer_failures: dict[str, str] = {}

    @property
    def progress(self):
        from .search import Progress

        return Progress.of(self.events, cards_total=self.cards_total, iterations=self.iterations)

    @property
    def evaluations(self) -> int:
        """Candidates judged (proposer failures and evaluations that failed outside the candidate apart)."""
        return self.progress.evaluated

    def __call__(self, event) -> None:
        from .search import EventKind

        self.events.append(event)
        if event.kind is EventKind.EVALUATED and event.data.get("counts", True):
            self.evaluated.add(event.card_key)
        elif event.kind is EventKind.PROPOSER_FAILED and event.card_key:
            self.proposer_failures[event.card_key] = event.message
        if self._print is None:
            return
        self._print(event, sys.stderr)
        now = time.monotonic()
        step = event.kind in (EventKind.EVALUATED, EventKind.PROPOSER_FAILED)
        card = event.kind in (EventKind.CARD_STARTED, EventKind.CARD_FINISHED)
        if card or (step and now - self._last_line >= self.every_s):
            self._last_line = now
            print(f"{'progress':>15}  {self.progress.line()}", file=sys.stderr, flush=True)


def _until_done(run) -> None:
    while not run.done:
        time.sleep(0.1)
    try:
        run.wait()
    except Exception:  # noqa: BLE001 - reported from run.error by the caller
        pass


def _wait(run) -> bool:
    """Wait for the run; on Ctrl-C stop it after the evaluation in progress. True if interrupted."""
    try:
        _until_done(run)
        return False
    except KeyboardInterrupt:
        pass
    print("kforge: stopping after the evaluation in progress (Ctrl-C again to quit at once)...", file=sys.stderr,
          flush=True)
    run.stop()
    try:
        _until_done(run)
    except KeyboardInterrupt:
        print("kforge: quit; what was stored stays in the store", file=sys.stderr)
    return True


def _writable(session):
    if session.store.readonly:
        raise UsageError(f"{session.workdir} is read-only here: optimize writes to its store; copy the folder "
                         f"somewhere writable and resume there (`kforge show --workdir {session.workdir}` prints it "
                         "as it is)")
    return session


def cmd_optimize(args: argparse.Namespace) -> int:
    from .search import plan

    resume = getattr(args, "resume", False)
    session = _writable(_session(args)) if resume else None   # NB: first: a resumed run's options are in its store
    run_dollars, since = _run_options(args, session.store if session is not None else None)
    ops = check_optimize_args(args)
    modes = _end_to_end_modes(getattr(args, "end_to_end", "eager"))
    rewrites = _rewrites(getattr(args, "rewrites", None))
    proposer = checked_proposer(args.proposer)
    cluster = _cluster(args.cluster)
    _check_cache()
    if session is None:
        session = _writable(_session(args))
    session.store.set_meta(_RUN_META, {"options": {k: getattr(args, k) for k in _RUN_OPTIONS},
                                       "dollars_before": session.store.dollars() if since is None else since,
                                       "model": _model_source(args, session)})
    out = _out(args)
    if not resume or session._cards is None:
        session.capture(vendor_chains=getattr(args, "vendor_chains", None))
        print("\n".join(_capture_summary(session, session.cards)), file=out)
        print(session.cards.table(args.limit), file=out)
    cards = session.cards
    chosen, skipped = plan(cards, session.device_info(), ops=ops, include_vendor=args.include_vendor,
                           max_cards=args.max_cards)
    if not chosen:
        if ops:
            present = sorted({c.op for c in cards})
            raise UsageError(f"--ops {args.ops}: the model runs no such operator (it runs: {', '.join(present)})"
                             if not any(c.op in ops for c in cards) else
                             "no card to optimize: " + "; ".join(f"{p.card.op}: {p.reason}" for p in skipped[:5]))
        raise UsageError("no card to optimize: " + ("; ".join(f"{p.card.op}: {p.reason}" for p in skipped[:5])
                                                    or "the session has no cards"))
    progress = _Progress(quiet=False, cards_total=len(chosen), iterations=args.iterations)
    started = time.monotonic()
    dollars_before = session.store.dollars()
    try:
        run = session.optimize(proposer=proposer, policy=args.policy, iterations=args.iterations,
                               dollars=run_dollars, ops=ops, include_vendor=args.include_vendor,
                               max_cards=args.max_cards, background=True, on_event=progress, cluster=cluster)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except RuntimeError as exc:
        if cluster is None:
            raise
        cluster.close()
        raise UsageError(f"--cluster {args.cluster}: {exc}") from None
    interrupted = _wait(run)
    if cluster is not None and run.done:
        cluster.close()     # the actors are not needed to print or export the results
    seconds = time.monotonic() - started
    results = session.results
    # NB: a card whose proposer never produced a candidate (a layout or dtype it does not cover):
    # the proposer's own words say why, not "no candidate was evaluated".
    out_of_reach = {key: msg for key, msg in progress.proposer_failures.items() if key not in progress.evaluated}
    resume_cmd = f"kforge optimize --resume --workdir {session.workdir}"
    summary = {
        "winners": [{"key": r.key, "op": r.op, "signature": r.signature, "winner_speedup": r.winner_speedup,
                     "speedup_low": r.speedup_low, "speedup_high": r.speedup_high, "confirmed": r.confirmed}
                    for r in results.winners],
        "noisy_verdicts": [{"key": r.key, "signature": r.signature, "reason": r.reason} for r in results.noisy],
        "searched": sum(r.status != "not searched" for r in results),
        "evaluations": progress.evaluations,
        "proposer_failures": progress.progress.proposer_failures,
        "dollars": session.store.dollars() - dollars_before,
        "dollars_total": session.store.dollars(),
        "seconds": round(seconds, 3),
        "state": run.state.value,
        "interrupted": interrupted,
        "error": None if run.error is None else f"{type(run.error).__name__}: {run.error}",
        "skipped": [{"key": p.card.key, "signature": p.card.signature, "reason": p.reason} for p in skipped],
        "out_of_reach": [{"key": k, "reason": m} for k, m in out_of_reach.items()],
        "noisy": [c.key for c in cards.noisy],
        "uncaptured": dict(cards.uncaptured),
        "outside": dict(cards.outside),
        "resume": resume_cmd,
    }
    checked: list = []   # the table's eager verdicts of the rewrites, which the export states
    if ((summary["winners"] or rewrites) and not interrupted and run.error is None and modes is not None
            and session.model is not None):
        # NB: the cards' speedups are each card's calls alone; what the model gets is timed here, whole
        try:
            table = session.end_to_end(compile=bool(modes), modes=modes, progress=True, rewrites=rewrites)
            summary["model"] = table.to_json()
            # NB: the export states the eager verdicts the table showed rather than timing the model again (two
            # timings of one rewrite could disagree on a noisy machine); a row that failed leaves it to the export
            eager = [r for r in table.rows if r.rewrite is not None and r.rewrite.mode == "eager"]
            if rewrites and len(eager) == len(rewrites) and not any(r.error for r in eager):
                checked = [r.rewrite for r in eager]
        except Exception as exc:  # noqa: BLE001 - the search's results are stored; say why the model was not timed
            summary["model"] = {"error": f"{type(exc).__name__}: {exc}", "headline": []}
    elif not summary["winners"] and not rewrites and modes is not None and not interrupted and run.error is None:
        summary["end_to_end"] = "no winner and no rewrite: it runs as it did, on eager"
    exported = None
    if args.export and not interrupted and run.error is None:
        from .deploy import read_manifest, rewrites_of

        exported = str(session.export(args.export, rewrites=rewrites, checked=checked))
        manifest = read_manifest(exported)
        summary["exported"] = {"path": exported, "kernels": len(manifest["kernels"]),
                               "rewrites": [v.to_json() for v in rewrites_of(manifest)[0]]}
    if args.json:
        print(json.dumps({"workdir": str(session.workdir), "device": session.device, "summary": summary,
                          "results": results.to_records()}, indent=2, default=str))
    else:
        print(results.table())
        for line in _optimize_summary(summary, cards):
            print(line)
    if interrupted:
        print(f"kforge: interrupted: {progress.evaluations} evaluation(s) of this run and every earlier one are "
              f"kept in {session.workdir}; resume with: {resume_cmd}", file=sys.stderr)
        return INTERRUPTED
    if run.error is not None:
        print(f"kforge: error: the run failed: {summary['error']}; what it stored is kept; resume with: "
              f"{resume_cmd}", file=sys.stderr)
        return 1
    return 0


def _short(signature: str, width: int = 70) -> str:
    """A signature cut at an argument's end, not inside a word, marked as cut."""
    if len(signature) <= width:
        return signature
    cut = signature.rfind(", ", 0, width)
    return signature[:cut if cut > 0 else width] + ", …)"


def _optimize_summary(summary: dict, cards) -> list[str]:
    from .session import as_flags

    lines = []
    for s in summary["skipped"]:
        lines.append(f"not searched: {_short(s['signature'])}: {as_flags(s['reason'])}")
    for s in summary["out_of_reach"]:
        lines.append(f"out of reach: {s['reason']}")
    if summary["noisy"]:
        lines.append(f"warning: {len(summary['noisy'])} card timing(s) at capture were too noisy to trust "
                     f"({', '.join(k[:8] for k in summary['noisy'])}); capture again on a quieter machine, or with "
                     "a larger timing budget (Session.capture(timing_budget_ms=...))")
    if cards.outside:
        lines.append("outside kforge's operators (stay eager): "
                     + ", ".join(f"{n} x{k}" for n, k in cards.outside))
    for w in summary["winners"]:
        interval = f" ({w['speedup_low']:.2f}-{w['speedup_high']:.2f})" if w["speedup_low"] else ""
        lines.append(f"winner: {w['winner_speedup']:.2f}x {'confirmed' if w['confirmed'] else 'single timing'}"
                     f"{interval} over the judge's eager: {_short(w['signature'])}")
    for n in summary.get("noisy_verdicts", ()):
        lines.append(f"noisy, stays on eager: {_short(n['signature'])}: {n['reason']}")
    failed = summary.get("proposer_failures") or 0
    lines.append(f"{len(summary['winners'])} winner(s), {summary['evaluations']} evaluation(s)"
                 + (f", {failed} proposer failure(s)" if failed else "")
                 + f", ${summary['dollars']:.2f} of LLM calls, {summary['seconds']:.1f} s")
    if "model" in summary and summary["model"].get("error"):
        lines.append(f"the model could not be timed with the winners: {summary['model']['error']}")
    elif "model" in summary:
        lines.append("the model, timed whole in this process with and without the winners"
                     + (" and rewrites" if any(r.get("rewrite") for r in summary["model"].get("rows", ()))
                        else "") + " (what it gets):")
        lines += [f"  {line}" for line in summary["model"]["headline"]]
    elif summary["winners"]:
        # NB: a search times each card's calls alone, never the model: on this CPU a group_norm winner confirmed at
        # 3.24x made its model (79% group_norm) 1.044x faster
        lines.append("the model: not timed by this search (each speedup above is one card's calls against eager, "
                     "alone); to time the whole model with the winners, eager and compiled: "
                     f"Session.open({summary['resume'].split('--workdir ')[-1]!r}, model=..., inputs=...).end_to_end() "
                     "in Python")
    elif summary.get("end_to_end") is not None:
        lines.append(f"the model: not timed ({summary['end_to_end']})")
    lines.append(f"store: {summary['resume'].split('--workdir ')[-1]}  (resume with: {summary['resume']})")
    if "exported" in summary:
        lines.append(f"exported {summary['exported']['kernels']} kernels to {summary['exported']['path']}")
        for v in summary["exported"].get("rewrites", ()):
            lines.append(f"  {v['name']}: {'kept' if v['kept'] else 'left out'}: {v['why']}")
    return lines


# ----------------------------------------------------------------------------- show, doctor


def cmd_show(args: argparse.Namespace) -> int:
    from .session import Session

    session = Session.open(args.workdir)
    if session._cards is None:
        raise UsageError(f"{args.workdir} holds a session with no capture yet: run kforge capture or optimize")
    cards, results = session.cards, session.results
    if args.json:
        print(json.dumps({"workdir": str(session.workdir), "device": session.device, "readonly": session.store.readonly,
                          **_cards_json(cards), "results": results.to_records()}, indent=2, default=str))
    else:
        print(f"session in {session.workdir} on {session.device}"
              + (" (opened read-only)" if session.store.readonly else ""))
        print(cards.table(args.limit, judge_eager_us={r.key: r.judge_eager_us for r in results}))
        print(results.table())
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import doctor

    results = doctor.checks()
    if args.json:
        print(json.dumps({"healthy": doctor.healthy(results), "checks": doctor.as_json(results)}, indent=2))
    else:
        print(f"kforge {__version__}")
        print(doctor.report(results))
    return 0 if doctor.healthy(results) else 1


def build_parser() -> argparse.ArgumentParser:
    from .examples import EXAMPLES

    parser = _Parser(
        prog="kforge", description="Capture the operators a PyTorch model runs and search for faster kernels.")
    parser.add_argument("--version", action="version", version=f"kforge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--example", default="tiny_cnn", choices=EXAMPLES, help="built-in example model (default tiny_cnn)")
        p.add_argument("--model", help="'module:function' returning (model, example_inputs); the current folder is "
                                       "importable")
        p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
        p.add_argument("--workdir", default=None, help="where the session's store lives (default: a new temp dir)")
        p.add_argument("--vendor-chains", dest="vendor_chains", action="store_true", default=None,
                       help="a matrix product or convolution and the chain after it as one vendor_chain card "
                            "(Session.capture(vendor_chains=True); off by default)")

    p = sub.add_parser("capture", help="run a model, record its operators, print the card table")
    model_args(p)
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.add_argument("--limit", type=int, default=None, help="print at most this many cards")
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("optimize", help="capture, then search for faster kernels for the cards")
    model_args(p)
    # NB: the run's options default to None here: a resumed run takes what is not given from the run it continues
    # (_run_options), a fresh one from _RUN_OPTIONS
    p.add_argument("--resume", action="store_true",
                   help="continue the session in --workdir, with the options of the run it continues (those given "
                        "here replace them; the dollar limit is what is left of it)")
    p.add_argument("--proposer", default=None, help="builtin (default), anthropic, openai, local:URL")
    p.add_argument("--policy", "--strategy", dest="policy", default=None, choices=("mcts", "linear", "best_of_n"),
                   help="search policy: which candidate to revise next (default mcts; --strategy is its old name)")
    p.add_argument("--iterations", type=int, default=None, help="candidates per card, in all its runs (default 50)")
    p.add_argument("--dollars", type=float, default=None, help="stop when this run's LLM spending reaches this")
    p.add_argument("--ops", default=None, help="comma-separated operators to optimize (default: all native)")
    p.add_argument("--include-vendor", action="store_true", default=None,
                   help="also search operators whose eager kernel is a vendor library's (cuBLAS, cuDNN, flash "
                        "attention; oneDNN, BLAS on the CPU)")
    p.add_argument("--max-cards", type=int, default=None, help="optimize at most this many cards")
    p.add_argument("--cluster", default=None, metavar="ray[:ADDRESS]",
                   help="judge on a Ray cluster's GPUs (or CPU core groups): 'ray' finds or starts one, "
                        "'ray:ADDRESS' connects to that one; needs pip install \"kforge[ray]\"")
    p.add_argument("--export", default=None, help="write the winners to this artifact directory")
    p.add_argument("--end-to-end", dest="end_to_end", default="eager", metavar="MODES",
                   help="after a run with winners, time the whole model with and without them in these modes, "
                        "comma-separated: eager, default, max-autotune, reduce-overhead (torch.compile's), or none "
                        "(default: eager, seconds; each compile mode takes minutes on a CPU)")
    p.add_argument("--rewrites", default=None, metavar="NAMES",
                   help="inference rewrites, comma-separated (fold_batch_norm: an eval batch norm folded into the "
                        "convolution before it): timed as rows of their own in the --end-to-end table, and written "
                        "with their verdicts into the --export artifact; each kept only where the output stays "
                        "eager's and the model measures faster")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout (progress on stderr)")
    p.add_argument("--limit", type=int, default=None, help="print at most this many cards")
    p.set_defaults(func=cmd_optimize)

    p = sub.add_parser("show", help="print a session's cards and results (works on a read-only workdir)")
    p.add_argument("--workdir", required=True, help="the session's folder (the one a capture or optimize printed)")
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.add_argument("--limit", type=int, default=None, help="print at most this many cards")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("doctor", help="what this machine can do with kforge, and what to install for the rest")
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .capture import CaptureError
    from .store import WorkdirError

    try:
        if getattr(args, "resume", False) and not args.workdir:
            raise UsageError("--resume needs --workdir: the folder of the session to continue")
        return args.func(args)
    except (UsageError, CaptureError, WorkdirError) as exc:
        print(f"kforge: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kforge: interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
