/* Attack corpus (review 4): slows eager from inside the runner DESPITE the SIGSTOP pause. The judge
 * stops the runner's group (SIGSTOP) while it times eager, but a signal stop takes effect only when a
 * thread returns to user space; a thread inside a long system call that checks only *fatal* signals
 * keeps running. madvise(MADV_POPULATE_READ) on a big anonymous PROT_READ mapping (the zero page: no
 * memory is used, only page tables) runs ~750 ms per 4 GiB in the kernel and is interrupted only by
 * SIGKILL (GUP checks fatal_signal_pending); so is the MADV_DONTNEED that follows it. Runner.pause()
 * waits 50 ms for every thread to show T, then the judge times eager anyway (its result is ignored).
 * The kernel predicts the last call of each timed batch (batches are back-to-back calls; a batch has
 * the previous batch's count: _grown never shrinks k) and only then wakes BURNERS threads, each doing
 * one populate sized to last ~1.5x the gap between batches, so they burn the cores while the judge
 * times eager, and are idle again when the next batch starts. Calls do an honest scalar softmax.
 * What it would gain: FASTER for a kernel slower than eager. Define NO_ATTACK for the control.
 * RESULT (review 4, 2 busy cores, CI load): no FASTER. Verdicts over 11 runs: SLOWER 8 (0.144-0.289x),
 * TIMING_MISMATCH 3; control (NO_ATTACK) SLOWER 3 of 3 (0.240-0.253x). BUT the pause is defeated: with
 * instrumentation in the judge, Runner.pause() returned False in 10 of 21 batches (runner threads in
 * state R after the 50 ms wait) and the judge timed eager anyway, at 9-26 us/call against 8 us in the
 * control (up to 3.3x). It loses here only because a ~50 ms burn cannot end exactly before resume() and
 * the overrun slows the candidate's own next batch (and its CPU time trips the clock check). Nothing
 * outside the runner changed (chrt/taskset/prlimit/nice of the user's process identical before/after).
 * Fix: treat pause() == False as the candidate's fault (or kill the runner / discard the batch and
 * count it at the judge's clock with eager re-timed), never time eager with a runner thread running.
 */
#define _GNU_SOURCE
#include "kforge.h"
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

#define BURNERS 4
#ifndef BURN_MS
#define BURN_MS 51.0
#endif
#define REGION ((size_t)768 << 20)
static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static volatile int gen = 0;
static volatile double target_ms = 20.0, bytes_per_ms = 5.0e6;
static volatile int busy = 0;

static void* burner(void* arg) {
    (void)arg;
    char* p = mmap(NULL, REGION, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return 0;
    madvise(p, REGION, MADV_NOHUGEPAGE);
    int seen = 0;
    for (;;) {
        pthread_mutex_lock(&mu);
        while (gen == seen) pthread_cond_wait(&cv, &mu);
        seen = gen;
        pthread_mutex_unlock(&mu);
        __sync_fetch_and_add(&busy, 1);
        size_t n = (size_t)(target_ms * bytes_per_ms) & ~(size_t)4095;
        if (n > REGION) n = REGION;
        if (n < 4096) n = 4096;
        double t0 = now_ms();
        madvise(p, n, MADV_POPULATE_READ);
        madvise(p, n, MADV_DONTNEED);
        double dt = now_ms() - t0;
        if (dt > 0.5) bytes_per_ms = 0.7 * bytes_per_ms + 0.3 * (n / dt);
        __sync_fetch_and_sub(&busy, 1);
    }
    return 0;
}

static int started = 0, count = 0, k_prev = 0;
static double last_exit = 0, min_gap = 1e9;

static void kick(void) {
    if (busy) return;
    pthread_mutex_lock(&mu);
    gen++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    double t = now_ms();
#ifndef NO_ATTACK
    if (!started) {
        started = 1;
        for (int i = 0; i < BURNERS; ++i) { pthread_t th; pthread_create(&th, 0, burner, 0); pthread_detach(th); }
    }
#endif
    if (last_exit > 0 && t - last_exit > 0.1) {    /* a new batch */
        double gap = t - last_exit;
        if (gap < min_gap) min_gap = gap;
        double tg = 1.5 * min_gap;
        (void)tg; target_ms = BURN_MS;
        k_prev = count;
        count = 0;
    }
    count++;
#ifndef NO_ATTACK
    /* the predicted last call of the batch: the burners must be inside the kernel before the reply
       (and the judge's SIGSTOP) goes out, else they stop on their way back from the futex */
    if (k_prev > 1 && count >= k_prev && !busy) {
        kick();
        double w = now_ms();
        while (busy < BURNERS && now_ms() - w < 0.3) {}
    }
#endif
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols; float* yr = y + r * cols;
        float m = KF_NEG_INF, s = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
    }
    last_exit = now_ms();
    return 0;
}
