"""Launching one validated kernel: in this process (its descriptors prepared once, the C launcher or ctypes), or a
CPU candidate's through the sandboxed worker that serves it (`_worker.py`); and the winners deployed as such kernels
(``deploy_winners``: a CUDA winner replayed from its recorded plan, `_replay.py`)."""
from __future__ import annotations

import ctypes
import functools
import json
import threading
from pathlib import Path
from typing import Any, Sequence

import torch

from ..kernels import Kernel, param_vector
from ..kernels._compile import verified_bytes
from ..kernels._library import KfTensor
from ..ops import DTYPE_CODES, TensorSig, Variant, torch_dtype
from ._fast import launcher_type
from ._replay import PlanReplay, RecordedKernel, ReplayError, recorded_plan, replay_enabled
from ._worker import CheckedLibrary, ServedKernel


def _device(name: str) -> torch.device:
    return torch.device(name)


class DeployedKernel:
    """A validated kernel for one variant, with its launch arguments prepared once.

    ``kernel`` is a library loaded into this process (``Kernel``: kforge's own trusted kernels), a CUDA candidate's
    ``RecordedKernel`` (its launch plan, replayed by kforge's own launcher, ``_replay.py``: none of its host code
    runs here), or, for a CPU kernel, a ``CheckedLibrary``: its bytes, loaded only by a sandboxed worker process that serves its
    calls (``deploy._worker``; ``served`` makes one from a library file). A loaded kernel's calls go through the C
    launcher of ``_fastpath.c`` where it can be built (``fast``), else through ctypes (``fast=False`` forces that);
    both fill the same descriptors the same way. ``kernel_us``: its judged time per call (a served call's deadline
    scales with it).
    """

    def __init__(self, variant: Variant, kernel: Kernel | CheckedLibrary | RecordedKernel, candidate_id: int | None = None,
                 speedup: float | None = None, fast: bool = True, *, kernel_us: float | None = None):
        self.variant = variant
        self.kernel = kernel
        self.candidate_id = candidate_id
        self.speedup = speedup
        self.inplace = bool(variant.param_dict.get("inplace"))
        # NB: the name compiled graphs call kforge::run with. A plain attribute, computed here
        # (dynamo reads it as a constant); the same in every process for the same kernel binary
        # and variant (a graph cached on disk by another process names it); and it carries the
        # variant, so that a process without this kernel can still run the call eagerly.
        self.run_name = f"{kernel.path.stem}|{json.dumps(variant.to_json(), sort_keys=True, separators=(',', ':'))}"
        self._cuda = variant.device.startswith("cuda")
        self._index = torch.device(variant.device).index or 0 if self._cuda else 0
        self._outs = [(s.shape, s.stride, torch_dtype(s.dtype), _device(s.device)) for s in variant.outputs]
        self._in_layouts = [None if s is None else (tuple(s.shape), tuple(s.stride), torch_dtype(s.dtype), _device(s.device))
                            for s in variant.inputs]
        # calls whose input came in another layout and was copied into the variant's (under CUDA graphs:
        # counted when the graph is recorded, not on its replays)
        self.relayouts = 0
        self._lock = threading.Lock()
        n_in, n_out = len(variant.inputs), len(variant.outputs)
        self._py_calls = 0
        self._calls_before = 0   # launches that were checks, not the model's calls (reset_calls)
        self.installs = 0        # deployments that have it installed now (Deployment.install/remove)
        self.served: ServedKernel | PlanReplay | None = None
        if isinstance(kernel, RecordedKernel):
            # NB: a CUDA kernel deploys as its recorded plan, replayed by kforge's own launcher (_replay.py): none of
            # its host code runs in this process
            self.served = PlanReplay(variant, kernel)
            self._n = (n_in, n_out, 0)
            self.fast = False
            self.launch = self.served   # NB: not a bound method of self: no cycle keeps a dropped kernel's worker alive
            return
        if isinstance(kernel, CheckedLibrary):
            if self._cuda:
                raise ValueError("a CUDA kernel runs from a library loaded into this process (Kernel), not a worker")
            self.served = ServedKernel(variant, kernel, kernel_us)
            self._n = (n_in, n_out, 0)
            self.fast = False
            self.launch = self.served   # NB: not a bound method of self: no cycle keeps a dropped kernel's worker alive
            return
        self._ins = (KfTensor * max(n_in, 1))()
        self._out_structs = (KfTensor * max(n_out, 1))()
        for slot, sig in zip(self._ins, variant.inputs):
            _prefill(slot, sig)
        for slot, sig in zip(self._out_structs, variant.outputs):
            _prefill(slot, sig)
        pv = param_vector(variant)
        self._params = (ctypes.c_double * max(len(pv), 1))(*pv)
        self._n = (n_in, n_out, len(pv))
        # NB: on CUDA each call takes its workspace from the caching allocator, which orders its
        # reuse on the calling stream: launches on several streams (or graphs) never share one. On
        # the CPU the kernel runs inside the call, so one workspace, used one call at a time.
        self._ws_alloc = (functools.partial(torch.empty, (kernel.workspace_bytes,), dtype=torch.uint8,
                                            device=variant.device)
                          if kernel.workspace_bytes and self._cuda else None)
        self._workspace = (torch.empty(kernel.workspace_bytes, dtype=torch.uint8, device=variant.device)
                           if kernel.workspace_bytes and not self._cuda else None)
        self._fn = kernel._launch
        self._in_slots = list(self._ins)[:n_in]   # NB: indexing a ctypes array builds a proxy each time
        self._out_slots = list(self._out_structs)[:n_out]
        self._ws_ptr = self._workspace.data_ptr() if self._workspace is not None else None

        fast = self._fast_launcher() if fast else None
        self.fast = fast is not None   # calls go through the C launcher (else through ctypes)
        self.launch = fast if fast is not None else self._launch_py

    @classmethod
    def from_binary(cls, variant: Variant, path: Path | str, sha256: str | None = None,
                    candidate_id: int | None = None, speedup: float | None = None, *,
                    kernel_us: float | None = None) -> "DeployedKernel":
        """The kernel of the library at ``path`` deployed for ``variant`` as ``Session.apply()`` and ``kforge.load()``
        deploy a candidate: its hash and the binary wall checked first (``sha256``: the expected hash, else the
        cache object's name); a CPU kernel is then served by a sandboxed worker (nothing of it runs in this process,
        its constructors included). Raises KernelIntegrityError or BinaryRejected. A CUDA kernel is never loaded here:
        it deploys as the launch plan recorded in the sandbox (``deploy_winners``)."""
        if variant.device.startswith("cuda"):
            if replay_enabled():
                raise ValueError("a CUDA kernel deploys as its recorded launch plan, not its library "
                                 "(kforge.deploy._launch.deploy_winners)")
            # NB: until the replay passes on a GPU (deploy/_replay.py), a CUDA kernel loads here, checked first
            from ..kernels import load_verified

            return cls(variant, load_verified(path, sha256), candidate_id, speedup, kernel_us=kernel_us)
        data, digest = verified_bytes(path, sha256)
        return cls(variant, CheckedLibrary(Path(path), digest, data), candidate_id, speedup, kernel_us=kernel_us)

    def checked(self, inputs: tuple) -> list[torch.Tensor]:
        """One launch that raises where it fails, never running eager instead (the re-check before install calls
        this: a served kernel whose worker fails there is refused, not installed)."""
        if self.served is not None:
            return self.served.checked(inputs)
        return self.launch(inputs)

    def close(self) -> None:
        """Stop a served kernel's worker (its next call starts another); nothing for a loaded kernel."""
        if self.served is not None:
            self.served.close()

    def _fast_launcher(self) -> Any:
        """The C launcher for this kernel (kforge/deploy/_fastpath.c), or None without one."""
        launcher = launcher_type()
        if launcher is None or max(self._n[0], self._n[1]) > 16:
            return None
        allocs = tuple(functools.partial(torch.empty_strided, shape, stride, dtype=dtype, device=dev)
                       for shape, stride, dtype, dev in self._outs)
        stream_fn = (_GET_RAW_STREAM or _raw_stream) if self._cuda else None
        return launcher(
            ctypes.cast(self._fn, ctypes.c_void_p).value, bytes(self._ins)[:ctypes.sizeof(KfTensor) * self._n[0]],
            self._n[0], bytes(self._out_structs)[:ctypes.sizeof(KfTensor) * self._n[1]], self._n[1],
            bytes(self._params)[:ctypes.sizeof(ctypes.c_double) * self._n[2]], self._ws_alloc or self._ws_ptr, allocs,
            stream_fn, self._index, self.variant.signature, (self.kernel, self._workspace),
            not self._cuda)  # a CPU kernel runs inside the call: let other threads go meanwhile

    def conform(self, inputs: Sequence[Any]) -> list[Any] | None:
        """The inputs as this kernel takes them: each in the variant's layout (a tensor whose strides
        differ is copied into it, counted in ``relayouts``), or None when a shape, dtype or device
        differs (the call must then run the operator itself). A compiled graph calls ``kforge::run``
        with the layouts its own trace gave the call, which the lookup that placed the kernel may not
        have seen; the kernel reads memory by the variant's strides, so it never gets another."""
        out = list(inputs)
        copied = False
        for i, (t, sig) in enumerate(zip(inputs, self.variant.inputs)):
            if t is None or sig is None:
                if (t is None) != (sig is None):
                    return None
                continue
            shape, stride, dtype, dev = self._in_layouts[i]
            if t.dtype != dtype or tuple(t.shape) != shape or t.device != dev:
                return None
            got = t.stride()
            if got != stride and any(n != 1 and a != b for n, a, b in zip(shape, got, stride)):
                if not _non_overlapping(shape, stride):
                    return None   # NB: a kernel made for a broadcast (stride-0) input: no copy can take its layout
                out[i] = torch.empty_strided(shape, stride, dtype=dtype, device=t.device).copy_(t)
                copied = True
        if copied:
            with self._lock:
                self.relayouts += 1
        return out

    @property
    def calls(self) -> int:
        """Successful launches since the kernel was made (or since ``reset_calls``)."""
        return self._launches() - self._calls_before

    def _launches(self) -> int:
        if self.served is not None:
            return self.served.calls
        return self._py_calls + (self.launch.calls if self.fast else 0)

    def reset_calls(self) -> None:
        """Count from zero again (the apply-time re-check's launches are not the model's calls)."""
        self._calls_before = self._launches()

    def __call__(self, inputs: tuple) -> list[torch.Tensor]:
        return self.launch(inputs)

    def _launch_py(self, inputs: tuple) -> list[torch.Tensor]:
        if len(inputs) != self._n[0]:
            raise TypeError(f"expected {self._n[0]} inputs, got {len(inputs)}")
        outs = [torch.empty_strided(shape, stride, dtype=dtype, device=dev) for shape, stride, dtype, dev in self._outs]
        stream = _raw_stream(self._index) if self._cuda else None
        ws = self._ws_alloc() if self._ws_alloc is not None else None
        ws_ptr = ws.data_ptr() if ws is not None else self._ws_ptr
        # NB: the structs are shared, so two threads must not fill them at once.
        with self._lock:
            for slot, t in zip(self._in_slots, inputs):
                slot.data = t.data_ptr() if t is not None else None
            for slot, t in zip(self._out_slots, outs):
                slot.data = t.data_ptr()
            code = self._fn(self._ins, self._n[0], self._out_structs, self._n[1], self._params, self._n[2],
                            ws_ptr, stream)
            if code == 0:
                self._py_calls += 1
        if code != 0:
            raise RuntimeError(f"kforge kernel for {self.variant.signature} failed to launch (error {code})")
        return outs


