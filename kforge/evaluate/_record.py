"""Recording a CUDA kernel's launches in the sandbox, for kforge's own launcher to replay (kernels/_plan.py).

A record job runs in the judge as an evaluation does: the card's inputs in the shared arenas, a fresh sandboxed
runner, the candidate loaded there and nowhere else. The runner loads the recorder (``runner/recorder.c``) first,
then calls ``kf_launch`` once on one input set and once on another (other addresses, other values, the workspace
moved), each call recorded (``record_plan``); the judge (``_judge.record_job``) turns the two records into a
:class:`LaunchPlan` or a refusal. The plan is what deployment installs: the candidate's host code never runs in the
user's process.
"""
from __future__ import annotations

import struct
from typing import Any, Protocol

from ..kernels._binary import read_elf
from ..kernels._plan import Buffers, NotReplayable, build_plan, parse_record
from ..ops import Variant, torch_dtype
from ._arena import Group, extent
from ._frames import Code, Frame, Op
from ._runner import RunnerProcess

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


class RecordingTrial(Protocol):
    """What recording reads of a trial (``_judge._Trial`` is the one the judge runs, its runner started with the
    recorder and the candidate installed): typed here so that this module does not import the judge that imports it."""

    phase: str
    variant: Variant
    val: Group
    runner: RunnerProcess

    def ask(self, op: Op, a: int = 0, b: int = 0) -> tuple[Frame, float]: ...


def record_plan(trial: RecordingTrial) -> dict[str, Any]:
    """Two recorded calls of the installed candidate (other addresses, other values): ``{"plan": json, "modules":
    [bytes]}``. Raises NotReplayable where they make no plan."""
    trial.phase = "load"
    frame, _ = trial.ask(Op.LOAD)
    if frame.status != Code.OK:
        raise NotReplayable(f"the library did not load in the recorder's runner: "
                            f"{trial.runner.output_tail(800).strip()[-800:]}")
    ws_bytes = int(frame.c)
    val = trial.val
    # NB: two layouts holding different sets (other values and other addresses) where the card has two
    layouts = (val.first, val.first + (2 if val.count > 2 else 1))
    records, buffers = [], []
    for shift, layout in enumerate(layouts):
        trial.phase = f"recording {shift + 1}"
        frame, _ = trial.ask(Op.RECORD, layout, shift)
        if frame.status == Code.DEVICE:
            raise NotReplayable(f"a CUDA error after its recorded call: {trial.runner.output_tail(800).strip()}")
        if frame.status != Code.OK or not frame.b:
            raise NotReplayable(f"the recorder's runner could not record a call (status {frame.status})")
        chunk = trial.runner.read_record(frame.a, frame.b)
        rec, buf = _parse(trial.variant, chunk, ws_bytes)
        records.append(rec)
        buffers.append(buf)
    n_in, n_out = len(trial.variant.inputs), len(trial.variant.outputs)
    plan = build_plan(records[0], buffers[0], records[1], buffers[1], n_in, n_out, ws_bytes)
    return {"plan": plan.to_json(), "modules": list(plan.modules)}


def _parse(variant: Variant, chunk: bytes, ws_bytes: int) -> tuple:
    if len(chunk) < _HEAD.size:
        raise NotReplayable("the recorder's runner wrote no record")
    body, _layout, code, err, n = _HEAD.unpack_from(chunk)
    if code != 0:
        raise NotReplayable(f"kf_launch returned error code {code} while it was recorded")
    if err != 0:
        raise NotReplayable(f"CUDA error {err} after its recorded call")
    sigs = [*variant.inputs, *variant.outputs]
    if n != len(sigs) + 1 or len(chunk) < _HEAD.size + 8 * (n + 1) or body + 8 != len(chunk):
        raise NotReplayable("the recorder's runner wrote a malformed record")
    ptrs = struct.unpack_from(f"<{n + 1}Q", chunk, _HEAD.size)
    slots = {}
    for j, (sig, addr) in enumerate(zip(sigs, ptrs)):
        if sig is None or not addr:
            continue
        slot = ("input", j) if j < len(variant.inputs) else ("output", j - len(variant.inputs))
        size = extent(sig) * torch_dtype(sig.dtype).itemsize
        slots[slot] = (addr, size)
    if ws_bytes and ptrs[n - 1]:
        slots[("workspace", 0)] = (ptrs[n - 1], ws_bytes)
    return parse_record(chunk[_HEAD.size + 8 * (n + 1):]), Buffers(slots)
