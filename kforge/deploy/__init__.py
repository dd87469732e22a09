"""Deploy: run the winners inside the unmodified model; export and reload them.

A deployment starts from one ``DeploymentPlan`` (``plan_deployment`` for a session, ``plan_of_artifact`` for an
exported artifact), which ``make_ready`` turns into kernels ready in this process (``ReadyKernels``)."""
from __future__ import annotations

from ._artifact import (
    ArtifactError,
    ExportedKernel,
    export_artifact,
    export_plan,
    load_artifact,
    plan_of_artifact,
    read_manifest,
    rewrites_of,
)
from ._artifact_rewrites import Probe
from ._deployment import Deployment
from ._deployment_plan import (
    DeploymentPlan,
    LeftBy,
    LeftOut,
    PlannedKernel,
    choose,
    plan_deployment,
)
from ._graph import GraphForward, register_aten_pass
from ._launch import DeployedKernel
from ._ready import ReadyKernels, make_ready
from ._report import MODES, EndToEnd, compile_checked, graph_forward_pays, measure
from ._fallback import RewriteVerdict
from ._rewrites import RewriteRows, add_rewrites, compile_rewritten
from ._select import DispatchCost, measure_dispatch_cost

__all__ = ["MODES", "ArtifactError", "DeployedKernel", "Deployment", "DeploymentPlan", "DispatchCost", "EndToEnd",
           "ExportedKernel", "GraphForward", "LeftBy", "LeftOut", "PlannedKernel", "Probe", "ReadyKernels",
           "RewriteRows", "RewriteVerdict", "add_rewrites", "choose", "compile_checked", "compile_rewritten",
           "export_artifact", "export_plan", "graph_forward_pays", "load_artifact", "make_ready", "measure",
           "measure_dispatch_cost", "plan_deployment", "plan_of_artifact", "read_manifest", "register_aten_pass",
           "rewrites_of"]
