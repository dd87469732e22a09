"""A deployed CUDA kernel replayed by kforge's own launcher from its recorded plan (kernels/_plan.py).

No code of the candidate's host side runs in this process: its fat binaries are loaded with the driver API
(``cuLibraryLoadData``: context-independent kernels, launched in torch's current context), each launch's parameter
bytes are the recorded ones with the tensors' addresses filled in, and every step goes on torch's current stream
(so a replay inside CUDA graph capture is captured). Each kernel's parameter layout is checked against what the
driver says of the loaded function before the first launch: a plan that does not match its device code is refused.
"""
from __future__ import annotations

import ctypes
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from ..kernels._plan import ATTRIBUTES, LaunchPlan
from ..ops import Variant, torch_dtype

_c = ctypes
_DRIVER: Any = None
_DRIVER_LOCK = threading.Lock()


class ReplayError(RuntimeError):
    """The driver refused a step of the plan (its name says which)."""


def _driver() -> Any:
    """libcuda through ctypes, its functions typed once (the one torch's CUDA runtime already loaded)."""
    global _DRIVER
    with _DRIVER_LOCK:
        if _DRIVER is None:
            lib = _c.CDLL("libcuda.so.1")
            v, vp, u, sz, i = _c.c_void_p, _c.POINTER(_c.c_void_p), _c.c_uint, _c.c_size_t, _c.c_int
            for name, args in {
                "cuLibraryLoadData": [vp, v, v, v, u, v, v, u],
                "cuLibraryGetKernel": [vp, v, _c.c_char_p],
                "cuLibraryUnload": [v],
                "cuKernelGetParamInfo": [v, sz, _c.POINTER(sz), _c.POINTER(sz)],
                "cuKernelSetAttribute": [i, i, v, i],
                "cuDeviceGet": [_c.POINTER(i), i],
                "cuLaunchKernel": [v, u, u, u, u, u, u, u, v, vp, vp],
                "cuLaunchCooperativeKernel": [v, u, u, u, u, u, u, u, v, vp],
                "cuMemsetD8Async": [_c.c_uint64, _c.c_ubyte, sz, v],
                "cuMemcpyAsync": [_c.c_uint64, _c.c_uint64, sz, v],
                "cuGetErrorName": [i, _c.POINTER(_c.c_char_p)],
            }.items():
                fn = getattr(lib, name)
                fn.argtypes = args
                fn.restype = i
            _DRIVER = lib
        return _DRIVER


def _check(code: int, what: str) -> None:
    if code != 0:
        name = _c.c_char_p()
        _driver().cuGetErrorName(code, _c.byref(name))
        raise ReplayError(f"{what}: {name.value.decode() if name.value else code}")


@dataclass(frozen=True)
class RecordedKernel:
    """What a CUDA kernel is deployed as: its plan. ``path`` names it (no file: the plan's digest), as a loaded
    kernel's library path names one, in ``DeployedKernel.run_name``."""

    plan: LaunchPlan
    workspace_bytes: int = 0

    @property
    def path(self) -> Path:
        return Path(f"replay-{self.plan.digest[:40]}")


class _Launch:
    """One launch step, its parameter buffer and pointer table built once; only pointer words change per call."""

    __slots__ = ("kernel", "dims", "shared", "cooperative", "buffer", "view", "argv", "pointers")

    def __init__(self, kernel: int, step, device: int):
        self.kernel = kernel
        self.dims = (*step.grid, *step.block)
        self.shared = step.shared
        self.cooperative = step.cooperative
        self.buffer = _c.create_string_buffer(bytes(step.data), max(len(step.data), 1))
        self.view = memoryview(self.buffer).cast("B")
        base = _c.addressof(self.buffer)
        self.argv = (_c.c_void_p * max(len(step.params), 1))(*[base + o for o, _n in step.params])
        self.pointers = step.pointers


