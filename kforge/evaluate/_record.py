"""Recording a CUDA kernel's launches in the sandbox, for kforge's own launcher to replay (kernels/_plan.py).

A record job runs in the judge as an evaluation does: the card's inputs in the shared arenas, a fresh sandboxed
runner, the candidate loaded there and nowhere else. The runner loads the recorder (``runner/recorder.c``) first,
then calls ``kf_launch`` once on one input set and once on another (other addresses, other values, the workspace
moved), each call recorded; the judge turns the two records into a :class:`LaunchPlan` or a refusal. The plan is
what deployment installs: the candidate's host code never runs in the user's process.
"""
from __future__ import annotations

import struct
from typing import Any

from ..kernels import CompileError, compile_source, verify_binary
from ..kernels._binary import read_elf
from ..kernels._compile import uses_cublaslt
from ..kernels._plan import Buffers, NotReplayable, build_plan, parse_record
from ..ops import torch_dtype
from ._arena import extent
from ._frames import Code, Op
from ._judge import Job, _Infra, _Phases, _Trial, _Verdict
from ._runner import RunnerBuildError, recorder_library

_HEAD = struct.Struct("<QIiII")   # bytes after the first field, layout, kf_launch's code, CUDA error, pointers


def not_replayable_imports(binary: bytes) -> str | None:
    """Why a library cannot be replayed, judged from what it imports (None: record it to see): cuBLASLt launches
    its own kernels from inside the library, where the recorder does not see them."""
    try:
        imports = read_elf(binary).imports
    except ValueError:
        return None
    found = sorted(n for n in imports if n.startswith("cublasLt"))
    if found:
        return (f"it calls cuBLASLt ({found[0]}...), whose own launches kforge cannot record: it stays on eager "
                "(see docs/contract.md, \"What host code may do\")")
    return None


class _Recording(_Trial):
    """One record job: load, then two recorded calls; the plan or why there is none."""

    def record(self, library, recorder) -> dict[str, Any]:
        self.recorder = recorder
        try:
            self.prepare()
            self.start()
            self.install(library)
            return self._record()
        except _Verdict as v:
            return {"refused": f"it could not be recorded: {v.evaluation.message}"}
        except NotReplayable as exc:
            return {"refused": str(exc)}
        finally:
            self.close()

    def _record(self) -> dict[str, Any]:
        self.phase = "load"
        frame, _ = self.ask(Op.LOAD)
        if frame.status != Code.OK:
            raise NotReplayable(f"the library did not load in the recorder's runner: "
                                f"{self.runner.output_tail(800).strip()[-800:]}")
        ws_bytes = int(frame.c)
        val = self.val
        # NB: two layouts holding different sets (other values and other addresses) where the card has two
        layouts = (val.first, val.first + (2 if val.count > 2 else 1))
        records, buffers = [], []
        for shift, layout in enumerate(layouts):
            self.phase = f"recording {shift + 1}"
            frame, _ = self.ask(Op.RECORD, layout, shift)
            if frame.status == Code.DEVICE:
                raise NotReplayable(f"a CUDA error after its recorded call: {self.runner.output_tail(800).strip()}")
            if frame.status != Code.OK or not frame.b:
                raise NotReplayable(f"the recorder's runner could not record a call (status {frame.status})")
            chunk = self.runner.read_record(frame.a, frame.b)
            rec, buf = self._parse(chunk, ws_bytes)
            records.append(rec)
            buffers.append(buf)
        n_in, n_out = len(self.variant.inputs), len(self.variant.outputs)
        plan = build_plan(records[0], buffers[0], records[1], buffers[1], n_in, n_out, ws_bytes)
        return {"plan": plan.to_json(), "modules": list(plan.modules)}

    def _parse(self, chunk: bytes, ws_bytes: int) -> tuple:
        if len(chunk) < _HEAD.size:
            raise NotReplayable("the recorder's runner wrote no record")
        body, _layout, code, err, n = _HEAD.unpack_from(chunk)
        if code != 0:
            raise NotReplayable(f"kf_launch returned error code {code} while it was recorded")
        if err != 0:
            raise NotReplayable(f"CUDA error {err} after its recorded call")
        sigs = [*self.variant.inputs, *self.variant.outputs]
        if n != len(sigs) + 1 or len(chunk) < _HEAD.size + 8 * (n + 1) or body + 8 != len(chunk):
            raise NotReplayable("the recorder's runner wrote a malformed record")
        ptrs = struct.unpack_from(f"<{n + 1}Q", chunk, _HEAD.size)
        slots = {}
        for j, (sig, addr) in enumerate(zip(sigs, ptrs)):
            if sig is None or not addr:
                continue
            slot = ("input", j) if j < len(self.variant.inputs) else ("output", j - len(self.variant.inputs))
            size = extent(sig) * torch_dtype(sig.dtype).itemsize
            slots[slot] = (addr, size)
        if ws_bytes and ptrs[n - 1]:
            slots[("workspace", 0)] = (ptrs[n - 1], ws_bytes)
        return parse_record(chunk[_HEAD.size + 8 * (n + 1):]), Buffers(slots)


def record_job(job: Job) -> dict[str, Any]:
    """In the judge: ``{"plan": json, "modules": [bytes]}``, ``{"refused": why}`` (not replayable, or the kernel
    does not build) or ``{"error": why}`` (the machine's trouble, twice)."""
    if job.backend != "cuda":
        return {"refused": "only CUDA kernels are recorded"}
    if uses_cublaslt(job.source):
        return {"refused": "it calls cuBLASLt, whose own launches kforge cannot record: it stays on eager"}
    try:
        built = compile_source(job.source, job.backend, job.arch)
        library = verify_binary(built.path)
        why = not_replayable_imports(library.read_bytes())
        if why:
            return {"refused": why}
        recorder, _digest = recorder_library()
    except CompileError as exc:
        return {"refused": f"it does not build here: {exc}"}
    except RunnerBuildError as exc:
        return {"error": str(exc)}
    reason = ""
    for _attempt in range(2):
        try:
            return _Recording(job, _Phases()).record(library, recorder)
        except _Infra as exc:
            reason = str(exc)
    return {"error": f"not the kernel's fault, twice: {reason}"}
