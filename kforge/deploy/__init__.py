"""Deploy: run the winners inside the unmodified model; export and reload them."""
from __future__ import annotations

from ._artifact import ArtifactError, ExportedKernel, export_artifact, load_artifact, read_manifest
from ._deployment import Deployment
from ._graph import GraphForward, register_aten_pass
from ._launch import DeployedKernel
from ._select import DispatchCost, measure_dispatch_cost

__all__ = ["ArtifactError", "DeployedKernel", "Deployment", "DispatchCost", "ExportedKernel", "GraphForward",
           "export_artifact", "load_artifact", "measure_dispatch_cost", "read_manifest", "register_aten_pass"]
