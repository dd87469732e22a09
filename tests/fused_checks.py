"""Shared by the fused-operator tests: a fused card's built-in CPU kernel judged, then placed in the compiled graph."""
from __future__ import annotations

import torch

import kforge
from kforge.deploy import DeployedKernel, Deployment
from kforge.kernels import Kernel, compile_source


def captured(model, x, tmp_path) -> "kforge.Session":
    """A CPU session on ``model`` (in eval mode) with ``x``, captured with regions (the fused cards come from the graph
    capture); the caller closes it."""
    s = kforge.Session(model.eval(), x, device="cpu", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=2)
    return s


def judged_and_placed(session, op: str) -> DeployedKernel:
    """Search ``op``'s one card with the built-in generator (one iteration), then compile the session's model
    (aot_eager) with the correct candidate in its graph: the output must be eager's and the kernel must have run once
    in place of the chain. Returns the kernel."""
    (card,) = session.cards.by_op(op)
    session.optimize(proposer="builtin", iterations=1, cards=[card.key], confirm=False)
    (cand,) = [c for c in session.store.candidates(card.key) if c.status is not None and c.status.is_correct]
    assert cand.strategy == f"{op}.cpu.rows"
    kernel = DeployedKernel(card.variant, Kernel(compile_source(cand.source, "cpu", "native").path))
    model, x = session.model, session.batches[0]
    with torch.no_grad():
        expected = model(x)
    with Deployment([kernel], None) as dep:
        torch._dynamo.reset()
        compiled = dep.compile(model, backend="aot_eager", dynamic=False)
        with torch.no_grad():
            got = compiled(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert kernel.calls == 1, f"the {op} kernel ran in place of the chain it stands for"
    torch._dynamo.reset()
    return kernel
