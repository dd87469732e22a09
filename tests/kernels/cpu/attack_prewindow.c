/* Attack (session 29's attacker review of the judge's batch sizes): hold every timed batch at 2 sets by spinning
 * through validation and the batches in which the judge may still grow them, then compute each batch's outputs in a
 * helper thread woken by the judge's SIGCONT (the resume), before the request is sent and the judge's wall clock of
 * the batch starts; the timed calls only wait for its flag. A batch under 1 ms counts at the judge's time, which
 * missed that work: a softmax 5x slower than eager was judged FASTER at 1.3-35x in 7 of 27 uncontended runs.
 * Now such a batch counts at least the runner's CPU time over it, and a batch too short for the clock check grows
 * the next one at any point. Expected: SLOWER, NO_GAIN or TIMING_MISMATCH, never FASTER. */
#define _GNU_SOURCE
#include "kforge.h"
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <semaphore.h>
#include <time.h>
#include <stdint.h>
#define HELPERS 1         /* threads that compute the outputs ahead of the calls */
#define FAST_SPIN_NS 8000  /* each call of a counted batch waits this long: lands its batch near the judge's rtt */
#define SLOW_US 1500       /* spin a call in validation and in the first batches: the judge keeps them small */
#define CYCLE_STEP_NS 0
#define GROWTH 4           /* the batches in which the judge may grow them (kforge/evaluate/_judge.py) */

static void softmax(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols; float* yr = y + r * cols;
        float m = KF_NEG_INF, s = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; ++c) { float e = expf(xr[c] - m); yr[c] = e; s += e; }
        float inv = 1.f / s;
        for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    }
}
static int64_t now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
static void spin_us(int64_t us) { int64_t end = now_ns() + us * 1000; while (now_ns() < end) {} }

static volatile int gen = 0;             /* SIGCONTs seen: 0 in validation, n+1 in timed batch n */
static const float* volatile xs[2]; static float* volatile ys[2];
static int64_t R, C;
static volatile int done[2] = {-1, -1};
static volatile int busy = 0;
static sem_t go1;
static int started = 0, last_gen = -1, idx = 0;
static int64_t last_exit = 0;
static int finish(void) { last_exit = now_ns(); return 0; }

static void* second(void* a) {
    (void)a;
    for (;;) { sem_wait(&go1); int g = gen; softmax(xs[1], ys[1], R, C); __sync_synchronize(); done[1] = g; __sync_fetch_and_sub(&busy, 1); }
    return 0;
}
static void* first(void* a) {
    (void)a;
    sigset_t s; sigemptyset(&s); sigaddset(&s, SIGCONT);
    for (;;) {
        int sig; if (sigwait(&s, &sig) != 0) continue;
        int g = gen + 1;
        if (g > GROWTH + 1 && xs[0] && xs[1]) {
            busy = HELPERS; __sync_synchronize(); gen = g;
            if (HELPERS >= 2) sem_post(&go1);
            softmax(xs[0], ys[0], R, C); __sync_synchronize(); done[0] = g;
            if (HELPERS < 2) { softmax(xs[1], ys[1], R, C); __sync_synchronize(); done[1] = g; }
            __sync_fetch_and_sub(&busy, 1);
        } else gen = g;
    }
    return 0;
}

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    if (!started) {
        started = 1; R = rows; C = cols;
        sigset_t s; sigemptyset(&s); sigaddset(&s, SIGCONT); pthread_sigmask(SIG_BLOCK, &s, 0);
        if (HELPERS > 0) {
            sem_init(&go1, 0, 0); pthread_t t;
            if (pthread_create(&t, 0, first, 0) == 0) pthread_detach(t);
            if (HELPERS >= 2 && pthread_create(&t, 0, second, 0) == 0) pthread_detach(t);
        }
    }
    int g = gen;
    if (HELPERS == 0) {   /* control: count batches by the gaps instead (no helper to count SIGCONTs) */
        int64_t t = now_ns();
        if (last_exit && t - last_exit > 300000) gen = g = gen + 1;
    }
    if (g != last_gen) { last_gen = g; idx = 0; }
    int j = idx++;
    if (g <= GROWTH) {              /* validation and the growth batches: slow, and learn the two sets */
        if (g >= 1 && j < 2) { xs[j] = x; ys[j] = y; }
        spin_us(SLOW_US);
        softmax(x, y, rows, cols);
        return finish();
    }
    if (HELPERS > 0 && j < 2 && xs[j] == x && ys[j] == y) {
        while (busy > 0 && done[j] != g) {}
        if (done[j] == g) {   /* a spin that cycles over the batches: some batches land just above the judge's rtt */
            int64_t e = now_ns() + FAST_SPIN_NS + (j == 0 ? (int64_t)(g % 13) * CYCLE_STEP_NS : 0);
            while (now_ns() < e) {}
            return finish();
        }
    }
    softmax(x, y, rows, cols);
    return finish();
}
