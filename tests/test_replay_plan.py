"""CUDA kernels deploy as recorded launch plans (issue 42): the parts that run without a GPU.

The recorder (kforge/evaluate/runner/recorder.c) builds here and, loaded before a candidate, captures its fat binary
and kernel names at load time (the CUDA runtime registers them without a device). Turning two records into a plan,
its refusals, and its serialisation are pure Python, tested on synthetic records. The replay itself and the
recording runner need a GPU: tests/test_gpu_replay.py.
"""
from __future__ import annotations

import ctypes
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.kernels import find_nvcc
from kforge.kernels._plan import (Attribute, Buffers, Copy, Launch, LaunchPlan, Memset, NotReplayable, PlanStep,
                                  Record, build_plan, parse_record)

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc (the CUDA toolkit)")

IN, OUT, WS = ("input", 0), ("output", 0), ("workspace", 0)
MOD = b"\x50\xed\x55\xba" + b"fatbin" * 10


def _params(*words: int, tail: bytes = b"") -> tuple[tuple[tuple[int, int], ...], bytes]:
    layout = tuple((8 * i, 8) for i in range(len(words)))
    if tail:
        layout += ((8 * len(words), len(tail)),)
    return layout, b"".join(struct.pack("<Q", w) for w in words) + tail


def _launch(*words: int, grid=(4, 1, 1), tail: bytes = b"\x07\x00\x00\x00") -> Launch:
    layout, data = _params(*words, tail=tail)
    return Launch(0, False, grid, (256, 1, 1), 0, layout, data)


def _record(*steps, refusals=()) -> Record:
    return Record((MOD,), ((0, "_Z4kernPKfPf"),), tuple(steps), tuple(refusals))


A = Buffers({IN: (0x7000_0000_0000, 4096), OUT: (0x7000_0010_0000, 4096), WS: (0x7000_0020_0000, 512)})
B = Buffers({IN: (0x7100_0000_4000, 4096), OUT: (0x7100_0030_0000, 4096), WS: (0x7000_0020_1000, 512)})


def test_pointer_words_become_slots_and_the_rest_stays_as_recorded():
    first = _record(_launch(0x7000_0000_0000, 0x7000_0010_0040, 0x7000_0020_0000, 12345))
    second = _record(_launch(0x7100_0000_4000, 0x7100_0030_0040, 0x7000_0020_1000, 12345))
    plan = build_plan(first, A, second, B, 1, 1, 512)
    (step,) = plan.steps
    assert step.pointers == ((0, IN, 0), (8, OUT, 0x40), (16, WS, 0))
    assert struct.unpack_from("<Q", step.data, 24)[0] == 12345   # a constant: kept
    assert step.grid == (4, 1, 1) and step.block == (256, 1, 1)


def test_a_pointer_one_past_the_end_is_a_pointer():
    plan = build_plan(_record(_launch(0x7000_0000_0000 + 4096)), A, _record(_launch(0x7100_0000_4000 + 4096)), B, 1, 1)
    assert plan.steps[0].pointers == ((0, IN, 4096),)


@pytest.mark.parametrize("first_word, second_word, why", [
    # a value that lands in a tensor in one recording only: a coincidence, not a pointer
    (0x7000_0000_0010, 0x7000_0000_0010, "in one call and not in the other"),
    # a pointer into the input in one call, the output in the other
    (0x7000_0000_0010, 0x7100_0030_0010, "in one call and not in the other"),
    # a constant that changes between calls: the plan depends on the inputs or on earlier calls
    (41, 42, "differs between two calls"),
    # a pointer at another offset in each call
    (0x7000_0000_0010, 0x7100_0000_4020, "in one call and not in the other"),
])
def test_words_that_do_not_agree_are_refused(first_word, second_word, why):
    with pytest.raises(NotReplayable, match=why):
        build_plan(_record(_launch(first_word)), A, _record(_launch(second_word)), B, 1, 1)


def test_a_launch_configuration_that_depends_on_the_call_is_refused():
    with pytest.raises(NotReplayable, match="configuration differs"):
        build_plan(_record(_launch(1, grid=(4, 1, 1))), A, _record(_launch(1, grid=(8, 1, 1))), B, 1, 1)
    with pytest.raises(NotReplayable, match="steps in one call"):
        build_plan(_record(_launch(1)), A, _record(_launch(1), _launch(1)), B, 1, 1)


def test_a_refusal_recorded_in_the_sandbox_is_the_reason():
    refused = _record(_launch(1), refusals=("it allocates device memory (cudaMalloc)",))
    with pytest.raises(NotReplayable, match="cudaMalloc"):
        build_plan(refused, A, _record(_launch(1)), B, 1, 1)


