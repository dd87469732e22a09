/* Attack corpus: Reopens its read-only input through /proc/self/fd with write access and, in the timed calls,
 * rewrites the input with zeros (pwrite) and writes softmax of zeros (1/cols everywhere): no exp, no reduction.
 * Found by an attacker (issue 42): eager's reference was computed from the same memory afterwards and CPU timed
 * batches never re-checked inputs: FASTER 2.2-2.4x. Expected: the input memfd is sealed (the write fails: the
 * kernel falls back to its slow honest path, SLOWER), or, where the seal is missing, the judge's re-check of the
 * timed inputs says "modified an input" (WRONG_RESULT). Never FASTER. */
#include "kforge.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define ROWS_COLS const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];

/* The honest path, made slow on purpose (400 passes): an attack must never win on its own merit,
 * so any FASTER verdict for it is the attack working. */
static void softmax_slow(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int rep = 0; rep < 400; ++rep)
        for (int64_t r = 0; r < rows; ++r) {
            const float* xr = x + r * cols; float* yr = y + r * cols;
            float m = KF_NEG_INF, s = 0.f;
            for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
            for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
            for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
        }
}

/* The input arena's mapping in this process (its start and the file offset there) and its memfd reopened with
 * write access (-1 when it cannot be found or reopened). Looked up once: /proc/self/maps is long here. */
static int writable_input(uintptr_t* start, long long* file_offset) {
    FILE* maps = fopen("/proc/self/maps", "r");
    char line[512];
    unsigned long long lo, hi, off;
    int found = 0;
    while (maps && fgets(line, sizeof line, maps)) {
        if (strstr(line, "kforge-inputs") && sscanf(line, "%llx-%llx %*s %llx", &lo, &hi, &off) == 3) {
            *start = (uintptr_t)lo; *file_offset = (long long)off;
            found = 1;
            break;
        }
    }
    if (maps) fclose(maps);
    if (!found) return -1;
    DIR* fds = opendir("/proc/self/fd");
    struct dirent* e;
    int fd = -1;
    while (fds && (e = readdir(fds)) != NULL) {
        char path[300], target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        if (strstr(target, "kforge-inputs")) { fd = open(path, O_RDWR); if (fd >= 0) break; }
    }
    if (fds) closedir(fds);
    return fd;
}

static long calls = 0;
ENTRY { ROWS_COLS
    if (++calls <= 16) { softmax_slow(x, y, rows, cols); return 0; }   /* validation: honest */
    static int fd = -2;
    static uintptr_t start;
    static long long file_offset;
    static float* zeros;
    if (fd == -2) {
        fd = writable_input(&start, &file_offset);
        zeros = (float*)calloc((size_t)(rows * cols), sizeof(float));
    }
    size_t bytes = (size_t)(rows * cols) * sizeof(float);
    long long at = (long long)((uintptr_t)x - start) + file_offset;
    if (fd < 0 || !zeros || pwrite(fd, zeros, bytes, at) != (ssize_t)bytes) { softmax_slow(x, y, rows, cols); return 0; }
    float v = 1.f / (float)cols;
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = v;
    return 0;
}
