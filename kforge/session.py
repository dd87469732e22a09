"""The user's handle: capture a model, optimize its cards, apply or export the winners."""
from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from .capture import Batches, CaptureError, CaptureLimits, Cards, capture_cards
from .rewrites import as_rewrites
from .store import Store, WorkdirError

if TYPE_CHECKING:
    from .deploy import Deployment, DeploymentPlan, DispatchCost, EndToEnd, ReadyKernels, RewriteVerdict
    from .evaluate import Evaluator
    from .kernels import DeviceInfo
    from .search import OptimizationRun, Results


def model_fingerprint(model: Any) -> str:
    """Architecture identity: class plus every parameter's name, shape and dtype (not values)."""
    h = hashlib.sha256(type(model).__qualname__.encode())
    if isinstance(model, torch.nn.Module):
        for name, p in model.named_parameters():
            h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
    return h.hexdigest()[:16]


# The Python API's words in kforge's messages, and the command line's (and magics') for the same thing
_FLAGS = (('device="cuda" was asked for', "--device cuda was asked for"), ('use device="cpu"', "use --device cpu"),
          ("pass include_vendor=True", "pass --include-vendor"))


def as_flags(message: str) -> str:
    """A message of the Python API in the command line's words: its flags, not the keywords."""
    for keyword, flag in _FLAGS:
        message = message.replace(keyword, flag)
    return message


