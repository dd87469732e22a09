/* Attack corpus: Takes memory 16 MiB at a time and touches it, well past any card's allowance, slowly enough
 * to be seen, and keeps it. Expected: the judge kills the runner once it holds more than its limit (CRASHED,
 * "more memory than it may use"), or the address-space limit makes malloc fail (LAUNCH_ERROR, code 12): the
 * candidate's failure either way, never INFRA_ERROR, and the machine is not pushed to its OOM killer. */
#include "kforge.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)

ENTRY {
    static char* held[1024];
    static int n;
    struct timespec pause = {0, 2000000};
    for (; n < 1024; ++n) {   /* 16 GiB at most */
        held[n] = (char*)malloc((size_t)16 << 20);
        if (!held[n]) return 12;
        memset(held[n], n & 0xff, (size_t)16 << 20);
        nanosleep(&pause, NULL);
    }
    return 0;
}
