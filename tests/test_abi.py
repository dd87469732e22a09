"""The kernel ABI is declared once, in kforge/kernels/include/kforge.h: the runner and the dispatch front include it,
and the Python side (``KfTensor``, ``MAX_DIMS``, ``DTYPE_CODES``, ``CONTRACT_VERSION``, the launch's argument types)
must agree with what a compiler makes of it. A change on one side only fails here."""
from __future__ import annotations

import ctypes
import os
import re
import shlex
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

import kforge
from kforge.kernels import CONTRACT_VERSION, INCLUDE_DIR, Kernel, KfTensor, compile_source, find_nvcc
from kforge.kernels._library import MAX_DIMS, describe
from kforge.ops import DTYPE_CODES, dtype_name

HEADER = INCLUDE_DIR / "kforge.h"
PACKAGE = Path(kforge.__file__).parent


def _header_struct_fields() -> dict[str, bool]:
    """kf_tensor's fields in kforge.h, in order: whether each is an array."""
    body = re.search(r"typedef struct kf_tensor \{(.*?)\} kf_tensor;", HEADER.read_text(), re.S)
    assert body, "kforge.h declares no kf_tensor"
    return {name: bool(dims) for name, dims in re.findall(r"(\w+)\s*(\[[^]]*\])?\s*;", body.group(1))}


def _header_dtypes() -> dict[str, str]:
    """The dtype codes' names in kforge.h, by the Python name they must stand for (``KF_BFLOAT16``: "bfloat16")."""
    body = re.search(r"enum kf_dtype \{(.*?)\};", HEADER.read_text(), re.S)
    assert body, "kforge.h declares no enum kf_dtype"
    return {name[3:].lower(): name for name in re.findall(r"\b(KF_\w+)\s*=", body.group(1))}


def _probe_source() -> str:
    """A program that prints what the compiler makes of kforge.h: one ``name value`` line each."""
    lines = ['printf("sizeof %zu\\n", sizeof(kf_tensor));',
             'printf("alignof %zu\\n", (size_t)ALIGNOF(kf_tensor));',
             'printf("max_dims %d\\n", (int)KF_MAX_DIMS);',
             'printf("contract_version %d\\n", (int)KF_CONTRACT_VERSION);',
             'printf("launch_fn %zu\\n", sizeof(kf_launch_fn));']
    for field, array in _header_struct_fields().items():
        lines.append(f'printf("offset.{field} %zu\\n", offsetof(kf_tensor, {field}));')
        lines.append(f'printf("size.{field} %zu\\n", sizeof(((kf_tensor*)0)->{field}));')
        if array:
            lines.append(f'printf("element.{field} %zu\\n", sizeof(((kf_tensor*)0)->{field}[0]));')
    for name, macro in _header_dtypes().items():
        lines.append(f'printf("dtype.{name} %d\\n", (int){macro});')
    body = "\n    ".join(lines)
    return (f'#include <stdio.h>\n#include "kforge.h"\n\n'
            f'#ifdef __cplusplus\n#define ALIGNOF alignof\n#else\n#define ALIGNOF _Alignof\n#endif\n\n'
            f'int main(void) {{\n    {body}\n    return 0;\n}}\n')


def _python_side() -> dict[str, int]:
    out = {"sizeof": ctypes.sizeof(KfTensor), "alignof": ctypes.alignment(KfTensor), "max_dims": MAX_DIMS,
           "contract_version": CONTRACT_VERSION, "launch_fn": ctypes.sizeof(ctypes.c_void_p)}
    for name, kind in KfTensor._fields_:
        field = getattr(KfTensor, name)
        out[f"offset.{name}"], out[f"size.{name}"] = field.offset, field.size
        if issubclass(kind, ctypes.Array):
            out[f"element.{name}"] = ctypes.sizeof(kind._type_)
    out.update({f"dtype.{name}": code for name, code in DTYPE_CODES.items()})
    return out


def _compilers() -> list:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    nvcc = find_nvcc()
    return [pytest.param([*shlex.split(cc), "-std=gnu11"] if cc else None, id="cc"),
            # NB: what a CUDA candidate and the CUDA runner see: kforge.h through nvcc, __CUDACC__ defined
            pytest.param([nvcc, "-x", "cu", "-std=c++17"] if nvcc else None, id="nvcc")]


@pytest.mark.parametrize("compiler", _compilers())
def test_the_python_layout_matches_a_compiled_probe_of_the_header(compiler, tmp_path):
    if compiler is None:
        pytest.skip("this compiler is not installed")
    src = tmp_path / "probe.c"
    src.write_text(_probe_source())
    exe = tmp_path / "probe"
    built = subprocess.run([*compiler, f"-I{INCLUDE_DIR}", "-o", str(exe), str(src)], capture_output=True,
                           text=True, cwd=tmp_path, timeout=300)
    assert built.returncode == 0, f"the probe of kforge.h does not build:\n{built.stdout}{built.stderr}"
    printed = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=60).stdout
    header = {k: int(v) for k, v in (line.split() for line in printed.splitlines())}
    assert [name for name, _ in KfTensor._fields_] == list(_header_struct_fields())
    assert _python_side() == header


