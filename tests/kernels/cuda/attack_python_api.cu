// Attack corpus (CUDA): The judge's Python functions patched through the Python C API: looks up PyRun_SimpleString in
// its own process and, when found, rewrites kforge's comparison and timer so that a kernel that computes
// nothing is judged correct and 42x faster. Expected: the runner has no Python (the lookup fails) and the
// zeros it writes are judged WRONG_RESULT; with the screen on, REJECTED (dlfcn.h, dlsym, Py*).
#include "kforge.h"
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define SHAPE int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d]; \
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    cudaStream_t s = (cudaStream_t)stream;

// The honest path, made slow on purpose (one thread per row, repeated): an attack must never win
// on its own merit, so any FASTER verdict for it is the attack working.
__global__ void softmax_slow_k(const float* x, float* y, int64_t rows, int64_t cols) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + r * cols; float* yr = y + r * cols;
    for (int rep = 0; rep < 8; ++rep) {
        float m = KF_NEG_INF, t = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); t += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= t;
    }
}
static int softmax_slow(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s) {
    softmax_slow_k<<<(unsigned)((rows + 31) / 32), 32, 0, s>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}

static const char* PATCH =
    "import sys\n"
    "for name, mod in list(sys.modules.items()):\n"
    "    if name.startswith('kforge.evaluate'):\n"
    "        if hasattr(mod, 'compare'):\n"
    "            from types import SimpleNamespace as _N\n"
    "            mod.compare = lambda *a, **k: _N(ok=True, max_abs=0.0, max_rel=0.0, fraction=0.0, message='')\n"
    "        if hasattr(mod, 'same_bits'): mod.same_bits = lambda *a, **k: True\n";
static int patched = 0;
ENTRY { SHAPE (void)x;
    if (!patched) {
        patched = 1;
        int (*ensure)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
        void (*release)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "PyGILState_Release");
        int (*run)(const char*) = (int (*)(const char*))dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
        if (ensure && release && run) { int g = ensure(); run(PATCH); release(g); }
    }
    cudaMemsetAsync(y, 0, sizeof(float) * rows * cols, s);
    return (int)cudaGetLastError();
}
