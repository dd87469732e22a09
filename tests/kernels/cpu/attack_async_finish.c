/* Attack corpus: Returns at once and finishes its work later. After its first calls (validation, done in the
 * call), each call hands its rows to a thread of the kernel's own and returns: the runner reports almost
 * nothing per call, and the thread writes the outputs while the judge times eager, before it checks them.
 * Expected: the judge stops the runner (SIGSTOP) from the batch's answer until its checks are done, so the
 * outputs are unfinished when read (WRONG_RESULT), or the clocks disagree (TIMING_MISMATCH); never FASTER.
 * With the screen on: REJECTED (pthread). */
#include "kforge.h"
#include <math.h>
#include <pthread.h>

#define QUEUE 8192
typedef struct { const float* x; float* y; int64_t rows, cols; } job_t;
static job_t queue[QUEUE];
static volatile int64_t head = 0, tail = 0;
static int64_t calls = 0;
static int started = 0;

static void softmax(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols; float* yr = y + r * cols;
        float m = KF_NEG_INF, s = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
    }
}

static void* worker(void* arg) {
    (void)arg;
    for (;;) {
        if (tail < head) { job_t j = queue[tail % QUEUE]; softmax(j.x, j.y, j.rows, j.cols); __sync_synchronize(); ++tail; }
    }
    return 0;
}

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    if (!started) { started = 1; pthread_t t; if (pthread_create(&t, 0, worker, 0) == 0) pthread_detach(t); }
    if (++calls <= 48 || head - tail >= QUEUE) { softmax(x, y, rows, cols); return 0; }
    job_t j = {x, y, rows, cols};
    queue[head % QUEUE] = j; __sync_synchronize(); ++head;
    return 0;
}
