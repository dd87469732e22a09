// Attack corpus (CUDA): slows eager from inside the runner DESPITE the SIGSTOP pause, with work the pause cannot
// stop: GPU kernels. Twin of tests/kernels/cpu/attack_kernel_spin_eager.c (review 4: host threads inside a long
// madvise kept running through the 50 ms pause; eager read up to 3.3x slow; now the judge waits up to 2 s for
// every runner thread to stop, else timing_mismatch).
// Where the GPU version differs: a kernel on the GPU runs on whatever its host process does; SIGSTOP stops the
// runner's threads, not the device. What keeps such a kernel out of the candidate's own time is that the runner's
// cudaDeviceSynchronize after a batch waits for every stream of the runner's context, and the next batch's wall
// clock would include it. Both cover that context only. So:
//  - in the warm-up batch (not counted; K was sized from validation) it makes CONTEXTS more CUDA contexts on the
//    same device (cuCtxCreate, reached with cudaGetDriverEntryPointByVersion from cuda_runtime.h: no driver
//    header, no forbidden name), a stream and a word of pinned host memory mapped into each;
//  - it learns K (a burst of back-to-back calls; on CUDA K is sized once and never changes) and at the last call
//    of every counted batch records an event after its softmax on the runner's stream and queues in each other
//    context, behind that event (cudaStreamWaitEvent takes an event of another context), a spinner: 2 blocks of
//    1024 threads per SM that sleep-poll until the host word changes. The runner's device sync does not wait for
//    them; they start when the batch's work is done and hold the GPU while the runner answers, while the judge
//    stops it (no runner thread runs: pause() is satisfied) and while the judge times eager with CUDA events;
//  - contexts do not share the GPU, they take turns (time slices): when the judge's slice ends between an eager
//    call's events, the call waits for the spinners' slices and its event time includes the wait. The more
//    contexts spin, the smaller the judge's share. A big K (no stall in validation) spreads eager's host loop
//    over many slices; STALL_MS > 0 makes validation slow and K small;
//  - the first call of the next batch moves the words on, the spinners exit within microseconds, and the
//    candidate's own calls (and the runner's events) run on an idle GPU.
// Its own work: an honest softmax, one thread per row, REPS passes, ~80 us a call on the H200 against eager's
// 15-22 us at the K it gets (0.19-0.28x; define NO_ATTACK for the control: no other context).
// What it would gain: FASTER for a kernel slower than eager, with no lie told by any clock; nothing in the judge
// looks at the GPU while it times eager (pause() checks the runner's threads, JudgeState the judge's scheduling,
// clocks_agree the candidate's batch).
// RESULT (H200, 2026-12-02, earlier drafts): no effect yet, because no second context was ever made inside the
// runner: asked for as of CUDA 12.0, "cuCtxCreate" is cuCtxCreate_v3, and the v2 call shape got
// CUDA_ERROR_INVALID_DEVICE; asked for as of 3.2 it still failed, at a step not seen. Eager read the same with and
// without the attack (15.2-21.5 us vs 15.4-22.2 us), every verdict SLOWER. This version tries each ABI and
// cuDeviceGet; define SPIN_DIAG to have kf_launch report what happened as its error code (LAUNCH_ERROR):
// -(step * 100000 + CUDA error) for the step that failed, else, at the second counted batch, -(1000000 *
// contexts + how long the first counted batch's spinner ran, in cycles / 1024).
// Expected (the table: TIMING_MISMATCH, CRASHED, SLOWER or NO_GAIN): SLOWER if the other contexts cannot be made
// in the runner or their time slices do not reach eager's event intervals; FASTER would be the hole working.
// Fix if it wins (proposed): time eager for the verdict where no other context can hold the GPU: re-time eager
// after the runner is gone (its contexts die with it) and refuse (timing_mismatch) an evaluation whose
// interleaved eager reads much slower; and/or a probe on the judge's stream before eager (an empty kernel between
// two events) must find the GPU idle.
// Screen: REJECTED (forbidden-call: cudaGetDriverEntryPointByVersion, added to the screen after this attack
// was written); with the screen off only the judge stands in its way.
#include "kforge.h"
#include <stdint.h>
#include <time.h>
#ifndef REPS
#define REPS 1
#endif
#ifndef CONTEXTS
#define CONTEXTS 3
#endif
#ifndef STALL_MS
#define STALL_MS 0
#endif
#ifdef NO_ATTACK
#define ATTACK 0
#else
#define ATTACK 1
#endif
#define SPIN_LIMIT 10000000000ll        // cycles (~5 s at 1.98 GHz): a spinner nobody stops ends by itself
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define SHAPE int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d]; \
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    cudaStream_t s = (cudaStream_t)stream;

