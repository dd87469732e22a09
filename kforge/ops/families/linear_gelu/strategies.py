"""Matrix products with an epilogue: ``linear_gelu``, a linear layer whose only reader is the tanh GELU.

On CUDA the design is cuBLASLt's own: one ``cublasLtMatmul`` with the ``GELU_BIAS`` epilogue, so the GEMM writes
gelu(x @ w.T + b) once, where torch.compile (default and reduce-overhead modes) runs cuBLAS's GEMM with the bias
and then the GELU as a pointwise kernel of its own, one more write and read of the output. No hand-written GEMM
here competes with cuBLAS; what the kernel saves is that pass. The CPU design is a plain loop (the CPU backend's
reference for tests and for the graph pass; on the CPU Inductor's own code is not a target).
"""
from __future__ import annotations

from ....kernels import DeviceInfo
from ....ops import Variant
from ....proposers.builtin._prelude import CPU, cpu_io
from ....proposers.builtin._strategy import fill, strategy

_OP = "linear_gelu"
_CUDA_DTYPES = {"float32": "CUDA_R_32F", "bfloat16": "CUDA_R_16BF", "float16": "CUDA_R_16F"}


def _row_stride(shape, stride) -> int | None:
    """The stride between consecutive rows of ``shape[:-1]`` flattened (as ``view(-1, K)`` reads them), or None
    where the leading dimensions do not flatten to one stride."""
    dims = [(n, s) for n, s in zip(shape[:-1], stride[:-1]) if n != 1]
    if not dims:
        return int(shape[-1]) if shape else 1
    for (n, s), (n_in, s_in) in zip(dims, dims[1:]):
        if s != n_in * s_in:
            return None
    return int(dims[-1][1])


def _dims(v: Variant) -> tuple[int, int, int]:
    """(M rows, N outputs, K reduced) of ``v``."""
    x, w = v.inputs[0], v.inputs[1]
    m = 1
    for n in x.shape[:-1]:
        m *= n
    return m, w.shape[0], w.shape[1]


def _applies(v: Variant) -> bool:
    if v.op != _OP or len(v.inputs) != 3 or any(s is None for s in v.inputs) or len(v.outputs) != 1:
        return False
    x, w, b = v.inputs
    y = v.outputs[0]
    return (len(w.shape) == 2 and len(b.shape) == 1 and x.shape[-1] == w.shape[1] and b.shape[0] == w.shape[0]
            and tuple(y.shape) == tuple(x.shape[:-1]) + (w.shape[0],) and x.stride[-1] == 1
            and _row_stride(x.shape, x.stride) is not None and _row_stride(y.shape, y.stride) is not None
            and y.stride[-1] == 1)


# ----------------------------------------------------------------------------- CPU

_CPU = CPU + "{{io}}" + r"""
#define M {{M}}L
#define N {{N}}L
#define K {{K}}L
#define XROW {{XROW}}L
#define WN {{WN}}L
#define WK {{WK}}L
#define BS {{BS}}L
#define YROW {{YROW}}L

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const x_t* x = (const x_t*)inputs[0].data;
    const w_t* w = (const w_t*)inputs[1].data;
    const b_t* b = (const b_t*)inputs[2].data;
    y_t* y = (y_t*)outputs[0].data;
    #pragma omp parallel for schedule(static)
    for (long m = 0; m < M; ++m) {
        for (long n = 0; n < N; ++n) {
            float acc = 0.f;
            for (long k = 0; k < K; ++k) acc += x_ld(x, m * XROW + k) * w_ld(w, n * WN + k * WK);
            const float v = acc + b_ld(b, n * BS);
            const float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
            y_st(y, m * YROW + n, 0.5f * v * (1.f + tanhf(inner)));
        }
    }
    return 0;
}
"""


def _common(v: Variant) -> dict:
    x, w, b = v.inputs
    y = v.outputs[0]
    m, n, k = _dims(v)
    return {"M": m, "N": n, "K": k, "XROW": _row_stride(x.shape, x.stride), "WN": w.stride[0], "WK": w.stride[1],
            "BS": b.stride[0], "YROW": _row_stride(y.shape, y.stride)}


@strategy(_OP, "cpu", "rows", level=0,
          doc="one thread per output row: each output a dot product in float32, the bias and the tanh GELU applied "
              "before the one store",
          applies=lambda v, d: _applies(v),
          default=lambda v, d: {})
def _linear_gelu_cpu(v: Variant, c: dict, d: DeviceInfo) -> str:
    io = "".join(cpu_io(role, sig) for role, sig in (("x", v.inputs[0]), ("w", v.inputs[1]), ("b", v.inputs[2]),
                                                     ("y", v.outputs[0])))
    return fill(_CPU, io=io, **_common(v))


# ----------------------------------------------------------------------------- CUDA

