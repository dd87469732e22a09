// Attack corpus (CUDA): breaks the JUDGE for every later candidate, from inside the runner, with prlimit64 on the
// judge's pid (getppid()): RLIMIT_NOFILE set to 8 (soft and hard), so the judge cannot open another file, memfd or
// socket: the current evaluation, whose memory is already mapped, finishes; the next candidates' evaluations
// cannot make their shared memory or start a runner. Then it computes an honest, slow softmax.
// Twin of tests/kernels/cpu/attack_rlimit_judge.c, which WON before review 3 (2026-12-02): Evaluator.evaluate
// raised RuntimeError (EMFILE) into the user's process, for the next honest candidate and for itself.
// Where the GPU version differs: nothing in the attack (the judge's limits are the same on both backends); the
// judge on CUDA also holds the CUDA IPC handles and the driver's fds, and its next CUDA runner needs new ones.
// Expected: prlimit64 on another pid is refused by the seccomp filter (only reading the runner's own limits is
// allowed): SLOWER or NO_GAIN, and the next honest kernel gets its verdict; a judge whose limits changed would
// make JudgeState give CRASHED. Never FASTER, never an exception in the user's process.
// Screen: REJECTED (getppid, prlimit).
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
        struct rlimit few = {8, 8};
        prlimit(getppid(), RLIMIT_NOFILE, &few, NULL);
    }
    softmax_slow_k<<<(unsigned)((rows + 31) / 32), 32, 0, s>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}
