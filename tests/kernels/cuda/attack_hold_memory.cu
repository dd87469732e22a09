// Attack corpus (CUDA): Twin of cpu/attack_hold_memory.c: takes host memory 16 MiB at a time, touched, in memory
// mapped shared (which RLIMIT_DATA does not count), and keeps it. Expected: the judge kills the runner once it
// holds more than its limit (CRASHED, "more memory than it may use"), or an allocation fails (LAUNCH_ERROR, code
// 12): the candidate's failure either way, never INFRA_ERROR.
#include "kforge.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)

ENTRY {
    static char* held[4096];
    static int n;
    struct timespec pause = {0, 2000000};
    for (; n < 4096; ++n) {   // 64 GiB at most
        void* p = mmap(NULL, (size_t)16 << 20, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return 12;
        held[n] = (char*)p;
        memset(held[n], n & 0xff, (size_t)16 << 20);
        nanosleep(&pause, NULL);
    }
    return 0;
}