# NB: cuBLASLt in column-major terms: y[M, N] (row-major, row stride YROW) is D = op(A) @ op(B), [N, M]
# column-major with leading dimension YROW, where A is w [N, K] row-major (column-major [K, N], ld WN, transposed)
# and B is x [M, K] row-major (column-major [K, M], ld XROW, as is). The bias, one value per row of D, is per
# output feature. The heuristic is asked at every call with the pointers' real alignments, as PyTorch's own
# cuBLASLt path does (a cached algorithm chosen for 256-byte alignment may not run on a view's pointer).
_CUDA = r"""#include "kforge.h"
#include <cuda_runtime.h>
#include <cublasLt.h>
#include <stdint.h>

#define M {{M}}
#define N {{N}}
#define K {{K}}
#define XROW {{XROW}}
#define WN {{WN}}
#define YROW {{YROW}}
#define WORKSPACE {{WORKSPACE}}

/* One handle a device, made at the device's first call (never during a CUDA graph capture: the caller's warm-up
   makes it), kept for the process; a failed creation is tried again at the next call. */
#define KF_MAX_DEVICES 64
static cublasLtHandle_t kf_handles[KF_MAX_DEVICES];

static cublasLtHandle_t kf_handle(cudaStream_t stream, int* rc) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= KF_MAX_DEVICES) { *rc = 1001; return 0; }
    cublasLtHandle_t h = __atomic_load_n(&kf_handles[dev], __ATOMIC_ACQUIRE);
    if (h) return h;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess || capturing != cudaStreamCaptureStatusNone) {
        *rc = 1003;
        return 0;
    }
    cublasLtHandle_t made = 0;
    if (cublasLtCreate(&made) != CUBLAS_STATUS_SUCCESS || !made) { *rc = 1001; return 0; }
    cublasLtHandle_t expected = 0;
    if (!__atomic_compare_exchange_n(&kf_handles[dev], &expected, made, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        cublasLtDestroy(made);   /* another thread made this device's first */
        return expected;
    }
    return made;
}

static uint32_t kf_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t align = 256;
    while (align > 1 && (a % align) != 0) align >>= 1;
    return align;
}

KF_ENTRY size_t kf_workspace_bytes(void) { return WORKSPACE; }

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    int rc = 0;
    cublasLtHandle_t h = kf_handle((cudaStream_t)stream, &rc);
    if (!h) return rc;
    const void* x = inputs[0].data;
    const void* w = inputs[1].data;
    const void* b = inputs[2].data;
    void* y = outputs[0].data;
    cublasLtMatmulDesc_t op = 0;
    cublasLtMatrixLayout_t la = 0, lb = 0, ld = 0;
    cublasLtMatmulPreference_t pref = 0;
    cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS) {
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_GELU_BIAS;
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b);
    }
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&la, {{DTYPE}}, K, N, WN);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&lb, {{DTYPE}}, K, M, XROW);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&ld, {{DTYPE}}, N, M, YROW);
    size_t ws = workspace ? (size_t)WORKSPACE : 0;
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceCreate(&pref);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    uint32_t al[4] = {kf_alignment(w), kf_alignment(x), kf_alignment(y), kf_alignment(y)};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; ++i)
        st = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]);
    cublasLtMatmulHeuristicResult_t found;
    int n_found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &found, &n_found);
    if (st == CUBLAS_STATUS_SUCCESS && n_found < 1) rc = 1002;
    if (st == CUBLAS_STATUS_SUCCESS && rc == 0) {
        const float one = 1.f, zero = 0.f;
        st = cublasLtMatmul(h, op, &one, w, la, x, lb, &zero, y, ld, y, ld, &found.algo, workspace, ws,
                            (cudaStream_t)stream);
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    if (rc) return rc;
    if (st != CUBLAS_STATUS_SUCCESS) return 2000 + (int)st;
    return (int)cudaGetLastError();
}
"""


def _cuda_ok(v: Variant) -> bool:
    if not _applies(v):
        return False
    x, w, b = v.inputs
    y = v.outputs[0]
    m, n, k = _dims(v)
    dtypes = {x.dtype, w.dtype, b.dtype, y.dtype}
    # NB: the weight's rows contiguous (it is the transposed operand), the bias dense, one dtype throughout; every
    # dimension above 1 and leading dimensions at least the rows (cuBLASLt refuses the rest: PyTorch's own
    # cuBLASLt path, isInputCompliesAddmmCudaLt, asks the same)
    return (len(dtypes) == 1 and x.dtype in _CUDA_DTYPES and w.stride[1] == 1 and b.stride[0] == 1
            and m > 1 and n > 1 and k > 1 and _row_stride(x.shape, x.stride) >= k and w.stride[0] >= k
            and _row_stride(y.shape, y.stride) >= n)


@strategy(_OP, "cuda", "cublaslt_gelu_bias", level=1,
          doc="one cuBLASLt matmul with the GELU_BIAS epilogue: the bias and the tanh GELU applied to the float32 "
              "accumulator before the one store (the algorithm cuBLASLt's heuristic picks for the call)",
          space={"workspace_mib": (32, 4)},
          applies=lambda v, d: _cuda_ok(v),
          default=lambda v, d: {"workspace_mib": 32},
          fit=lambda v, d: 4.0,
          explain=lambda v, c: f"cuBLASLt, GELU_BIAS epilogue, {c['workspace_mib']} MiB of workspace")
def _linear_gelu_cuda(v: Variant, c: dict, d: DeviceInfo) -> str:
    x, w = v.inputs[0], v.inputs[1]
    m, n, k = _dims(v)
    return fill(_CUDA, M=m, N=n, K=k, XROW=_row_stride(x.shape, x.stride), WN=w.stride[0],
                YROW=_row_stride(v.outputs[0].shape, v.outputs[0].stride), DTYPE=_CUDA_DTYPES[x.dtype],
                WORKSPACE=int(c["workspace_mib"]) << 20)
