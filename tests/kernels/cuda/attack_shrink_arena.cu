// Attack corpus (CUDA): shrinks the judge's shared arena. The runner inherits the times arena as a memfd opened
// O_RDWR, and ftruncate is not in the seccomp filter; once shrunk, the judge's MAP_SHARED mapping of the same
// file raises SIGBUS on its next access (it reads the reported times after every timed batch): the judge dies,
// and the candidate is never judged (infra_error is not counted against it), at will.
// Twin of tests/kernels/cpu/attack_shrink_arena.c, which WON before review 4: INFRA_ERROR 4 of 4, two judges
// killed by SIGBUS an evaluation. Fixed there by sealing every arena memfd (F_SEAL_SHRINK | F_SEAL_GROW |
// F_SEAL_SEAL) before any runner sees it.
// Where the GPU version differs: on CUDA the input and output arenas are device memory shared by CUDA IPC (no fd
// to shrink); the only writable memfd the runner holds is the times arena, which the runner itself writes after
// every batch, so shrinking it from a call would kill the runner first (CRASHED, the candidate's fault; the CPU
// twin's OUTPUTS_ONLY spared it for that reason). So a host thread of the kernel's own maps the times arena
// itself, puts a sentinel where the runner writes the last time of a timed batch (layout nval + K - 1: the
// validation sets come first, every timed batch starts after them, K is fixed on CUDA), and shrinks the file the
// moment the runner has overwritten it: after the runner's last write and before the judge's SIGSTOP and read.
// Its work: an honest, slow softmax (one thread per row, repeated).
// Expected: the arena is sealed against shrinking (ftruncate: EPERM): SLOWER or NO_GAIN, the judge lives; a
// shrink that worked too early would kill the runner (CRASHED). INFRA_ERROR here is the attack working.
// RESULT (H200, 2026-12-02): a safe verdict (the corpus test passed).
// Screen: REJECTED (fcntl, mmap, ftruncate, pthread_create).
#include "kforge.h"
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

#define SENTINEL 0x6b666174746b6b21ull       // not a time the runner would write
static int arena_fd = -1;
static volatile uint64_t* times = NULL;      // the times arena, mapped by the kernel itself
static size_t times_n = 0;
static volatile int64_t armed = -1;          // index of the sentinel the watcher waits on
static volatile int shrunk = 0;
static double now_us(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3; }

static void find_times_arena(void) {
    for (int f = 3; f < 1024; ++f) {
        struct stat st;
        int fl = fcntl(f, F_GETFL);
        if (fl < 0 || fstat(f, &st) != 0 || !S_ISREG(st.st_mode) || (fl & O_ACCMODE) != O_RDWR) continue;
        if (fcntl(f, F_GET_SEALS) < 0) continue;                  // memfds only
        void* p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
        if (p == MAP_FAILED) continue;
        arena_fd = f; times = (volatile uint64_t*)p; times_n = (size_t)st.st_size / 8;
        return;
    }
}

// From the first counted batch on it spins (no system call: it must see the runner's write within microseconds,
// before the judge's SIGSTOP); before, it sleeps.
static volatile int hot = 0;
static void* watcher(void* arg) {
    (void)arg;
    for (;;) {
        int64_t i = armed;
        if (i < 0) {
            if (!hot) { struct timespec ts = {0, 200000}; nanosleep(&ts, NULL); }
            continue;
        }
        double t0 = now_us();
        while (times[i] == SENTINEL && now_us() - t0 < 200000.0) {}
        if (ftruncate(arena_fd, 0) == 0) shrunk = 1;   // sealed: EPERM
        armed = -1;
    }
    return 0;
}

static int bursts = 0;
static int64_t count = 0, k_prev = 0, n_validation = 0;
static double last_us = -1e18;
ENTRY { SHAPE
    double t = now_us();
    if (t - last_us > 300.0) {              // a new burst of calls: 1 validation, 2 warm-up, 3.. counted batches
        if (++bursts == 1) {
            find_times_arena();
            pthread_t th;
            if (times && pthread_create(&th, 0, watcher, 0) == 0) pthread_detach(th);
        } else {
            if (bursts == 2) n_validation = count;
            k_prev = count;
            hot = bursts >= 3;
        }
        count = 0;
    }
    last_us = t;
    ++count;
    int64_t last = n_validation + k_prev - 1;
    if (bursts >= 3 && count == k_prev && times && !shrunk && armed < 0 && last >= 0 && (size_t)last < times_n) {
        times[last] = SENTINEL;             // the runner overwrites it after the device sync, then answers
        __sync_synchronize();
        armed = last;
    }
    softmax_slow_k<<<(unsigned)((rows + 31) / 32), 32, 0, s>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}
