"""The deployment plan: one record of what a deployment installs, what each kernel is expected to save, and what
was left on eager and why, computed once and read back from an exported artifact unchanged."""
from __future__ import annotations

import torch
import torch.nn as nn

import kforge
from kforge.deploy import DispatchCost, LeftBy, make_ready, plan_of_artifact
from kforge.ops import CardStatus, CardVerdict
from kernel_files import kernel_source


class Chain(nn.Module):
    def forward(self, x):
        return torch.tanh(x).softmax(-1) * 2.0


def _session(tmp_path, verdicts: dict[str, dict]) -> kforge.Session:
    """A captured session (no search) whose cards of the ops named in ``verdicts`` have a winner with the softmax
    kernel as its source and that verdict's figures (nothing here runs the kernel but what the test asks for)."""
    torch.manual_seed(0)
    model = Chain()
    s = kforge.Session(model, torch.randn(16, 300), device="cpu", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=2, regions=False)
    src = kernel_source("cpu", "softmax_rows")
    for op, figures in verdicts.items():
        card = s.cards.by_op(op)[0]
        cid = s.store.add_candidate(card.key, None, "test", figures.pop("source", src), intent="hand-written")
        s.store.save_result(card.key, CardVerdict(CardStatus.WINNER, "test", winner_id=cid, candidates=1, **figures))
    return s


def test_a_verdict_with_an_eager_time_and_no_kernel_time_gets_one_kernel_time(tmp_path):
    """The kernel's time is the verdict's eager time over its speedup, never the capture's eager time over it: the
    dispatch filter and the model-level check read the same saving (the filter once read the kernel's time off the
    capture's eager time and the check off the verdict's, so they weighed two savings for one kernel)."""
    s = _session(tmp_path, {"softmax": {"winner_speedup": 2.0, "eager_us": 100.0, "kernel_us": None}})
    card = s.cards.by_op("softmax")[0]
    assert card.eager_us != 100.0
    (k,) = s.deployment_plan(all_winners=True).kernels
    assert (k.eager_us, k.kernel_us) == (100.0, 50.0)
    assert k.saving_per_forward_us == card.calls * 50.0
    # the filter weighs that saving: 50 us a call is less than a 60 us hit, more than a 40 us one
    dear = s.deployment_plan(dispatch_cost=DispatchCost(60.0, 0.0))
    assert dear.kernels == () and f"saves {card.calls * 50.0:.1f} us per forward" in dear.left_out[0].reason
    assert s.deployment_plan(dispatch_cost=DispatchCost(40.0, 0.0)).kernels == (k,)
    # the model-level checks (compile, end_to_end) rank by the same figure
    ready = s._deployable(all_winners=True)
    assert ready.expected_savings_us == [card.calls * 50.0]
    s.close()


def test_a_left_out_kernel_says_why_and_apply_shows_it(tmp_path):
    """Each kernel a deployment leaves on eager is in the plan's ``left_out`` with the step that left it out and the
    reason ``Deployment.skipped`` shows: here one weighed against the dispatch cost, one refused by the re-check in
    this process (its kernel writes zeros)."""
    zeros = kernel_source("cpu", "softmax_rows").replace("yr[c] *= inv;", "yr[c] = 0.f;")
    s = _session(tmp_path, {"softmax": {"winner_speedup": 2.0, "eager_us": 10.0, "kernel_us": 5.0, "source": zeros},
                            "tanh": {"winner_speedup": 1.01, "eager_us": 10.0, "kernel_us": 9.9}})
    cost = DispatchCost(1.0, 0.0)
    plan = s.deployment_plan(dispatch_cost=cost)
    assert [k.op for k in plan.kernels] == ["softmax"] and plan.dispatch_cost == cost
    (weighed,) = plan.left_out
    assert weighed.by is LeftBy.DISPATCH_COST and weighed.signature == s.cards.by_op("tanh")[0].signature
    assert "dispatching tanh costs about" in weighed.reason

    ready = make_ready(plan, s.evaluator, s.store)
    assert ready.kernels == ()
    assert [lo.by for lo in ready.plan.left_out] == [LeftBy.DISPATCH_COST, LeftBy.RECHECK]
    refused = ready.plan.left_out[1]
    assert refused.signature == s.cards.by_op("softmax")[0].signature and refused.reason.startswith("refused at apply")

    with s.apply(dispatch_cost=cost) as dep:
        assert dep.kernels == []
        assert [sig for sig, _ in dep.skipped] == [lo.signature for lo in ready.plan.left_out]
        assert dep.skipped[0][1] == weighed.reason
    s.close()


def test_export_then_load_reads_back_the_same_plan(tmp_path):
    """An exported artifact holds the plan's kernels as the session planned them; read back (``plan_of_artifact``,
    what ``kforge.load`` installs from) with the same dispatch cost, it is the session's plan: the same kernels in
    the same order, the same figures, the same kernels left out for the same reasons."""
    s = _session(tmp_path, {"tanh": {"winner_speedup": 1.5, "eager_us": 30.0, "kernel_us": 20.0},
                            "softmax": {"winner_speedup": 1.2, "eager_us": 12.0, "kernel_us": 10.0},
                            "mul": {"winner_speedup": 4.0, "eager_us": 8.0, "kernel_us": None}})
    every = s.export(tmp_path / "every", all_winners=True)
    for cost in (DispatchCost(0.0, 0.0), DispatchCost(5.0, 0.0), DispatchCost(50.0, 0.0)):
        assert plan_of_artifact(every, device="cpu", dispatch_cost=cost) == s.deployment_plan(dispatch_cost=cost)
    assert plan_of_artifact(every, device="cpu", all_winners=True) == s.deployment_plan(all_winners=True)
    cost = DispatchCost(5.0, 0.0)
    planned = s.deployment_plan(dispatch_cost=cost)
    assert planned.left_out and planned.kernels, "the cost was meant to leave some out and keep some"
    filtered = s.export(tmp_path / "filtered", dispatch_cost=cost)
    assert plan_of_artifact(filtered, device="cpu", all_winners=True).kernels == planned.kernels
    s.close()


def test_the_session_imports_only_what_deploy_exports():
    """``Session`` reads deploy through its package's exports (the plan and what consumes it), never its private
    modules: what they compute is deploy's to change."""
    import ast
    from pathlib import Path

    import kforge.deploy
    import kforge.session

    tree = ast.parse(Path(kforge.session.__file__).read_text())
    reached = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").lstrip(".").startswith("deploy"):
            reached += [node.module] if node.module.lstrip(".") != "deploy" else [a.name for a in node.names]
    assert reached, "the session deploys through kforge.deploy"
    private = [name for name in reached if name.startswith(".") or name not in kforge.deploy.__all__]
    assert not private, f"session.py reaches past kforge.deploy's exports: {private}"