class PlanReplay:
    """A recorded plan replayed for one variant, with ``DeployedKernel``'s served-kernel interface: ``__call__``,
    ``checked``, ``calls``, ``close``."""

    def __init__(self, variant: Variant, recorded: RecordedKernel):
        plan = recorded.plan
        self.variant = variant
        self.plan = plan
        self.calls = 0
        self._lock = threading.Lock()
        self._index = torch.device(variant.device).index or 0
        self._outs = [(s.shape, s.stride, torch_dtype(s.dtype), torch.device(s.device)) for s in variant.outputs]
        extents = {("input", i): _bytes(s) for i, s in enumerate(variant.inputs) if s is not None}
        extents.update({("output", i): _bytes(s) for i, s in enumerate(variant.outputs)})
        if plan.workspace_bytes:
            extents[("workspace", 0)] = plan.workspace_bytes
        if (plan.n_inputs, plan.n_outputs) != (len(variant.inputs), len(variant.outputs)):
            raise ReplayError(f"the plan takes {plan.n_inputs} inputs and {plan.n_outputs} outputs, the variant "
                              f"{len(variant.inputs)} and {len(variant.outputs)}")
        plan.check(extents)
        torch.cuda.init()
        drv = _driver()
        device = _c.c_int()
        _check(drv.cuDeviceGet(_c.byref(device), self._index), "cuDeviceGet")
        self._libraries = []
        for m, image in enumerate(plan.modules):
            lib = _c.c_void_p()
            # NB: the image must outlive the library only while it loads (no CU_LIBRARY_BINARY_IS_PRESERVED)
            held = _c.create_string_buffer(bytes(image), len(image))
            _check(drv.cuLibraryLoadData(_c.byref(lib), held, None, None, 0, None, None, 0),
                   f"loading the plan's module {m}")
            self._libraries.append(lib)
        self._kernels = []
        for f, (m, name) in enumerate(plan.functions):
            k = _c.c_void_p()
            _check(drv.cuLibraryGetKernel(_c.byref(k), self._libraries[m], name.encode()),
                   f"finding kernel {name[:80]} in the plan's module {m}")
            self._kernels.append(k.value)
        # NB: each launched kernel's parameters as the driver lays them out must be the plan's: the driver reads
        # each parameter's size from the pointer the replay gives it
        checked: set[int] = set()
        for s in plan.steps:
            if s.op == "launch" and s.function not in checked:
                self._check_params(s.function, s.params)
                checked.add(s.function)
        self._steps: list[tuple[str, Any]] = []
        for s in plan.steps:
            if s.op == "attribute":
                _check(drv.cuKernelSetAttribute(s.attribute, s.value, self._kernels[s.function], device.value),
                       f"setting {ATTRIBUTES[s.attribute]} of {plan.functions[s.function][1][:80]}")
            elif s.op == "launch":
                self._steps.append(("launch", _Launch(self._kernels[s.function], s, device.value)))
            else:
                self._steps.append((s.op, s))
        self._ws = plan.workspace_bytes

    def _check_params(self, function: int, params: Sequence[tuple[int, int]]) -> None:
        drv = _driver()
        got = []
        off, size = _c.c_size_t(), _c.c_size_t()
        while len(got) <= len(params) and drv.cuKernelGetParamInfo(self._kernels[function], len(got), _c.byref(off),
                                                                   _c.byref(size)) == 0:
            got.append((off.value, size.value))
        if got != [tuple(p) for p in params]:
            raise ReplayError(f"the plan's parameters for {self.plan.functions[function][1][:80]} ({list(params)}) are "
                              f"not the loaded kernel's ({got})")

    def __call__(self, inputs: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        outs = [torch.empty_strided(shape, stride, dtype=dtype, device=dev) for shape, stride, dtype, dev in self._outs]
        ws = torch.empty((self._ws,), dtype=torch.uint8, device=self.variant.device) if self._ws else None
        base = {}
        for i, t in enumerate(inputs):
            if t is not None:
                base[("input", i)] = t.data_ptr()
        for i, t in enumerate(outs):
            base[("output", i)] = t.data_ptr()
        if ws is not None:
            base[("workspace", 0)] = ws.data_ptr()
        stream = _c.c_void_p(_raw_stream(self._index))
        drv = _driver()
        with self._lock:   # NB: the parameter buffers are shared; the driver copies them at each launch
            for op, step in self._steps:
                if op == "launch":
                    for o, slot, so in step.pointers:
                        struct.pack_into("<Q", step.view, o, base[slot] + so)
                    d = step.dims
                    if step.cooperative:
                        code = drv.cuLaunchCooperativeKernel(step.kernel, d[0], d[1], d[2], d[3], d[4], d[5],
                                                             step.shared, stream, step.argv)
                    else:
                        code = drv.cuLaunchKernel(step.kernel, d[0], d[1], d[2], d[3], d[4], d[5], step.shared, stream,
                                                  step.argv, None)
                elif op == "memset":
                    code = drv.cuMemsetD8Async(base[step.dst[0]] + step.dst[1], step.value, step.count, stream)
                else:
                    code = drv.cuMemcpyAsync(base[step.dst[0]] + step.dst[1], base[step.src[0]] + step.src[1],
                                             step.count, stream)
                _check(code, f"kforge's replay of the kernel for {self.variant.signature} ({op})")
            self.calls += 1
        return outs

    def checked(self, inputs: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        return self(inputs)

    def close(self) -> None:
        """Nothing to stop (the modules stay loaded while the process may still hold graphs that launch them)."""


def fatbin_of(library: bytes) -> bytes:
    """The first fat binary of a CUDA shared library's ``.nv_fatbin`` section, for kforge's own kernels (a candidate's
    device code comes from its recording, never from its file). ValueError where there is none."""
    if library[:4] != b"\x7fELF" or library[4] != 2:
        raise ValueError("not a 64-bit ELF library")
    shoff, = struct.unpack_from("<Q", library, 0x28)
    entsize, count, names = struct.unpack_from("<HHH", library, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", library, shoff + i * entsize) for i in range(count)]
    strtab = headers[names][4]
    for name, _type, _flags, _addr, offset, size, *_ in headers:
        end = library.index(b"\0", strtab + name)
        if library[strtab + name:end] == b".nv_fatbin" and size >= 16:
            magic, _version, header, body = struct.unpack_from("<IHHQ", library, offset)
            if magic != 0xBA55ED50 or header + body > size:
                raise ValueError("the library's .nv_fatbin section does not start with a fat binary")
            return bytes(library[offset:offset + header + body])
    raise ValueError("the library has no .nv_fatbin section")


def _bytes(sig) -> int:
    from ..evaluate._arena import extent

    return extent(sig) * torch_dtype(sig.dtype).itemsize


def _raw_stream(index: int) -> int:
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get(index) if get else torch.cuda.current_stream(index).cuda_stream


# ----------------------------------------------------------------------------- recording, for apply / export / load

_PLANS: dict[tuple[str, str], Any] = {}   # (source's SHA-256, variant key) -> LaunchPlan or the reason there is none
_PLANS_LOCK = threading.Lock()


def recorded_plan(variant: Variant, source: str, evaluator: Any, examples: Sequence = ()) -> LaunchPlan | str:
    """The launch plan of the CUDA kernel ``source`` for ``variant``, recorded in a sandboxed runner by
    ``evaluator`` (``Evaluator.record_variant``), or the reason it has none (not replayable: it stays on eager).
    Kept in memory for this process, by source and variant."""
    import hashlib

    key = (hashlib.sha256(source.encode()).hexdigest(), variant.key)
    with _PLANS_LOCK:
        if key in _PLANS:
            return _PLANS[key]
    rec = evaluator.record_variant(variant, source, examples)
    out = rec.plan if rec.plan is not None else f"not replayable: {rec.reason}"
    if not rec.infra:
        with _PLANS_LOCK:
            _PLANS[key] = out
    return out


#: CUDA kernels deploy as replayed launch plans unless this is "0". The replay was opt-in while every recording failed
#: on the H100 (the recorder's parameter-layout probe left the runtime's last error set, which the candidate's own
#: cudaGetLastError read); with that fixed, tests/test_gpu_replay.py passed on the H100 (torch 2.11, 2026-12-07).
#: "0" loads CUDA candidates in the user's process instead (hash, binary wall and re-check only: the hole
#: tests/attacks.py's CUDA attack_libc_walk shows is open there).
REPLAY_ENV = "KFORGE_CUDA_REPLAY"


def replay_enabled() -> bool:
    """Whether CUDA winners deploy as replayed plans (the default) rather than loaded in this process
    (``KFORGE_CUDA_REPLAY=0``)."""
    return os.environ.get(REPLAY_ENV, "1").strip() != "0"
