"""The dispatch fast path (``_fastpath.c``): built once per Python and source, cached, optional.

``launcher_type()`` and ``dispatch_type()`` return the compiled ``Launcher`` and ``Dispatch``
types, or None where they cannot be had (no C compiler or no Python headers: deployment then
guards in Python and launches through ctypes, correct but slower; the reason is in
``unavailable_reason()``). ``KFORGE_FASTPATH=0`` turns them off.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
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


def _module():
    if os.environ.get("KFORGE_FASTPATH", "1").lower() in ("0", "false", "no", "off"):
        return None
    with _lock:
        if "module" not in _state:
            try:
                try:
                    _state["module"] = _load(_build())
                except ImportError:  # a cached build that no longer loads: build it once more
                    _build().unlink(missing_ok=True)
                    _state["module"] = _load(_build())
            except Exception as exc:  # no compiler, no headers: the Python path still works
                _state["module"] = None
                _state["why"] = f"{type(exc).__name__}: {exc}"
        return _state["module"]


def launcher_type():
    """The C ``Launcher`` type, built on first use; None where it is unavailable or turned off."""
    module = _module()
    return None if module is None else module.Launcher


def dispatch_type():
    """The C ``Dispatch`` type (the cached dispatch front); None where unavailable or turned off."""
    module = _module()
    return None if module is None else module.Dispatch


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
    cc_args = shlex.split(cc)  # CC may carry a launcher or flags ("ccache gcc")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    digest = hashlib.sha256(SOURCE.read_bytes() + (INCLUDE_DIR / "kforge.h").read_bytes()
                            + f"{sys.version}|{include}|{cc}".encode()).hexdigest()[:20]
    out = cache_dir().parent / "fastpath" / f"_kforge_fast-{digest}{suffix}"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = Path(tmp) / out.name
        link = ["-undefined", "dynamic_lookup"] if sys.platform == "darwin" else []
        cmd = [*cc_args, "-O2", "-shared", "-fPIC", *link, f"-I{include}", f"-I{INCLUDE_DIR}", "-o", str(built),
               str(SOURCE)]
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