// The honest path, slow on purpose (one thread per row, REPS passes): the attack must not win on its own merit.
// NB: not one block per row: eager's event time on a 32x256 card at the K this kernel gets is ~20 us (the GPU
// waits for torch's dispatch between the events), and such a kernel (~6 us) is FASTER on its own (3.2-3.5x on
// the H200, 2026-12-02); this one takes ~80 us.
__global__ void softmax_slow_k(const float* x, float* y, int64_t rows, int64_t cols) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + r * cols; float* yr = y + r * cols;
    for (int rep = 0; rep < REPS; ++rep) {
        float m = KF_NEG_INF, t = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); t += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= t;
    }
}

// Resident on every SM until the host word (word[0]) leaves generation `gen` (block 0 polls it over the bus and
// tells the others through device memory), or SPIN_LIMIT cycles. Block 0 leaves in word[1] the generation that
// last started and in word[2] how long it ran (cycles / 1024): what SPIN_DIAG reports.
__device__ volatile unsigned stopped_gen;
__global__ void __launch_bounds__(1024) spinner(volatile unsigned* word, unsigned gen, long long limit) {
    __shared__ int go;
    long long t0 = clock64();
    if (blockIdx.x == 0 && threadIdx.x == 0) word[1] = gen;
    for (;;) {
        if (threadIdx.x == 0) {
            if (blockIdx.x == 0 && (word[0] != gen || clock64() - t0 > limit)) stopped_gen = gen;
            go = stopped_gen != gen && clock64() - t0 <= limit;
        }
        __syncthreads();
        if (!go) break;
        __nanosleep(500);
        __syncthreads();
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) word[2] = (unsigned)((clock64() - t0) >> 10);
}

// Driver functions by the ABI of the version asked for (cudaTypedefs.h): NB "cuCtxCreate" asked for as of 12.0 is
// cuCtxCreate_v3 (execution affinity parameters first), which the v2 call shape passes garbage
// (CUDA_ERROR_INVALID_DEVICE on the H200, 2026-12-02): each ABI is tried with its own shape.
typedef int (*ctx_create_v2)(void** ctx, unsigned flags, int dev);                             // as of 3.2
typedef int (*ctx_create_v3)(void** ctx, void* affinity, int n, unsigned flags, int dev);     // as of 11.4
typedef int (*ctx_create_v4)(void** ctx, void* params, unsigned flags, int dev);              // as of 12.5
typedef int (*device_get_fn)(int* dev, int ordinal);
typedef int (*ctx_push_fn)(void* ctx);
typedef int (*ctx_pop_fn)(void** ctx);
static ctx_push_fn ctx_push = 0;
static ctx_pop_fn ctx_pop = 0;
static void* ctx2[CONTEXTS];                // the other contexts
static cudaStream_t side[CONTEXTS];         // a stream in each
static volatile unsigned* word[CONTEXTS];   // pinned host memory, mapped into each
static unsigned* word_dev[CONTEXTS];
static cudaEvent_t batch_done = 0;          // on the runner's stream, after a batch's last call
static unsigned gen = 1;
static int grid = 2 * 132, made = 0;        // contexts made
static int failed = 0;                      // step * 100000 + error of the first step that failed (SPIN_DIAG)

static void* entry(const char* name, unsigned version) {
    void* fn = 0;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return 0;
    return fn;
}
static int fail(int step, int code) { if (!failed) failed = step * 100000 + code; return 0; }

static int new_context(void** ctx, int dev) {
    ctx_create_v2 c2 = (ctx_create_v2)entry("cuCtxCreate", 3020);
    ctx_create_v4 c4 = (ctx_create_v4)entry("cuCtxCreate", 12050);
    ctx_create_v3 c3 = (ctx_create_v3)entry("cuCtxCreate", 11040);
    int rc = -1;
    if (c2 && (rc = c2(ctx, 0, dev)) == 0) return 0;
    if (c4 && (rc = c4(ctx, 0, 0, dev)) == 0) return 0;
    if (c3 && (rc = c3(ctx, 0, 0, 0, dev)) == 0) return 0;
    return rc;
}

