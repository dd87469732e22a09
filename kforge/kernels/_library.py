"""A compiled kernel loaded into this process and called through the C entry point."""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Sequence

import torch

from ..ops import DTYPE_CODES, dtype_name

MAX_DIMS = 8   # KF_MAX_DIMS


class KfTensor(ctypes.Structure):
    """``kf_tensor`` of include/kforge.h, the one declaration of the kernel ABI (tests/test_abi.py compares the two)."""

    _fields_ = [("data", ctypes.c_void_p), ("ndim", ctypes.c_int32), ("dtype", ctypes.c_int32),
                ("sizes", ctypes.c_int64 * MAX_DIMS), ("strides", ctypes.c_int64 * MAX_DIMS)]


class LaunchError(RuntimeError):
    def __init__(self, code: int):
        super().__init__(f"kf_launch returned error code {code}")
        self.code = code


def describe(t: torch.Tensor | None, slot: KfTensor) -> None:
    """Fill ``slot`` with ``t``'s pointer, shape, strides and dtype (NULL for an absent tensor)."""
    if t is None:
        slot.data = None
        slot.ndim = 0
        slot.dtype = -1
        return
    if t.dim() > MAX_DIMS:
        raise ValueError(f"kforge kernels take at most {MAX_DIMS} dimensions, got {t.dim()}")
    slot.data = t.data_ptr() or None
    slot.ndim = t.dim()
    slot.dtype = DTYPE_CODES[dtype_name(t.dtype)]
    for i, (s, st) in enumerate(zip(t.shape, t.stride())):
        slot.sizes[i] = s
        slot.strides[i] = st


class Kernel:
    """One loaded library. ``launch`` is what the evaluator and the deployed model call."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._lib = ctypes.CDLL(str(self.path), mode=ctypes.RTLD_LOCAL)
        try:
            self._launch = self._lib.kf_launch
        except AttributeError:
            raise RuntimeError("the kernel does not export kf_launch; see docs/contract.md") from None
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.POINTER(KfTensor), ctypes.c_int, ctypes.POINTER(KfTensor),
                                 ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.c_int,
                                 ctypes.c_void_p, ctypes.c_void_p]
        ws = getattr(self._lib, "kf_workspace_bytes", None)
        if ws is not None:
            ws.restype = ctypes.c_size_t
            ws.argtypes = []
            self.workspace_bytes = int(ws())
        else:
            self.workspace_bytes = 0

    def prepare(self, n_inputs: int, n_outputs: int, params: Sequence[float]) -> "LaunchFrame":
        return LaunchFrame(self, n_inputs, n_outputs, params)

    def launch(self, inputs: Sequence[torch.Tensor | None], outputs: Sequence[torch.Tensor],
               params: Sequence[float], workspace: torch.Tensor | None = None, stream: int = 0) -> None:
        frame = self.prepare(len(inputs), len(outputs), params)
        frame.launch(inputs, outputs, workspace, stream)


class LaunchFrame:
    """Argument structs built once and reused: only pointers change between calls."""

    __slots__ = ("kernel", "ins", "outs", "params", "n_in", "n_out", "n_params", "_fn")

    def __init__(self, kernel: Kernel, n_inputs: int, n_outputs: int, params: Sequence[float]):
        self.kernel = kernel
        self.ins = (KfTensor * max(n_inputs, 1))()
        self.outs = (KfTensor * max(n_outputs, 1))()
        self.params = (ctypes.c_double * max(len(params), 1))(*[float(p) for p in params])
        self.n_in, self.n_out, self.n_params = n_inputs, n_outputs, len(params)
        self._fn = kernel._launch

    def launch(self, inputs: Sequence[torch.Tensor | None], outputs: Sequence[torch.Tensor],
               workspace: torch.Tensor | None = None, stream: int = 0) -> None:
        for i, t in enumerate(inputs):
            describe(t, self.ins[i])
        for i, t in enumerate(outputs):
            describe(t, self.outs[i])
        ws = workspace.data_ptr() if workspace is not None else None
        code = self._fn(self.ins, self.n_in, self.outs, self.n_out, self.params, self.n_params, ws,
                        stream or None)
        if code != 0:
            raise LaunchError(code)
