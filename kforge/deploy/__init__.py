"""Deploy: run the winners inside the unmodified model; export and reload them."""
from __future__ import annotations

from ._artifact import ArtifactError, ExportedKernel, export_artifact, load_artifact, read_manifest
from ._deployment import Deployment
from ._graph import register_aten_pass
from ._launch import DeployedKernel

__all__ = ["ArtifactError", "DeployedKernel", "Deployment", "ExportedKernel", "export_artifact", "load_artifact",
           "read_manifest", "register_aten_pass"]