def test_memsets_and_copies_map_to_slots_and_must_stay_inside_them():
    first = _record(Memset(0x7000_0020_0000, 0, 512), Copy(0x7000_0010_0000, 0x7000_0000_0000, 4096), _launch(1),
                    Attribute(0, 8, 65536))
    second = _record(Memset(0x7000_0020_1000, 0, 512), Copy(0x7100_0030_0000, 0x7100_0000_4000, 4096), _launch(1),
                     Attribute(0, 8, 65536))
    plan = build_plan(first, A, second, B, 1, 1, 512)
    assert [s.op for s in plan.steps] == ["memset", "copy", "launch", "attribute"]
    assert plan.steps[0].dst == (WS, 0) and plan.steps[1].dst == (OUT, 0) and plan.steps[1].src == (IN, 0)
    too_long = _record(Memset(0x7000_0020_0000, 0, 4096), _launch(1))
    with pytest.raises(NotReplayable, match="reaches past workspace"):
        build_plan(too_long, A, _record(Memset(0x7000_0020_1000, 0, 4096), _launch(1)), B, 1, 1, 512)
    outside = _record(Memset(0x1234, 0, 4), _launch(1))
    with pytest.raises(NotReplayable, match="points outside"):
        build_plan(outside, A, outside, B, 1, 1)


def test_attributes_kforge_does_not_replay_are_refused():
    with pytest.raises(NotReplayable, match="attribute 10"):
        build_plan(_record(_launch(1), Attribute(0, 10, 1)), A, _record(_launch(1), Attribute(0, 10, 1)), B, 1, 1)


def test_a_call_that_launches_nothing_is_refused():
    with pytest.raises(NotReplayable, match="no kernel"):
        build_plan(_record(), A, _record(), B, 1, 1)


def test_the_plan_round_trips_through_json_and_checks_its_modules():
    first = _record(_launch(0x7000_0000_0000, 0x7000_0010_0000), Memset(0x7000_0010_0000, 0, 16))
    second = _record(_launch(0x7100_0000_4000, 0x7100_0030_0000), Memset(0x7100_0030_0000, 0, 16))
    plan = build_plan(first, A, second, B, 1, 1)
    again = LaunchPlan.from_json(plan.to_json(), list(plan.modules))
    assert again == plan and again.digest == plan.digest
    with pytest.raises(ValueError, match="SHA-256"):
        LaunchPlan.from_json(plan.to_json(), [MOD + b"changed"])


@pytest.mark.parametrize("edit, why", [
    (lambda s: s.update(function=3), "function"),
    (lambda s: s.update(grid=[0, 1, 1]), "out of bounds"),
    (lambda s: s.update(block=[2048, 1, 1]), "out of bounds"),
    (lambda s: s.update(pointers=[[4, ["input", 0], 0]]), "outside its parameters"),
    (lambda s: s.update(pointers=[[0, ["output", 5], 0]]), "slot"),
    (lambda s: s.update(data=s["data"][:-2]), "do not match its layout"),
])
def test_a_forged_plan_is_refused_when_read(edit, why):
    plan = build_plan(_record(_launch(0x7000_0000_0000)), A, _record(_launch(0x7100_0000_4000)), B, 1, 1)
    d = plan.to_json()
    edit(d["steps"][0])
    with pytest.raises(ValueError, match=why):
        LaunchPlan.from_json(d, list(plan.modules))


def test_a_malformed_record_is_not_replayable():
    with pytest.raises(NotReplayable):
        parse_record(struct.pack("<II", 3, 400) + b"\0" * 10)
    with pytest.raises(NotReplayable, match="unknown kind"):
        parse_record(struct.pack("<II", 99, 0))


def test_a_step_json_names_only_known_slots():
    with pytest.raises(ValueError, match="unknown slot"):
        PlanStep.from_json({"op": "memset", "dst": [["host", 0], 0], "count": 4})


# ----------------------------------------------------------------------------- the recorder, built here

_CAPTURE = r"""
import ctypes, sys
rec = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_LOCAL)
p = ctypes.POINTER(ctypes.c_ubyte)()
end = rec.kf_recorder_end
end.restype = ctypes.c_long
n = end(ctypes.byref(p))
sys.stdout.buffer.write(ctypes.string_at(p, n))
"""


@needs_nvcc
def test_the_recorder_captures_a_candidates_device_code_and_names_at_load():
    """Loaded before a candidate, the recorder sees its fat binary and each kernel's device name (the CUDA runtime
    registers them when the library loads, with no GPU needed); nothing of the candidate is called."""
    from kernel_files import kernel_source
    from kforge.evaluate._runner import recorder_library
    from kforge.kernels import compile_source

    recorder, digest = recorder_library()
    again, digest_again = recorder_library()
    assert (again, digest_again) == (recorder, digest)
    built = compile_source(kernel_source("cuda", "softmax_rows"), "cuda", "sm_90")
    # NB: a process without torch (torch's own CUDA runtime would be found first)
    out = subprocess.run([sys.executable, "-c", _CAPTURE, str(recorder), str(built.path)], capture_output=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    record = parse_record(out.stdout)
    assert record.refusals == ()
    assert len(record.modules) == 1 and record.modules[0][:4] == b"\x50\xed\x55\xba"   # a fat binary's magic
    names = [name for _module, name in record.functions]
    assert any("softmax_rows" in n and n.startswith("_Z") for n in names), names
    assert record.steps == ()   # nothing recorded outside kf_recorder_begin/end


@needs_nvcc
def test_the_recorder_is_rebuilt_when_its_binary_changes(tmp_path, monkeypatch):
    from kforge.evaluate import _runner

    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path))
    monkeypatch.setattr(_runner, "_BUILT", {})
    path, digest = _runner.recorder_library()
    path.chmod(0o755)
    path.write_bytes(path.read_bytes() + b"x")
    monkeypatch.setattr(_runner, "_BUILT", {})
    again, digest_again = _runner.recorder_library()
    assert digest_again == digest and _runner._sha256(again) == digest
    ctypes.CDLL(str(again))   # loads (it needs only the CUDA runtime, C library and loader)


