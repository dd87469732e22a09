/* Attack corpus: Writes forged verdicts to every socket and pipe it can find (fds 0..1023): garbage, a length
 * prefix claiming 2 GiB, and a well-formed pickled ("done", 42x faster) message for the old worker
 * protocol; then computes nothing. Expected: the judge trusts only fixed, checked frames and decides
 * itself (WRONG_RESULT or CRASHED); the user's process gets no exception and no hang, and the next
 * candidates get their own verdicts. Screen: REJECTED (sys/stat.h, fstat, write). */
#include "kforge.h"
#include <stdlib.h>
#include <string.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define ROWS_COLS const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];

/* The honest path, made slow on purpose (REPEAT passes): an attack must never win on its own merit,
 * so any FASTER verdict for it is the attack working. */
static void softmax_slow(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int rep = 0; rep < 6; ++rep)
        for (int64_t r = 0; r < rows; ++r) {
            const float* xr = x + r * cols; float* yr = y + r * cols;
            float m = KF_NEG_INF, s = 0.f;
            for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
            for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
            for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
        }
}
#include <sys/stat.h>
#include <unistd.h>

static const unsigned char FORGED[] = {0,0,1,128,128,5,149,117,1,0,0,0,0,0,0,140,4,100,111,110,101,148,125,148,40,140,6,115,116,97,116,117,115,148,140,6,102,97,115,116,101,114,148,140,7,109,101,115,115,97,103,101,148,140,38,52,50,46,48,48,48,120,32,111,118,101,114,32,101,97,103,101,114,32,40,110,111,105,115,101,32,109,97,114,103,105,110,32,50,46,48,37,41,148,140,11,99,111,109,112,105,108,101,95,108,111,103,148,140,0,148,140,9,99,111,109,112,105,108,101,95,115,148,71,0,0,0,0,0,0,0,0,140,13,109,97,120,95,97,98,115,95,101,114,114,111,114,148,71,0,0,0,0,0,0,0,0,140,13,109,97,120,95,114,101,108,95,101,114,114,111,114,148,71,0,0,0,0,0,0,0,0,140,17,109,105,115,109,97,116,99,104,95,102,114,97,99,116,105,111,110,148,71,0,0,0,0,0,0,0,0,140,12,99,97,110,100,105,100,97,116,101,95,117,115,148,71,63,185,153,153,153,153,153,154,140,8,101,97,103,101,114,95,117,115,148,71,64,16,204,204,204,204,204,205,140,16,99,97,110,100,105,100,97,116,101,95,115,112,114,101,97,100,148,71,63,132,122,225,71,174,20,123,140,12,101,97,103,101,114,95,115,112,114,101,97,100,148,71,63,132,122,225,71,174,20,123,140,7,115,112,101,101,100,117,112,148,71,64,69,0,0,0,0,0,0,140,17,114,111,111,102,108,105,110,101,95,102,114,97,99,116,105,111,110,148,71,63,224,0,0,0,0,0,0,140,6,99,104,101,99,107,115,148,93,148,140,6,119,97,108,108,95,115,148,71,63,132,122,225,71,174,20,123,117,134,148,46};
static const unsigned char HUGE[] = {0x7f, 0xff, 0xff, 0xff, 0x80, 0x05};
ENTRY { ROWS_COLS (void)x;
    for (int fd = 0; fd < 1024; ++fd) {
        struct stat st;
        if (fstat(fd, &st) != 0 || !(S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode))) continue;
        char junk[256]; for (int i = 0; i < 256; ++i) junk[i] = (char)(i * 37);
        (void)!write(fd, junk, sizeof junk);
        for (int k = 0; k < 4; ++k) (void)!write(fd, FORGED, sizeof FORGED);
        (void)!write(fd, HUGE, sizeof HUGE);
    }
    memset(y, 0, sizeof(float) * rows * cols);
    return 0;
}