def test_the_abi_is_declared_only_in_kforge_h():
    """The runner, the dispatch front and every generated source take kf_tensor and the launch's type from kforge.h."""
    declaration = re.compile(r"struct\s+kf_tensor\s*\{|#\s*define\s+KF_MAX_DIMS\b|\(\s*\*\s*kf_launch_fn\s*\)"
                             r"|\benum\s+kf_dtype\s*\{")
    found = [str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*"))
             if path.suffix in (".c", ".h", ".cu", ".cuh", ".py") and path != HEADER
             and declaration.search(path.read_text(errors="replace"))]
    assert found == []
    for source in (PACKAGE / "evaluate" / "runner" / "runner.c", PACKAGE / "deploy" / "_fastpath.c"):
        assert re.search(r'^#include "kforge\.h"', source.read_text(), re.M), source


def test_the_runners_build_key_follows_the_header(tmp_path, monkeypatch):
    from kforge.evaluate import _runner

    before = {backend: _runner.build_key(backend) for backend in ("cpu", "cuda", "recorder")}
    changed = tmp_path / "kforge.h"
    changed.write_bytes(HEADER.read_bytes() + b"\n/* one more line */\n")
    monkeypatch.setattr(_runner, "RUNNER_HEADER", changed)
    after = {backend: _runner.build_key(backend) for backend in ("cpu", "cuda", "recorder")}
    assert after["cpu"] != before["cpu"] and after["cuda"] != before["cuda"]
    assert after["recorder"] == before["recorder"]   # NB: recorder.c does not include kforge.h


# A candidate that writes what it was handed, as int64s, into its one output: the counts, the workspace and stream
# pointers, each param's bits, then every tensor's data pointer, ndim, dtype, sizes and strides.
_ECHO = r'''#include "kforge.h"

KF_ENTRY size_t kf_workspace_bytes(void) { return 64; }

static int64_t* put(int64_t* w, const kf_tensor* t) {
    *w++ = (int64_t)(intptr_t)t->data; *w++ = t->ndim; *w++ = t->dtype;
    for (int d = 0; d < t->ndim; ++d) *w++ = t->sizes[d];
    for (int d = 0; d < t->ndim; ++d) *w++ = t->strides[d];
    return w;
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    int64_t* w = (int64_t*)outputs[0].data;
    *w++ = n_inputs; *w++ = n_outputs; *w++ = n_params;
    *w++ = (int64_t)(intptr_t)workspace; *w++ = (int64_t)(intptr_t)stream;
    for (int i = 0; i < n_params; ++i) { union { double d; int64_t i; } u; u.d = params[i]; *w++ = u.i; }
    for (int i = 0; i < n_inputs; ++i) w = put(w, &inputs[i]);
    for (int i = 0; i < n_outputs; ++i) w = put(w, &outputs[i]);
    return 0;
}
'''


def _expected(inputs, outputs, params, workspace) -> list[int]:
    out = [len(inputs), len(outputs), len(params), workspace.data_ptr(), 0]
    out += [struct.unpack("<q", struct.pack("<d", p))[0] for p in params]
    for t in [*inputs, *outputs]:
        if t is None:
            out += [0, 0, -1]
            continue
        out += [t.data_ptr(), t.dim(), DTYPE_CODES[dtype_name(t.dtype)], *t.shape, *t.stride()]
    return out


def _tensors():
    inputs = [torch.randn(2, 3, 4),
              torch.randn(5, 7, dtype=torch.float64).to(torch.bfloat16).t(),   # not contiguous
              None,                                                            # an absent optional input
              torch.zeros([1, 2, 1, 2, 1, 2, 1, 3][:MAX_DIMS], dtype=torch.int8)[..., 1:]]
    return inputs, [1.5, -2.25, 1e300, float("-inf")]


def test_a_compiled_kernel_sees_what_python_described():
    """Through ctypes (the evaluator's and the fallback's launch): every descriptor, param and pointer arrives."""
    kernel = Kernel(compile_source(_ECHO, "cpu", "native").path)
    inputs, params = _tensors()
    out = torch.full((256,), -7, dtype=torch.int64)
    workspace = torch.empty(kernel.workspace_bytes, dtype=torch.uint8)
    kernel.launch(inputs, [out], params, workspace)
    expected = _expected(inputs, [out], params, workspace)
    assert out[:len(expected)].tolist() == expected


def test_the_dispatch_front_hands_a_kernel_what_python_described():
    """Through the C launcher (``_fastpath.c``, built against kforge.h) with descriptors Python packed."""
    from kforge.deploy._fast import launcher_type, unavailable_reason

    launcher_cls = launcher_type()
    if launcher_cls is None:
        pytest.skip(f"no C launcher here: {unavailable_reason()}")
    kernel = Kernel(compile_source(_ECHO, "cpu", "native").path)
    inputs, params = _tensors()
    ins, outs = (KfTensor * len(inputs))(), (KfTensor * 1)()
    for i, t in enumerate(inputs):
        describe(t, ins[i])
    made = []

    def alloc():
        made.append(torch.full((256,), -7, dtype=torch.int64))
        return made[-1]

    describe(alloc(), outs[0])
    workspace = torch.empty(kernel.workspace_bytes, dtype=torch.uint8)
    launcher = launcher_cls(ctypes.cast(kernel._launch, ctypes.c_void_p).value, bytes(ins), len(inputs), bytes(outs),
                            1, bytes((ctypes.c_double * len(params))(*params)), workspace.data_ptr(), (alloc,), None,
                            0, "abi probe", kernel, False)
    (out,) = launcher(tuple(inputs))
    expected = _expected(inputs, [out], params, workspace)
    assert out[:len(expected)].tolist() == expected
