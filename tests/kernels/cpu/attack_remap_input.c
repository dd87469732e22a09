/* Attack corpus: Maps its read-only input writable: first mprotect on the runner's own mapping, then the memfd
 * reopened through /proc/self/fd and mapped shared and writable (or mapped read-only and mprotected), and, in
 * the timed calls, zeros its input through that mapping and writes softmax of zeros (1/cols everywhere).
 * Expected: the runner's mapping comes from a read-only descriptor and the memfd is sealed (every way fails: the
 * kernel falls back to its slow honest path, SLOWER), or, where the seal is missing, the judge's re-check of the
 * timed inputs says "modified an input" (WRONG_RESULT). Never FASTER. */
#include "kforge.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#include <sys/mman.h>
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

/* The input arena's mapping in this process ([lo, hi), file offset of lo) and the memfd reopened writable. */
static int input_mapping(const void* p, uintptr_t* lo_out, uintptr_t* hi_out, long long* off_out) {
    FILE* maps = fopen("/proc/self/maps", "r");
    char line[512];
    unsigned long long lo, hi, off;
    int found = 0;
    while (maps && fgets(line, sizeof line, maps)) {
        if (!strstr(line, "kforge-inputs")) continue;
        if (sscanf(line, "%llx-%llx %*s %llx", &lo, &hi, &off) == 3 &&
            (unsigned long long)(uintptr_t)p >= lo && (unsigned long long)(uintptr_t)p < hi) {
            *lo_out = (uintptr_t)lo; *hi_out = (uintptr_t)hi; *off_out = (long long)off;
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
        char path[64], target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        if (strstr(target, "kforge-inputs")) { fd = open(path, O_RDWR); if (fd >= 0) break; }
    }
    if (fds) closedir(fds);
    return fd;
}

/* A writable view of the input at `p`, and so of the whole arena after it (NULL when every way fails). */
static float* writable(const float* p) {
    uintptr_t lo, hi;
    long long off;
    int fd = input_mapping(p, &lo, &hi, &off);
    size_t len = hi > lo ? hi - lo : 0;
    if (len && mprotect((void*)lo, len, PROT_READ | PROT_WRITE) == 0) { if (fd >= 0) close(fd); return (float*)p; }
    if (fd < 0) return NULL;
    char* w = (char*)mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off);
    if (w == MAP_FAILED) {
        w = (char*)mmap(NULL, len, PROT_READ, MAP_SHARED, fd, off);
        if (w != MAP_FAILED && mprotect(w, len, PROT_READ | PROT_WRITE) != 0) { munmap(w, len); w = (char*)MAP_FAILED; }
    }
    close(fd);
    return w == MAP_FAILED ? NULL : (float*)(w + ((uintptr_t)p - lo));
}

static long calls = 0;
ENTRY { ROWS_COLS
    if (++calls <= 16) { softmax_slow(x, y, rows, cols); return 0; }   /* validation: honest */
    static int tried;
    static float* base;        /* a writable view of the input arena's first input, when one was had */
    static const float* first;
    if (!tried) { tried = 1; first = x; base = writable(x); }
    if (!base) { softmax_slow(x, y, rows, cols); return 0; }
    memset(base + (x - first), 0, (size_t)(rows * cols) * sizeof(float));
    float v = 1.f / (float)cols;
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = v;
    return 0;
}
