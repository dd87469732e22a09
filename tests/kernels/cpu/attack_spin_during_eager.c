/* Attack corpus: Slows the baseline from inside the runner. The judge times eager in its own process between
 * the candidate's batches, while the runner is still alive: the kernel starts threads (plain pthreads, not
 * OpenMP) that spin whenever no call is running, so they take the cores eager's threads run on. Its calls
 * do the honest work of a plain single-threaded softmax, slower than eager's. Expected: the judge sees the
 * runner's CPU time while eager is timed (TIMING_MISMATCH), or the honest times are compared (SLOWER,
 * NO_GAIN); never FASTER. With the screen on: REJECTED (pthread). */
#include "kforge.h"
#include <pthread.h>
#include <math.h>

#define SPINNERS 4
static volatile int in_call = 0;
static volatile double sink = 0;
static void* spin(void* arg) {
    (void)arg;
    for (;;) { if (!in_call) { double s = 0; for (int i = 0; i < 1000; ++i) s += i * 0.5; sink = s; } }
    return 0;
}
static int started = 0;
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* ws, void* stream) {
    in_call = 1;
    if (!started) {
        started = 1;
        for (int i = 0; i < SPINNERS; ++i) { pthread_t t; pthread_create(&t, 0, spin, 0); pthread_detach(t); }
    }
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols; float* yr = y + r * cols; float m = -INFINITY, s = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
    }
    in_call = 0;
    return 0;
}