def test_a_kernel_that_calls_cublaslt_is_refused_before_anything_is_built():
    from kforge.evaluate._judge import Job, record_job

    source = '#include "kforge.h"\n#include <cublasLt.h>\nKF_ENTRY int kf_launch() { return 0; }\n'
    out = record_job(Job(1, {}, source, "cuda", "cuda:0", "sm_90", record=True))
    assert "cuBLASLt" in out["refused"]


_EXPLICIT = r'''
#include "kforge.h"
__global__ void scale_k(const float* x, float* y, int64_t n, float a) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    int64_t n = in[0].sizes[0];
    float a = 2.0f;
    void* args[] = {(void*)&x, (void*)&y, (void*)&n, (void*)&a};
    cudaMemsetAsync(y, 0, 16, (cudaStream_t)stream);
    cudaLaunchKernel((const void*)scale_k, dim3(3, 2, 1), dim3(128, 1, 1), args, 64, (cudaStream_t)stream);
    float host[4];
    cudaMemcpyAsync(host, y, sizeof host, cudaMemcpyDeviceToHost, (cudaStream_t)stream);
    cudaLaunchKernel((const void*)scale_k, dim3(1, 1, 1), dim3(32, 1, 1), args, 0, (cudaStream_t)0);
    return 0;
}
'''

_CALL = r"""
import ctypes, sys
class T(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("ndim", ctypes.c_int32), ("dtype", ctypes.c_int32),
                ("sizes", ctypes.c_int64 * 8), ("strides", ctypes.c_int64 * 8)]
rec = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_LOCAL)
x, y = T(), T()
x.data, y.data, x.ndim, y.ndim = 0x7000_0000_0000, 0x7000_0010_0000, 1, 1
x.sizes[0] = y.sizes[0] = 1000
rec.kf_recorder_begin(ctypes.c_void_p(0x5000))
lib.kf_launch(ctypes.byref(x), 1, ctypes.byref(y), 1, None, 0, None, ctypes.c_void_p(0x5000))
p = ctypes.POINTER(ctypes.c_ubyte)()
end = rec.kf_recorder_end
end.restype = ctypes.c_long
n = end(ctypes.byref(p))
sys.stdout.buffer.write(ctypes.string_at(p, n))
"""


@needs_nvcc
def test_the_recorder_records_calls_and_refuses_what_a_replay_cannot_do():
    """Between begin and end: a memset and a launch on the given stream are recorded (their bytes as the C side
    writes them, parsed here), a copy to host memory and a launch on another stream are refusals. Without a GPU the
    runtime forwards fail and cannot say a kernel's parameter layout: the launch is recorded with none."""
    from kforge.evaluate._runner import recorder_library
    from kforge.kernels import compile_source

    recorder, _ = recorder_library()
    built = compile_source(_EXPLICIT, "cuda", "sm_90")
    out = subprocess.run([sys.executable, "-c", _CALL, str(recorder), str(built.path)], capture_output=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    record = parse_record(out.stdout)
    memset, launch = record.steps
    assert memset == Memset(0x7000_0010_0000, 0, 16)
    assert isinstance(launch, Launch)
    assert (launch.grid, launch.block, launch.shared) == ((3, 2, 1), (128, 1, 1), 64)
    assert "scale_k" in record.functions[launch.function][1]
    assert record.refusals == ("a copy to or from host memory (cudaMemcpyAsync of kind other than device to device)",
                               "a launch on another stream than the one kf_launch was given")


@needs_nvcc
def test_the_dispatch_cost_probe_has_a_launch_plan_of_its_own_device_code():
    """With replay on, the dispatch cost is measured through a replayed plan as winners are served: the probe's plan is
    written by kforge from its own library's fat binary (no recording), one launch with its two pointers as slots."""
    from kforge.deploy._replay import fatbin_of
    from kforge.deploy._select import _PROBE_CUDA, _probe_plan
    from kforge.kernels import compile_source

    built = compile_source(_PROBE_CUDA, "cuda", "sm_90")
    plan = _probe_plan(built.path, (32, 64))
    assert plan.modules[0][:4] == b"\x50\xed\x55\xba" and plan.launches == 1
    plan.check({("input", 0): 32 * 64 * 4, ("output", 0): 32 * 64 * 4})
    assert LaunchPlan.from_json(plan.to_json(), plan.modules) == plan
    (step,) = plan.steps
    assert [(o, s) for o, s, _ in step.pointers] == [(0, ("input", 0)), (8, ("output", 0))]
    with pytest.raises(ValueError, match="nv_fatbin"):
        fatbin_of(Path(sys.executable).resolve().read_bytes())