def _non_overlapping(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """No two elements of a tensor of ``shape`` laid out with ``stride`` share memory (gaps allowed)."""
    dims = sorted((st, n) for n, st in zip(shape, stride) if n != 1)
    span = 1
    for st, n in dims:
        if st < span:
            return False
        span = st * n
    return True


def _raw_stream(index: int) -> int:
    """The current CUDA stream of a device as an integer handle, without building a Stream object."""
    return _GET_RAW_STREAM(index) if _GET_RAW_STREAM else torch.cuda.current_stream(index).cuda_stream


_GET_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _prefill(slot: KfTensor, sig: TensorSig | None) -> None:
    if sig is None:
        slot.data = None
        slot.ndim = 0
        slot.dtype = -1
        return
    slot.ndim = len(sig.shape)
    slot.dtype = DTYPE_CODES[sig.dtype]
    for i, (s, st) in enumerate(zip(sig.shape, sig.stride)):
        slot.sizes[i] = s
        slot.strides[i] = st


def deploy_winners(exported: Sequence[Any], evaluator: Any = None, examples_of: Any = lambda v: (), *,
                   warn: bool = True) -> tuple[list[Any], list[tuple[str, str]]]:
    """Each winner (``ExportedKernel``) as a ``DeployedKernel``, and ``(signature, reason)`` for those left on
    eager: a CPU kernel served by its sandboxed worker (``DeployedKernel.from_binary``), a CUDA kernel replayed from
    its plan (its own ``plan``, else one ``evaluator`` records). A CUDA kernel with no plan is never loaded here."""
    kernels, left = [], []
    for k in exported:
        if not k.variant.device.startswith("cuda") or not replay_enabled():
            kernels.append(DeployedKernel.from_binary(k.variant, k.binary, None, k.candidate_id, k.speedup,
                                                      kernel_us=k.kernel_us))
            continue
        plan = getattr(k, "plan", None)
        if plan is None:
            if evaluator is None:
                left.append((k.variant.signature, "not replayable: no launch plan, and no evaluator to record one"))
                continue
            plan = recorded_plan(k.variant, k.source, evaluator, examples_of(k.variant))
        if isinstance(plan, str):
            left.append((k.variant.signature, plan))
            continue
        try:
            kernels.append(DeployedKernel(k.variant, RecordedKernel(plan), k.candidate_id, k.speedup,
                                          kernel_us=k.kernel_us))
        except (ReplayError, ValueError, OSError) as exc:
            left.append((k.variant.signature, f"not replayable here: {exc}"))
    for sig, why in left if warn else ():
        import warnings

        warnings.warn(f"kforge: {sig} stays on eager: {why}", stacklevel=3)
    return kernels, left
