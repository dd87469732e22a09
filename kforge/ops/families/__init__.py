"""The operator families, one folder each (``kforge.ops._family``): importing this package registers every folder
in it, in the order of their names (the finder lists a graph's fused operators family by family in that order).
Adding a family is adding a folder."""
from __future__ import annotations

import importlib
import pkgutil

for _folder in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg):
    importlib.import_module(f"{__name__}.{_folder}")