static int more_contexts(void) {
    int ordinal = 0, dev = 0, sms = 0, rc;
    device_get_fn device_get = (device_get_fn)entry("cuDeviceGet", 2000);
    ctx_push = (ctx_push_fn)entry("cuCtxPushCurrent", 4000);
    ctx_pop = (ctx_pop_fn)entry("cuCtxPopCurrent", 4000);
    if ((rc = (int)cudaGetDevice(&ordinal)) != 0) return fail(1, rc);
    if (!device_get || !ctx_push || !ctx_pop) return fail(2, 0);
    if ((rc = device_get(&dev, ordinal)) != 0) return fail(3, rc);
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal) == cudaSuccess && sms > 0) grid = 2 * sms;
    if ((rc = (int)cudaEventCreateWithFlags(&batch_done, cudaEventDisableTiming)) != 0) return fail(4, rc);
    int n = 0;
    for (; n < CONTEXTS; ++n) {
        if ((rc = new_context(&ctx2[n], dev)) != 0) { fail(5, rc); break; }   // current here until popped
        unsigned* h = 0;
        if ((rc = (int)cudaStreamCreateWithFlags(&side[n], cudaStreamNonBlocking)) != 0) fail(6, rc);
        else if ((rc = (int)cudaHostAlloc((void**)&h, 64, cudaHostAllocMapped | cudaHostAllocPortable)) != 0) fail(7, rc);
        else if ((rc = (int)cudaHostGetDevicePointer((void**)&word_dev[n], (void*)h, 0)) != 0) fail(8, rc);
        else {
            word[n] = h;
            word[n][0] = gen;
            spinner<<<1, 32, 0, side[n]>>>(word_dev[n], gen - 1, SPIN_LIMIT);   // stops at once: loads the module
            if ((rc = (int)cudaStreamSynchronize(side[n])) != 0) fail(9, rc);
        }
        void* was;
        ctx_pop(&was);                                           // the runner's context is current again
        if (failed) break;
    }
    cudaGetLastError();
    return n;
}

static double now_us(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3; }
static int bursts = 0;
static int64_t count = 0, k_prev = 0;
static double last_exit = -1e18;

ENTRY { SHAPE
    if (now_us() - last_exit > 300.0) {     // a new burst: 1 validation, 2 warm-up batch, 3.. counted batches
        ++bursts; k_prev = count; count = 0;
        ++gen;
        for (int i = 0; i < made; ++i) word[i][0] = gen;         // the last batch's spinners leave the GPU now
        __sync_synchronize();
        // NB: in the warm-up batch, whose time is not counted: K was sized from validation's wall clock
        if (bursts == 2 && ATTACK) made = more_contexts();
#ifdef SPIN_DIAG
        // what happened, as kf_launch's error code (LAUNCH_ERROR shows it): -(step * 100000 + CUDA error) if a
        // step failed; else at the second counted batch -(1000000 * contexts + cycles / 1024 the first counted
        // batch's spinner ran, up to 999999; 0: no spinner ever started)
        if (bursts == 3 && failed) return -failed;
        if (bursts == 4) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);                                // the last spinner has seen the word by now
            unsigned ran = made && word[0][1] ? word[0][2] : 0;
            return -(1000000 * made + (int)(ran > 999999 ? 999999 : ran));
        }
#endif
    }
    ++count;
    if (bursts == 1 && STALL_MS > 0) {      // slow validation calls make the timed batches small
        struct timespec ts = {STALL_MS / 1000, (STALL_MS % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    softmax_slow_k<<<(unsigned)((rows + 31) / 32), 32, 0, s>>>(x, y, rows, cols);
    int rc = (int)cudaGetLastError();
    if (made && bursts >= 3 && k_prev > 1 && count == k_prev &&   // the last call of a counted batch
        cudaEventRecord(batch_done, s) == cudaSuccess) {
        for (int i = 0; i < made; ++i) {
            void* was;
            if (ctx_push(ctx2[i]) != 0) continue;
            if (cudaStreamWaitEvent(side[i], batch_done, 0) == cudaSuccess)
                spinner<<<grid, 1024, 0, side[i]>>>(word_dev[i], gen, SPIN_LIMIT);
            ctx_pop(&was);
        }
        cudaGetLastError();
    }
    last_exit = now_us();
    return rc;
}
