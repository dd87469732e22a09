"""The launch fast path (``_fastpath.c``): built once per Python and source, cached, optional.

``launcher_type()`` returns the compiled ``Launcher`` type, or None where it cannot be had (no C
compiler or no Python headers: deployment then launches through ctypes, correct but slower; the
reason is in ``unavailable_reason()``). ``KFORGE_FASTPATH=0`` turns it off.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

from ..kernels._compile import INCLUDE_DIR, cache_dir

SOURCE = Path(__file__).with_name("_fastpath.c")
_lock = threading.Lock()
_state: dict[str, object] = {}


def launcher_type():
    """The C ``Launcher`` type, built on first use; None where it is unavailable or turned off."""
    if os.environ.get("KFORGE_FASTPATH", "1").lower() in ("0", "false", "no", "off"):
        return None
    with _lock:
        if "type" not in _state:
            try:
                _state["type"] = _load(_build()).Launcher
            except Exception as exc:  # no compiler, no headers: the ctypes path still works
                _state["type"] = None
                _state["why"] = f"{type(exc).__name__}: {exc}"
        return _state["type"]


def unavailable_reason() -> str | None:
    """Why the fast path is not in use (None when it is)."""
    if os.environ.get("KFORGE_FASTPATH", "1").lower() in ("0", "false", "no", "off"):
        return "turned off by KFORGE_FASTPATH=0"
    launcher_type()
    return _state.get("why")  # type: ignore[return-value]


def _build() -> Path:
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"Python.h is not in {include}: install this Python's development headers")
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler was found: install gcc or set CC")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    digest = hashlib.sha256(SOURCE.read_bytes() + (INCLUDE_DIR / "kforge.h").read_bytes()
                            + f"{sys.version}|{include}|{cc}".encode()).hexdigest()[:20]
    out = cache_dir().parent / "fastpath" / f"_kforge_fast-{digest}{suffix}"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = Path(tmp) / out.name
        cmd = [cc, "-O2", "-shared", "-fPIC", f"-I{include}", f"-I{INCLUDE_DIR}", "-o", str(built), str(SOURCE)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building the launch fast path failed: {(proc.stderr or proc.stdout)[-2000:]}")
        os.replace(built, out)  # atomic: a concurrent builder or reader never sees half a file
    return out


def _load(path: Path):
    spec = importlib.util.spec_from_file_location("_kforge_fast", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module
