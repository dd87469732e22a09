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
    props = torch.cuda.get_device_properties(0)  # no allocation: device_info would time a copy
    return Check("cuda device", True, f"{props.name}, sm_{props.major}{props.minor}, "
                                      f"{props.multi_processor_count} SMs, {torch.cuda.device_count()} visible")


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
    # NB: build a kernel for this GPU's architecture (sm_90 without one): a toolkit too old for the
    # GPU fails here, not in the middle of a search.
    import torch

    from .kernels import CompileError, compile_source

    arch = "sm_90"
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        arch = f"sm_{major}{minor}"
    src = (f'/* kforge doctor {os.getpid()} {time.time_ns()} */\n#include "kforge.h"\n'
           "__global__ void k(float* y) { y[threadIdx.x] = 0.f; }\n"
           "KF_ENTRY int kf_launch(const kf_tensor* i, int ni, const kf_tensor* o, int no, const double* p, "
           "int np, void* w, void* s) { k<<<1, 32, 0, (cudaStream_t)s>>>((float*)o[0].data); "
           "return (int)cudaGetLastError(); }\n")
    try:
        built = compile_source(src, "cuda", arch)
    except CompileError as exc:
        return Check("nvcc (CUDA backend)", False, f"{nvcc} (release {version}) cannot build for {arch}: "
                     f"{exc} {exc.log.strip()[-300:]}".strip(), f"install a CUDA toolkit that supports {arch}")
    built.path.unlink(missing_ok=True)
    return Check("nvcc (CUDA backend)", True, f"{nvcc} (release {version}), builds for {arch} in {built.seconds:.1f} s")


def _cpu_backend() -> Check:
    from .kernels import CompileError, compile_source

    # NB: a fresh source each time (a cached build would hide a compiler gone since), removed after.
    src = (f'/* kforge doctor {os.getpid()} {time.time_ns()} */\n#include "kforge.h"\n'
           'KF_ENTRY int kf_launch(const kf_tensor* i, int ni, const kf_tensor* o, int no, '
           'const double* p, int np, void* w, void* s) { return 0; }\n')
    try:
        built = compile_source(src, "cpu", "native")
    except CompileError as exc:
        fix = (f"fix CC (now {os.environ['CC']!r}) or unset it" if os.environ.get("CC")
               else "install gcc with OpenMP (Debian/Ubuntu: apt install gcc)")
        return Check("C compiler (CPU backend)", False, f"{exc} {exc.log.strip()[-300:]}".strip(), fix,
                     required=True)
    built.path.unlink(missing_ok=True)
    return Check("C compiler (CPU backend)", True, f"kernels build with OpenMP ({built.seconds:.2f} s)", required=True)


def _fast_path() -> Check:
    from .deploy._fast import launcher_type, unavailable_reason

    if launcher_type() is None:
        why = unavailable_reason() or "unavailable"
        if "KFORGE_FASTPATH" in why:
            fix = "unset KFORGE_FASTPATH to use it"
        elif "Python.h" in why:
            fix = "install this Python's headers (Debian/Ubuntu: apt install python3-dev)"
        else:
            fix = "make a C compiler available (gcc, or CC)"
        return Check("C dispatch path", False, why,
                     f"{fix}; applied kernels still work through Python, a few microseconds slower per call")
    return Check("C dispatch path", True, "built and loaded (applied kernels dispatch in C)")


def _cache() -> Check:
    from .kernels._compile import cache_dir

    path = cache_dir()  # creates it
    ok = os.access(path, os.W_OK)
    return Check("cache", ok, str(path.parent), "" if ok else "set KFORGE_CACHE to a writable folder", required=True)


def _module(name: str, extra: str, what: str) -> Check:
    found = importlib.util.find_spec(name) is not None
    return Check(f"{name} ({what})", found, "installed" if found else "not installed",
                 "" if found else f'pip install "kforge[{extra}]"')


def _key(env: str, provider: str, section: str) -> Check:
    from .proposers._llm import config_path, load_config

    if os.environ.get(env):
        return Check(f"{provider} key", True, f"{env} is set")
    path = config_path()
    if load_config().get(section, {}).get("api_key"):
        return Check(f"{provider} key", True, f"api_key in the [{section}] table of {path}")
    return Check(f"{provider} key", False, f"{env} is not set and {path} has no [{section}] api_key",
                 f"export {env}=... or put api_key in the [{section}] table of {path}; the built-in "
                 "proposer needs no key")


def _safely(name: str, fn, *args, required: bool = False) -> Check:
    """A check that raised is reported as failed, never as a traceback."""
    try:
        return fn(*args)
    except Exception as exc:  # the point of a doctor: report, don't crash
        return Check(name, False, f"the check itself failed: {type(exc).__name__}: {exc}",
                     "fix what the message names and run kforge doctor again", required=required)


def checks() -> list[Check]:
    """Every check, in the order a user reads them."""
    return [Check("python", True, f"{platform.python_implementation()} {platform.python_version()}"),
            _safely("torch", _torch, required=True), _safely("cuda device", _cuda),
            _safely("nvcc (CUDA backend)", _nvcc),
            _safely("C compiler (CPU backend)", _cpu_backend, required=True),
            _safely("C dispatch path", _fast_path), _safely("cache", _cache, required=True),
            _safely("anthropic", _module, "anthropic", "llm", "Anthropic proposer"),
            _safely("openai", _module, "openai", "llm", "OpenAI-compatible proposer"),
            _safely("Anthropic key", _key, "ANTHROPIC_API_KEY", "Anthropic", "anthropic"),
            _safely("OpenAI key", _key, "OPENAI_API_KEY", "OpenAI", "openai"),
            _safely("anywidget", _module, "anywidget", "notebook", "notebook views"),
            _safely("altair", _module, "altair", "notebook", "charts")]


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
