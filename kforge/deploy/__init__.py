"""Deploy: run the winners inside the unmodified model; export and reload them."""
from __future__ import annotations

from ._artifact import ArtifactError, ExportedKernel, export_artifact, load_artifact, read_manifest
from ._dispatch import DeployedKernel, Deployment

__all__ = ["ArtifactError", "DeployedKernel", "Deployment", "ExportedKernel", "export_artifact", "load_artifact",
           "read_manifest"]
