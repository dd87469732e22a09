/* Attack corpus (review 4): shrinks the judge's shared arenas. The runner inherits the output and the
 * times arenas as memfds opened O_RDWR and sealed only with F_SEAL_SEAL (no F_SEAL_SHRINK/GROW), and
 * ftruncate is not in the seccomp filter (Landlock does not cover truncate on an fd it did not open).
 * On its first call the kernel finds every writable sealed memfd among its fds and ftruncate()s it to 0;
 * the judge's MAP_SHARED mapping of the same file now raises SIGBUS on its next access (it reads the
 * times and the outputs after every batch).
 * What it would gain: kills the judge (and whatever else maps the arenas), the candidate is never
 * judged at all (infra_error is not counted against it), at will, for every candidate.
 * RESULT (review 4): WIN. With OUTPUTS_ONLY (only the output arena, fd > 4 KiB, is shrunk; the runner
 * itself writes the times arena after each call and would die of SIGBUS first): INFRA_ERROR 4 of 4,
 * "not the candidate's fault, twice: the judge process killed by SIGBUS" (Fatal Python error: Bus error
 * in _arena.py canaries_broken): two judges killed per evaluation, and the candidate never judged nor
 * counted against. Without OUTPUTS_ONLY: CRASHED 3 of 3 (the runner's own SIGBUS). The user's process
 * survived and honest softmax_rows afterwards got SLOWER 0.22-0.28x as usual.
 * Fix: the judge seals every arena memfd with F_SEAL_SHRINK | F_SEAL_GROW (then F_SEAL_SEAL) once it
 * has its size, before the runner starts (or passes the runner only O_RDONLY fds plus mappings it
 * made itself and closes the fds after mmap in the runner before the candidate is loaded); add
 * ftruncate/fallocate on those fds to the corpus.
 */
#define OUTPUTS_ONLY 1
#define _GNU_SOURCE
#include "kforge.h"
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>
static int done = 0;
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    if (!done) {
        done = 1;
        for (int f = 3; f < 64; ++f) {
            struct stat st;
            int fl = fcntl(f, F_GETFL);
            if (fl < 0 || fstat(f, &st) != 0 || !S_ISREG(st.st_mode) || (fl & O_ACCMODE) != O_RDWR) continue;
            if (fcntl(f, F_GET_SEALS) < 0) continue;     /* memfds only */
#ifdef OUTPUTS_ONLY
            if (st.st_size <= 4096) continue;          /* leave the times arena: the runner writes it */
#endif
            ftruncate(f, 0);
        }
    }
    return 0;
}