def resolve_device(device: str | torch.device | None) -> str:
    """The device a session runs on; a clear error for one kforge cannot use."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    device = str(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CaptureError(
            'device="cuda" was asked for, but this machine has no usable CUDA GPU (torch.cuda.is_available() '
            'is False): use device="cpu" to run kforge\'s CPU backend, or run on a GPU machine')
    if device != "cpu" and not device.startswith("cuda"):
        raise CaptureError(f"device {device!r} is not supported: use 'cuda', 'cuda:N' or 'cpu'")
    return device



def _checked_verdicts(names: tuple[str, ...], checked: Sequence[Any]) -> list | None:
    """``Session.export``'s ``checked``, one eager verdict per name in ``names`` in their order, or None where none was
    given. Raises ValueError, saying what to pass, for anything else."""
    from .deploy import RewriteVerdict

    if not checked:
        return None
    by_name: dict[str, Any] = {}
    for v in checked:
        if not isinstance(v, RewriteVerdict):
            raise ValueError(f"checked: {v!r} is not a rewrite verdict; pass the eager rows' verdicts of "
                             "end_to_end(rewrites=...): [r.rewrite for r in table.rows if r.rewrite]")
        if v.mode != "eager":
            continue   # NB: a compiled mode's verdict is not what apply() and kforge.load() install
        if v.rewrite in by_name:
            raise ValueError(f"checked: two eager verdicts for {v.rewrite!r}; pass one")
        by_name[v.rewrite] = v
    missing = [n for n in names if n not in by_name]
    extra = sorted(set(by_name) - set(names))
    if missing or extra:
        raise ValueError(f"checked: give one eager verdict for each rewrite exported ({', '.join(names) or 'none'})"
                         + (f"; none for {', '.join(missing)}" if missing else "")
                         + (f"; {', '.join(extra)} not exported" if extra else "")
                         + ": time them with end_to_end(rewrites=...) (its eager rows), or leave checked out")
    return [by_name[n] for n in names]

class Session:
    """One model, the inputs it runs on, and everything kforge learns about it.

    >>> model, inputs = kforge.example("tiny_cnn")
    >>> session = kforge.Session(model, inputs, device="cpu")
    >>> cards = session.capture()
    """

    def __init__(self, model: Callable | None, example_inputs: Any = None, *, device: str | None = None,
                 workdir: str | Path | None = None, limits: CaptureLimits | None = None):
        device = resolve_device(device)
        self.model = model
        self.device = device
        self.batches = Batches(example_inputs) if isinstance(example_inputs, Batches) else Batches([example_inputs])
        self.limits = limits or CaptureLimits()
        if workdir is None:
            workdir = tempfile.mkdtemp(prefix="kforge-")
        self.workdir = Path(workdir)
        self.store = Store(self.workdir)
        self._cards: Cards | None = None
        self._evaluator = None
        self._extra_evaluators: dict[str, Evaluator] = {}
        self._cluster: Any = None        # a RayCluster this session started (cluster="ray..."), closed with it
        self._cluster_spec: Any = None
        self.run: OptimizationRun | None = None
        self.last_end_to_end: EndToEnd | None = None   # the last end_to_end() table (its headline is shown)
        if model is not None:
            self._claim_workdir(model)
        if self.store.get_meta("device") is not None:
            self._cards = self.store.load_cards() or None

    def _claim_workdir(self, model: Any) -> None:
        fp = model_fingerprint(model)
        existing = self.store.get_meta("model_fingerprint")
        if existing is not None and existing != fp:
            raise WorkdirError(
                f"{self.workdir} holds the session of a different model ({self.store.get_meta('model_class')}); "
                "use another workdir for this model, or delete that one to start over")
        self.store.set_meta("model_fingerprint", fp)
        self.store.set_meta("model_class", type(model).__qualname__)

    @classmethod
    def open(cls, workdir: str | Path, model: Callable | None = None, inputs: Any = None) -> "Session":
        """Reopen a session from its workdir: cards, candidates and results come back from disk. ``model`` (and
        ``inputs``, the example inputs as for ``Session(model, inputs)``) for what runs the model again: apply,
        compile, end_to_end, a new capture."""
        if inputs is not None and model is None:
            raise CaptureError("inputs= without model=: pass the model they are for, Session.open(workdir, model, inputs)")
        path = Path(workdir)
        if not (path / "kforge.db").exists():
            raise WorkdirError(f"{path} holds no kforge session (no kforge.db); create one with kforge.Session(model, "
                               f"inputs, workdir=...) or `kforge capture --workdir {path}`")
        store = Store(path)
        device = store.get_meta("device") or "cpu"
        store.close()
        return cls(model, inputs, device=device, workdir=path)

    # ------------------------------------------------------------------ capture

    def capture(self, *, timing_budget_ms: float | None = None, check_repeatable: bool = True,
                regions: bool = True, inductor_baseline: bool | None = None,
                vendor_chains: bool | None = None) -> Cards:
        """Run the model eagerly on the example inputs, record its operators and time each variant.

        ``regions``: also capture the model's graph (torch.compile) and add one card per fused
        region (chains of pointwise operators with at most one reduction); ``inductor_baseline``
        (default: on CUDA) times Inductor's kernel for each region too.

        ``vendor_chains`` (with ``regions``): a matrix product or a convolution together with the chain after it
        (bias, activations, residual adds, eval batch norm, a softmax or a layer or group norm) is one
        ``vendor_chain`` card, searched as one kernel that applies the chain to the product, instead of the chain's
        region card. True: every chain; False or None (default): none yet. Opt in: on the CPU kforge's C loops do not
        beat MKL's and oneDNN's products (the whole loop runs, for trying it); on CUDA the CUTLASS designs build
        but are not yet measured on a GPU, and a chain without a winner leaves its tail, once a region card, on
        eager.
        """
        if self.model is None:
            raise CaptureError("this session was opened without a model: pass model= to Session.open to capture again")
        if self.batches == [None]:
            raise CaptureError("no example inputs: pass the inputs the model runs on, e.g. Session(model, x)")
        budget = timing_budget_ms if timing_budget_ms is not None else (100.0 if self.device != "cpu" else 20.0)
        cards = capture_cards(self.model, self.batches, device=self.device, store=self.store, limits=self.limits,
                              timing_budget_ms=budget, check_repeatable=check_repeatable)
        if regions:
            from .regions import region_cards

            cards = region_cards(self.model, self.batches, cards, device=self.device, store=self.store,
                                 timing_budget_ms=budget, examples_per_variant=self.limits.examples_per_variant,
                                 inductor=self.device != "cpu" if inductor_baseline is None else inductor_baseline,
                                 max_tensor_bytes=self.limits.max_tensor_bytes,
                                 vendor_chains=vendor_chains)
        self.store.save_cards(cards)
        self.store.set_meta("device", self.device)
        self._cards = cards
        return cards

    @property
    def cards(self) -> Cards:
        if self._cards is None:
            raise CaptureError("no cards yet: call session.capture() first")
        return self._cards

    # ------------------------------------------------------------------ optimize

    def device_info(self) -> "DeviceInfo":
        """The session's device as its first run measured it: the copy bandwidth the planner ranks cards by is kept in
        the store, so a resumed run plans as the run it continues did (a CPU's bandwidth is measured in each process,
        and it moved which of two cards of near expected gain a resumed run picked)."""
        import dataclasses

        from .kernels import device_info

        info = device_info(self.device)
        key = f"bandwidth_gbs:{info.backend}:{info.name}"
        kept = self.store.get_meta(key)
        if kept is not None:
            return dataclasses.replace(info, bandwidth_gbs=float(kept))
        if not self.store.readonly:
            self.store.set_meta(key, info.bandwidth_gbs)
        return info

    @property
    def evaluator(self) -> "Evaluator":
        """The session's evaluator (one worker process for its device, started on first use)."""
        from .evaluate import Evaluator

        if getattr(self, "_evaluator", None) is None:
            self._evaluator = Evaluator(self.device)
        return self._evaluator

    def optimize(self, *, proposer: Any = "builtin", policy: Any = "mcts", iterations: int = 50,
                 dollars: float | None = None, seconds_per_card: float | None = None, parallel: int = 4,
                 ops: Sequence[str] | None = None, cards: Sequence[str] | None = None, include_vendor: bool = False,
                 max_cards: int | None = None, background: bool = False, seed: int = 0, confirm: bool = True,
                 devices: Sequence[str] | None = None, cluster: Any = None, on_event: Callable | None = None
                 ) -> "OptimizationRun":
        """Search for faster kernels for the planned cards.

        proposer: "builtin" (no network, no key), "anthropic[:model]", "openai[:model]",
        "local:<url>" or a Proposer. policy (the search policy): "mcts", "linear" or "best_of_n". Budgets:
        ``iterations`` candidates per card, ``dollars`` for the run, ``seconds_per_card``.
        ``cards`` picks cards by key (prefixes work); otherwise vendor-backed cards are skipped
        unless ``include_vendor``. With ``background=True`` it returns at once; use the returned
        run's pause(), resume(), stop() and wait(). Without it, in a notebook, the search runs in a
        thread while the cell waits and shows its live progress view (pause / resume / stop work). Re-running continues the same trees.
        ``parallel``: proposals (LLM calls) or compiles in flight at once. ``devices`` (e.g.
        ["cuda:0", "cuda:1"]) gives one evaluator per device; cards are then searched
        concurrently, one per device. ``cluster``: "ray", "ray:ADDRESS" or a ``kforge.cluster.RayCluster``
        judges on a Ray cluster's actors (one per GPU, or per CPU core group) instead; proposals and
        the store stay in this process (needs ``pip install "kforge[ray]"``).
        """
        from .proposers import make_proposer
        from .search import Budget, OptimizationRun, make_policy, plan

        if iterations < 1:
            raise ValueError("iterations must be at least 1")
        if dollars is not None and dollars <= 0:
            raise ValueError("dollars must be positive (or None for no dollar budget)")
        prop = make_proposer(proposer)
        info = self.device_info()
        chosen, skipped = plan(self.cards, info, ops=ops, keys=cards, include_vendor=include_vendor,
                               max_cards=max_cards)
        if not chosen:
            raise ValueError("no card to optimize: " + ("; ".join(f"{p.card.op}: {p.reason}" for p in skipped[:5])
                                                       or "the session has no cards"))
        budget = Budget(iterations=iterations, dollars=dollars, seconds_per_card=seconds_per_card,
                        parallel=parallel, confirm=confirm)
        if cluster is not None and devices:
            raise ValueError("pass devices= (this machine's devices) or cluster= (a Ray cluster's), not both")
        evaluators = self._evaluators(devices) if cluster is None else self._cluster_evaluators(cluster)
        run = OptimizationRun(store=self.store, evaluator=evaluators, proposer=prop,
                              policy=make_policy(policy), planned=chosen, device=info, budget=budget,
                              seed=seed, on_event=on_event)
        self.run = run
        if not background:
            from .views._live import run_live

            if run_live(run):   # in a notebook: the search in a thread, its progress shown while the cell waits
                return run
        return run.start(background)

    def _evaluators(self, devices: Sequence[str] | None) -> list["Evaluator"]:
        from .evaluate import Evaluator
        from .kernels import backend_of

        if not devices:
            return [self.evaluator]
        out = []
        for i, d in enumerate(devices):
            d = resolve_device(d)
            if backend_of(d) != backend_of(self.device):
                raise ValueError(f"device {d!r} is not of the session's backend ({self.device!r})")
            if i == 0 and d in (self.device, self.evaluator.device):
                out.append(self.evaluator)
                continue
            key = f"{d}#{i}"
            if key not in self._extra_evaluators:
                self._extra_evaluators[key] = Evaluator(d)
            out.append(self._extra_evaluators[key])
        return out

    def _cluster_evaluators(self, cluster: Any) -> list:
        """One evaluator per actor of a Ray cluster; a cluster named by a string is the session's to close."""
        from .cluster import RayCluster
        from .kernels import backend_of

        if not isinstance(cluster, RayCluster):
            if self._cluster is None or self._cluster_spec != cluster:
                if self._cluster is not None:
                    self._cluster.close()
                self._cluster, self._cluster_spec = RayCluster.from_spec(str(cluster)), cluster
            cluster = self._cluster
        return cluster.evaluators(backend_of(self.device))

    @property
    def results(self) -> "Results":
        """Per card: status (winner / eager / not searched), speedup, candidates tried, cost."""
        from .search import Results

        return Results(self.cards, self.store)

    def winners(self) -> list:
        """(card, winning candidate) for every card whose search found a winner.

        The candidate's ``speedup`` is the card's (``results``' ``winner_speedup``): its timings pooled."""
        out = []
        for r in self.results.winners:
            out.append((self.cards[r.key], self.store.candidate(r.winner_id)))
        return out

    # ------------------------------------------------------------------ deploy

    def deployment_plan(self, *, all_winners: bool = False, dispatch_cost: DispatchCost | None = None,
                        uncaptured: bool = False) -> "DeploymentPlan":
        """What ``apply()`` and ``export()`` start from: every card's winner with what it is expected to save per
        forward (``kernels``), less the operators whose winners save less than dispatching them costs the host
        (``left_out``, each with why; ``all_winners=True`` leaves none out). ``compile()`` and ``end_to_end()``
        start from it with ``all_winners=True``, their model-level checks in place of the filter."""
        from .deploy import plan_deployment

        # NB: rewrites alone need no cards: a session not captured deploys no kernel
        cards = self.cards if self._cards is not None or not uncaptured else []
        return plan_deployment(cards, self.store, device=self.device, all_winners=all_winners,
                               dispatch_cost=dispatch_cost)

    def _deployable(self, all_winners: bool, dispatch_cost: DispatchCost | None = None,
                    uncaptured: bool = False) -> "ReadyKernels":
        """The deployment plan's kernels ready in this process (a CPU kernel served by a sandboxed worker, a CUDA
        kernel replayed from its recorded launch plan), each re-checked here against eager on its card's captured
        examples and fresh inputs; those that are not, left out with why (``kforge.deploy.make_ready``)."""
        from .deploy import make_ready

        plan = self.deployment_plan(all_winners=all_winners, dispatch_cost=dispatch_cost, uncaptured=uncaptured)
        return make_ready(plan, self.evaluator if plan.kernels else None, self.store)

    def apply(self, model: Any = None, *, scope: str = "model", all_winners: bool = False,
              dispatch_cost: DispatchCost | None = None, rewrites: Sequence[str] = ()) -> "Deployment":
        """Make the model run the winners: exact-signature calls use the kernel, all else eager.

        Region and fused-operator winners (several torch calls each) run in the model's forward captured
        once as a graph (dynamo + AOTAutograd, no Inductor: the rest of the graph runs op by op), put on the
        model instance while the deployment is installed; the plain forward runs where a kernel cannot (grad
        needed, another shape's regions stay as traced, a forward dynamo cannot capture: ``Deployment.skipped``
        says so). They need scope="model": a process-wide deployment lists them in ``skipped``.

        Returns a Deployment: ``remove()`` undoes it, and ``with session.apply(): ...`` scopes it.
        With scope="model" (default) the kernels are active only inside this model's forward;
        scope="process" activates them for every torch call in the process. An operator's winners
        are left out when their saving per forward is below what dispatching that operator costs
        the host (see ``Deployment.skipped``); ``all_winners=True`` installs every winner. That cost
        is measured once in this process (``kforge.deploy.measure_dispatch_cost``);
        ``dispatch_cost=DispatchCost(hit_us, miss_us)`` or ``KFORGE_DISPATCH_COST=hit_us,miss_us`` gives it.
        Where region or fused-operator winners would run in the captured forward, the session's model is
        first timed on its inputs with them and without them (interleaved, in this process): they are
        installed only if the model is measurably faster with them, since the captured forward's own cost
        (guards, the graph run op by op) can exceed what they save; ``all_winners=True`` skips that check.

        ``rewrites``: inference rewrites made in that captured forward (``kforge.rewrites``; ``"fold_batch_norm"``
        folds each eval-mode batch norm into the convolution before it). Each is kept only where the model's output
        with it is eager's on the session's inputs and on fresh ones, and the model measures faster with it (timed
        as above); ``all_winners=True`` makes them unchecked. ``Deployment.skipped`` says why one was left out.
        """
        return self._deployment(model, scope, all_winners, dispatch_cost, rewrites).install()

    def _deployment(self, model: Any, scope: str, all_winners: bool, dispatch_cost: DispatchCost | None,
                    rewrites: Sequence[str]) -> "Deployment":
        """What ``apply()`` installs, checked as it says, not yet installed."""
        from .deploy import graph_forward_pays
        from .deploy import add_rewrites

        if scope not in ("model", "process"):
            raise ValueError("scope is 'model' or 'process'")
        model = model if model is not None else self.model
        if scope == "model" and not isinstance(model, torch.nn.Module):
            raise ValueError("scope='model' needs an nn.Module (pass model=, or use scope='process')")
        ready = self._deployable(all_winners, dispatch_cost, uncaptured=bool(rewrites))
        # NB: timed on the session's inputs: another model, or none, has nothing to time and keeps them
        if not all_winners and scope == "model" and model is self.model and self.batches != [None]:
            ready = graph_forward_pays(ready, model, self._forward(), self.device)
        deployment = ready.deployment(model if scope == "model" else None)
        inputs = self._inputs() if model is self.model and self.batches != [None] else None
        return add_rewrites(deployment, rewrites, model=model if scope == "model" else None, inputs=inputs,
                            device=self.device, checked=not all_winners)

    def _inputs(self) -> tuple[tuple, dict]:
        from .capture import split_batch

        if self.model is None or self.batches == [None]:
            raise CaptureError("this needs the model and its inputs: Session(model, inputs), or for a stored "
                               "session Session.open(workdir, model=model, inputs=inputs)")
        return split_batch(self.batches[0])

    def _forward(self) -> Callable[[Any], Any]:
        """``forward(model)``: the model run on the session's first example batch."""
        args, kwargs = self._inputs()
        return lambda m: m(*args, **kwargs)

    def compile(self, model: Any = None, *, guard: bool = True, backend: str = "inductor",
                rewrites: Sequence[str] = (), **torch_compile_kwargs: Any) -> Any:
        """The model compiled by torch.compile with the winners inside its graphs.

        Each call whose operator and exact signature has a winner becomes a ``torch.ops.kforge.run``
        node; Inductor compiles everything else in the given ``mode`` ("default", "max-autotune",
        "reduce-overhead"); other keyword arguments go to torch.compile (``dynamic=False``,
        ``fullgraph=True``, ...). With ``guard=True`` (default) the compiled model's forward on the
        session's inputs is timed with and without the kernels against plain torch.compile in the
        same mode, and kernels that do not make it measurably faster are left out (the result's
        ``kforge_fallback`` says which and by how much), as are kernels no call in the compiled graphs
        matches and a kept set that moves the output from eager's further than plain compile does. ``result.kforge_backend.graphs`` lists what
        each compiled graph got. ``backend="eager"`` skips Inductor (debugging).
        ``rewrites`` (as in ``apply``) are made in the compiled graphs' ATen graphs, each kept with ``guard`` only
        where the model compiled with it is faster than without and its output eager's (``result.kforge_rewrites``
        says so); Inductor folds no batch norm by default (only with ``freezing``, where kforge leaves it to it).
        """
        from .deploy import compile_rewritten

        model = model if model is not None else self.model
        ready = self._deployable(all_winners=True, uncaptured=bool(rewrites))
        forward = self._forward() if guard and ready.kernels else None
        inputs = self._inputs() if rewrites and guard and model is self.model and self.batches != [None] else None
        return compile_rewritten(model, ready, forward, device=self.device, guard=guard, backend=backend,
                                 rewrites=rewrites, inputs=inputs, **torch_compile_kwargs)

    def end_to_end(self, *, compile: bool = True, modes: Sequence[str] = ("default", "max-autotune", "reduce-overhead"),
                   guard: bool = True, compile_backend: str = "inductor", all_winners: bool = False,
                   compare: Callable | None = None, on_mode: Callable[["EndToEnd"], None] | None = None,
                   progress: bool | Callable[[str], None] = True, rewrites: Sequence[str] = ()) -> "EndToEnd":
        """The model's forward on the first example batch, in one run: eager, torch.compile in each of
        ``modes``, and each of them with kforge, timed interleaved against its baseline, with outputs
        compared with eager's. With ``guard=True`` each mode keeps only the kernels that make the
        model measurably faster in that mode (the report's ``fallback`` says which were left out).
        ``compare`` replaces the timer (a ``deploy._fallback.Compare``). ``on_mode`` gets the table so far
        after eager and after each compile mode (to save what a long run has before it is cut).
        ``progress``: a line on stderr as each mode is compiled and timed, and each mode's result as it ends
        (True, the default: a run takes minutes on a CPU); False for none, or a callable to take the lines.
        The table's ``headline()`` is the model-level result per mode; the session keeps the last table
        (``last_end_to_end``), which its display shows beside the cards.

        ``rewrites`` (as in ``apply``): in each mode, the model with what that mode kept and each rewrite, timed in
        the same run against the same model without it ("eager + kforge + fold_batch_norm" against "eager + kforge";
        "compile default + fold_batch_norm" against "compile default" where that mode kept no kernel), a row of its
        own; checked as ``apply`` and ``compile`` check it (the output eager's, the model measurably faster), so a
        rewrite that is not kept shows no time, only why."""
        import sys

        from .deploy import RewriteRows, measure

        if progress is True:
            say = lambda line: print(f"kforge end_to_end: {line}", file=sys.stderr, flush=True)  # noqa: E731
        else:
            say = progress or None
        args, kwargs = self._inputs()
        names = as_rewrites(rewrites)
        ready = self._deployable(all_winners or guard, uncaptured=bool(names))  # the check replaces the filter
        table = measure(self.model, args, kwargs, ready.kernels, ready.expected_savings_us, device=self.device,
                        modes=modes, compile=compile, guard=guard, backend=compile_backend, compare=compare,
                        skipped=ready.skipped, on_mode=on_mode, progress=say,
                        rewrites=RewriteRows(names) if names else None)
        self.last_end_to_end = table
        return table

    def export(self, path: str | Path, *, all_winners: bool = False, dispatch_cost: DispatchCost | None = None,
               rewrites: Sequence[str] = (), checked: Sequence["RewriteVerdict"] = ()) -> Path:
        """Write the winners to a self-contained artifact folder that kforge.load() installs (region and
        fused-operator winners too: ``kforge.load(model, path)`` runs them as ``apply()`` does).

        Like ``apply()``, an operator's winners are left out when dispatching it costs the host
        more than they save (``dispatch_cost`` as in ``apply``); ``all_winners=True`` exports every
        winner.

        ``rewrites`` (as in ``apply``): each is checked here as ``apply(rewrites=...)`` checks it, on the session's
        model and inputs (``all_winners=True`` leaves it unchecked), and its verdict (kept or left out, the ratio the
        model ran with it and its noise, the sites it changed) is written into the manifest with a description of
        the inputs (shapes, dtypes, value ranges; not their values). ``kforge.load`` makes the kept ones again on
        the model it loads into, once the model's output with them checks equal to its output without them.
        Nothing is exported for rewrites unless they are named here: a rewrite kept by an earlier ``apply()`` is not
        carried by itself. ``checked``: eager verdicts already decided for these rewrites on this session's model and
        inputs (the eager rows of ``end_to_end(rewrites=...)``: ``[r.rewrite for r in table.rows if r.rewrite]``),
        written as they are instead of timing the model again, so that the artifact states the verdict its user was
        shown; one for each name in ``rewrites``, or none.
        """
        from .deploy import export_plan

        names = as_rewrites(rewrites)
        given = _checked_verdicts(names, checked)
        plan = self.deployment_plan(all_winners=all_winners, dispatch_cost=dispatch_cost, uncaptured=bool(names))
        verdicts, probe = (self._export_rewrites(names, all_winners, dispatch_cost, given) if names else ((), None))
        return export_plan(path, plan, self.device, self.evaluator if plan.kernels else None, rewrites=verdicts,
                           probe=probe)

    def _export_rewrites(self, names: tuple[str, ...], all_winners: bool, dispatch_cost: DispatchCost | None,
                         given: list | None = None) -> tuple[list, Any]:
        """Each rewrite's verdict for the session's model as ``apply`` would decide it (``given``: decided already),
        and the probe (``Probe``) its inputs make, or why they make none."""
        from .deploy import Probe, RewriteVerdict

        if self.model is None:
            raise CaptureError("rewrites are checked on the session's model: Session.open(workdir, model=model, "
                               "inputs=inputs) to export them")
        probe = Probe.of(*self._inputs()) if self.batches != [None] else "the exported session had no inputs"
        if given:
            return given, probe
        dep = self._deployment(self.model, "model", all_winners, dispatch_cost, names)
        try:
            checked = {v.rewrite: v for v in dep.rewrite_checks}
            why_not = dict(dep.skipped)
            verdicts = [checked.get(name) or
                        (RewriteVerdict(name, "eager", True, (), "unchecked (exported with all_winners=True)")
                         if name in dep.rewrites else RewriteVerdict(name, "eager", False, (), why_not.get(name, "")))
                        for name in names]
        finally:
            dep.remove()   # NB: never installed; stops the workers its kernels started for the check
        return verdicts, probe

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop the evaluator's worker process and close the store (the session is then done). ``with
        kforge.Session(...) as session:`` closes it at the block's end."""
        if getattr(self, "_evaluator", None) is not None:
            self._evaluator.close()
            self._evaluator = None
        for ev in self._extra_evaluators.values():
            ev.close()
        self._extra_evaluators.clear()
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
        self.store.close()

    def dashboard(self) -> Any:
        """The notebook views of this session: progress (live while a run goes), cards, trees, sources."""
        from .views import dashboard

        return dashboard(self)

    def _ipython_display_(self) -> None:
        from .views import display_session

        display_session(self)

    def __repr__(self) -> str:
        n = len(self._cards) if self._cards is not None else 0
        return f"<kforge.Session {type(self.model).__name__ if self.model is not None else '?'} on {self.device}, " \
               f"{n} cards, workdir={str(self.workdir)!r}>"
