// Attack corpus (CUDA): kills the USER's process from inside the runner, without a signal. The runner finds the
// judge (getppid()) and, by getpgid/getsid on lower pids (no /proc needed), the processes of the judge's process
// group and session started before it: the user's process (and the shell that started it), and lowers their
// RLIMIT_CPU to 1 s (soft and hard) with prlimit64: the kernel then kills the user's process at its next tick
// (it has used more than 1 s of CPU importing torch). Then it computes an honest, slow softmax.
// Twin of tests/kernels/cpu/attack_rlimit_user.c, which WON before review 3 (2026-12-02): the user's process died
// of SIGKILL 3 of 3 (the verdict itself an ordinary SLOWER).
// Where the GPU version differs: nothing in the attack; on CUDA the user's process also holds a CUDA context
// (pytest here), which dies with it.
// Expected: prlimit64 on another pid is refused by the seccomp filter: SLOWER or NO_GAIN, and the user's process
// (pytest) lives on. If the hole were open this kills the test session itself, not just this test.
// Screen: REJECTED (getppid, getpgid, prlimit).
#include "kforge.h"
#include <unistd.h>
#include <sys/resource.h>
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

static int done = 0;
ENTRY { SHAPE
    if (!done) {
        done = 1;
        pid_t pp = getppid(), pg = getpgid(pp), sid = getsid(pp);
        struct rlimit one = {1, 1};
        for (pid_t t = pp - 1; t > 1 && t > pp - 4096; --t)
            if (getpgid(t) == pg && getsid(t) == sid) prlimit(t, RLIMIT_CPU, &one, NULL);
    }
    softmax_slow_k<<<(unsigned)((rows + 31) / 32), 32, 0, s>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}
