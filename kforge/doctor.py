"""``kforge doctor``: what this machine can do with kforge, and what to install for the rest.

Each check says ok, or what is missing and the one step that fixes it. Nothing here needs a
network, a key's value (only whether one is set) or a GPU.
"""
from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""          # what to do when not ok
    required: bool = False  # kforge cannot run its main job without it


def _torch() -> Check:
    import torch

    return Check("torch", True, f"torch {torch.__version__}", required=True)


def _cuda() -> Check:
    import torch

    if not torch.cuda.is_available():
        return Check("cuda device", False, "no CUDA device visible to torch",
                     "kforge still runs everything on the CPU backend; on a GPU machine install a CUDA build "
                     "of torch")
    from .kernels import device_info

    info = device_info("cuda")
    return Check("cuda device", True, f"{info.name}, {info.arch}, {info.sm_count} SMs")


def _nvcc() -> Check:
    from .kernels import find_nvcc

    nvcc = find_nvcc()
    if nvcc is None:
        return Check("nvcc (CUDA backend)", False, "nvcc not found on PATH, CUDA_HOME or /usr/local/cuda",
                     "install the CUDA toolkit (12 or 13) or set CUDA_HOME")
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
        version = next((ln.split("release")[-1].strip() for ln in out.splitlines() if "release" in ln), "")
    except (OSError, subprocess.SubprocessError) as exc:
        return Check("nvcc (CUDA backend)", False, f"{nvcc} does not run: {exc}", "reinstall the CUDA toolkit")
    return Check("nvcc (CUDA backend)", True, f"{nvcc} (release {version})")


def _cpu_backend() -> Check:
    from .kernels import CompileError, compile_source

    # NB: a fresh source each time (a cached build would hide a compiler gone since), removed after.
    src = (f'/* kforge doctor {os.getpid()} {time.time_ns()} */\n#include "kforge.h"\n'
           'KF_ENTRY int kf_launch(const kf_tensor* i, int ni, const kf_tensor* o, int no, '
           'const double* p, int np, void* w, void* s) { return 0; }\n')
    try:
        built = compile_source(src, "cpu", "native")
    except CompileError as exc:
        return Check("C compiler (CPU backend)", False, f"{exc} {exc.log.strip()[-300:]}".strip(),
                     "install gcc with OpenMP (Debian/Ubuntu: apt install gcc) or set CC", required=True)
    built.path.unlink(missing_ok=True)
    return Check("C compiler (CPU backend)", True, f"kernels build with OpenMP ({built.seconds:.2f} s)", required=True)


def _fast_path() -> Check:
    from .deploy._fast import launcher_type, unavailable_reason

    if launcher_type() is None:
        return Check("C dispatch path", False, unavailable_reason() or "unavailable",
                     "install this Python's headers (Debian/Ubuntu: apt install python3-dev); applied kernels "
                     "still work through Python, a few microseconds slower per call")
    return Check("C dispatch path", True, "built and loaded (applied kernels dispatch in C)")


def _cache() -> Check:
    from .kernels._compile import cache_dir

    path = cache_dir().parent
    ok = os.access(path, os.W_OK)
    return Check("cache", ok, str(path), "" if ok else "set KFORGE_CACHE to a writable folder", required=True)


def _module(name: str, extra: str, what: str) -> Check:
    found = importlib.util.find_spec(name) is not None
    return Check(f"{name} ({what})", found, "installed" if found else "not installed",
                 "" if found else f'pip install "kforge[{extra}]"')


def _key(env: str, provider: str) -> Check:
    from .proposers._llm import config_path

    if os.environ.get(env):
        return Check(f"{provider} key", True, f"{env} is set")
    path = config_path()
    return Check(f"{provider} key", False, f"{env} is not set",
                 f"export {env}=... or put api_key in the [{provider.lower()}] table of {path}; the built-in "
                 "proposer needs no key")


def checks() -> list[Check]:
    """Every check, in the order a user reads them."""
    out = [Check("python", True, f"{platform.python_implementation()} {platform.python_version()}"), _torch(),
           _cuda(), _nvcc(), _cpu_backend(), _fast_path(), _cache(),
           _module("anthropic", "llm", "Anthropic proposer"), _module("openai", "llm", "OpenAI-compatible proposer"),
           _key("ANTHROPIC_API_KEY", "Anthropic"), _key("OPENAI_API_KEY", "OpenAI"),
           _module("anywidget", "notebook", "notebook views"), _module("altair", "notebook", "charts")]
    return out


def report(results: list[Check]) -> str:
    width = max(len(c.name) for c in results)
    lines = []
    for c in results:
        mark = "ok  " if c.ok else ("FAIL" if c.required else "--  ")
        lines.append(f"{mark} {c.name:<{width}}  {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"     {'':<{width}}  -> {c.fix}")
    return "\n".join(lines)


def as_json(results: list[Check]) -> list[dict]:
    return [asdict(c) for c in results]


def healthy(results: list[Check]) -> bool:
    """Whether kforge's main job runs here (the required checks pass)."""
    return all(c.ok for c in results if c.required)


if __name__ == "__main__":  # pragma: no cover
    r = checks()
    print(report(r))
    sys.exit(0 if healthy(r) else 1)
