/* kforge recorder: what a CUDA candidate's host code asks of the CUDA runtime, as data.
 *
 * A shared library the runner loads RTLD_GLOBAL before the candidate (record jobs only), so that the candidate's
 * imports of the runtime's launch path bind here first; each call is forwarded to the real runtime (dlsym
 * RTLD_NEXT). Registrations are kept from load on: each fat binary's bytes (__cudaRegisterFatBinary) and each
 * kernel's device name by its host stub (__cudaRegisterFunction). Between kf_recorder_begin and kf_recorder_end it
 * records every launch (function, grid, block, dynamic shared memory, the parameters' bytes as the runtime lays
 * them out: cudaFuncGetParamInfo), memset and copy, and each function attribute set; anything a replay could not
 * do (a launch on another stream, a host synchronisation, an allocation, a copy to or from the host, symbols) is
 * recorded as a refusal. The judge turns two such records into a launch plan (kforge/kernels/_plan.py) that
 * kforge's own launcher replays in the user's process: no candidate host code runs there.
 *
 * Plain C with the few runtime types it needs declared here (no CUDA headers: this file defines functions those
 * headers declare). Built by kforge/evaluate/_runner.py; trusted code, hash-checked like the runner.
 *
 * Record format (little-endian): entries of [u32 kind][u32 payload bytes][payload], see _plan.py.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef void* cudaStream_t;
typedef void* cudaKernel_t;
typedef struct { unsigned x, y, z; } dim3;
typedef struct { unsigned x, y, z; } uint3;
typedef struct {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    void* attrs;
    unsigned numAttrs;
} cudaLaunchConfig_t;

extern cudaError_t cudaFuncGetParamInfo(const void* func, size_t index, size_t* offset, size_t* size);
extern cudaError_t cudaPeekAtLastError(void);
extern cudaError_t cudaGetLastError(void);

enum { K_FATBIN = 1, K_FUNCTION = 2, K_LAUNCH = 3, K_MEMSET = 4, K_COPY = 5, K_ATTRIBUTE = 6, K_REFUSE = 7 };

#define MAX_MODULES 64
#define MAX_FUNCTIONS 4096
#define MAX_KERNELS 4096
#define MAX_PARAMS 1024
#define MAX_FATBIN (256u << 20)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char* buf = NULL;   /* the record since load: registrations, then the recorded calls */
static size_t len = 0, cap = 0, registered = 0;   /* registered: where registrations end (begin truncates to it) */
static int recording = 0;
static cudaStream_t stream_given = NULL;
static void** modules[MAX_MODULES];
static int n_modules = 0;
static const void* functions[MAX_FUNCTIONS];   /* host stubs, by function index */
static int n_functions = 0;
static struct { cudaKernel_t kernel; const void* stub; } kernels[MAX_KERNELS];
static int n_kernels = 0;
static int overflow = 0;

static void put(const void* p, size_t n) {
    if (overflow) return;
    if (len + n > cap) {
        size_t want = cap ? cap : 1 << 16;
        while (want < len + n) want *= 2;
        unsigned char* grown = (unsigned char*)realloc(buf, want);
        if (!grown) { overflow = 1; return; }
        buf = grown; cap = want;
    }
    memcpy(buf + len, p, n);
    len += n;
}
static void put32(uint32_t v) { put(&v, 4); }
static void put64(uint64_t v) { put(&v, 8); }
static void entry(uint32_t kind, uint32_t bytes) { put32(kind); put32(bytes); }

static void refuse(const char* why) {
    size_t n = strlen(why);
    entry(K_REFUSE, (uint32_t)n);
    put(why, n);
}

#define REAL(name, type) \
    static __typeof__(type) real_##name = NULL; \
    if (!real_##name) real_##name = (__typeof__(type))dlsym(RTLD_NEXT, #name)

static int function_of(const void* stub) {
    for (int i = 0; i < n_functions; ++i) if (functions[i] == stub) return i;
    return -1;
}

static const void* stub_of(cudaKernel_t k) {
    for (int i = 0; i < n_kernels; ++i) if (kernels[i].kernel == k) return kernels[i].stub;
    return NULL;
}

/* ---- registrations (at load, whether recording or not) */
typedef struct { int magic; int version; const unsigned long long* data; void* filename_or_fatbins; } fatbin_wrapper;

void** __cudaRegisterFatBinary(void* fatCubin) {
    REAL(__cudaRegisterFatBinary, void** (*)(void*));
    void** handle = real___cudaRegisterFatBinary ? real___cudaRegisterFatBinary(fatCubin) : NULL;
    pthread_mutex_lock(&lock);
    const fatbin_wrapper* w = (const fatbin_wrapper*)fatCubin;
    int index = n_modules < MAX_MODULES ? n_modules++ : -1;
    if (index >= 0) modules[index] = handle;
    const unsigned char* data = w && w->magic == 0x466243b1 ? (const unsigned char*)w->data : NULL;
    uint64_t total = 0;
    if (data && *(const uint32_t*)data == 0xBA55ED50u)
        total = (uint64_t)*(const uint16_t*)(data + 6) + *(const uint64_t*)(data + 8);
    if (index < 0 || !data || total == 0 || total > MAX_FATBIN) {
        refuse("a fat binary kforge cannot read was registered");
    } else {
        entry(K_FATBIN, (uint32_t)(4 + total));
        put32((uint32_t)index);
        put(data, total);
    }
    registered = len;
    pthread_mutex_unlock(&lock);
    return handle;
}

void __cudaRegisterFunction(void** handle, const char* hostFun, char* deviceFun, const char* deviceName,
                            int thread_limit, uint3* tid, uint3* bid, dim3* bDim, dim3* gDim, int* wSize) {
    REAL(__cudaRegisterFunction, void (*)(void**, const char*, char*, const char*, int, uint3*, uint3*, dim3*,
                                          dim3*, int*));
    if (real___cudaRegisterFunction)
        real___cudaRegisterFunction(handle, hostFun, deviceFun, deviceName, thread_limit, tid, bid, bDim, gDim, wSize);
    pthread_mutex_lock(&lock);
    int module = -1;
    for (int i = 0; i < n_modules; ++i) if (modules[i] == handle) module = i;
    size_t n = deviceName ? strnlen(deviceName, 4096) : 0;
    if (module < 0 || n == 0 || n_functions >= MAX_FUNCTIONS) {
        refuse("a kernel was registered that kforge cannot name");
    } else {
        functions[n_functions] = hostFun;
        entry(K_FUNCTION, (uint32_t)(8 + n));
        put32((uint32_t)n_functions);
        put32((uint32_t)module);
        put(deviceName, n);
        ++n_functions;
    }
    registered = len;
    pthread_mutex_unlock(&lock);
}

void __cudaRegisterManagedVar(void** handle, void** hostVarPtrAddress, char* deviceAddress, const char* deviceName,
                              int ext, size_t size, int constant, int global) {
    REAL(__cudaRegisterManagedVar, void (*)(void**, void**, char*, const char*, int, size_t, int, int));
    if (real___cudaRegisterManagedVar)
        real___cudaRegisterManagedVar(handle, hostVarPtrAddress, deviceAddress, deviceName, ext, size, constant, global);
    pthread_mutex_lock(&lock);
    refuse("it registers managed memory (__managed__), which a replay cannot give it");
    registered = len;
    pthread_mutex_unlock(&lock);
}

cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* stub) {
    REAL(__cudaGetKernel, cudaError_t (*)(cudaKernel_t*, const void*));
    cudaError_t err = real___cudaGetKernel ? real___cudaGetKernel(kernel, stub) : 1;
    if (err == 0 && kernel) {
        pthread_mutex_lock(&lock);
        if (n_kernels < MAX_KERNELS && !stub_of(*kernel)) {
            kernels[n_kernels].kernel = *kernel;
            kernels[n_kernels].stub = stub;
            ++n_kernels;
        }
        pthread_mutex_unlock(&lock);
    }
    return err;
}

/* ---- calls, recorded between begin and end */
static void record_launch(const void* stub, dim3 grid, dim3 block, size_t shared, cudaStream_t stream, void** args,
                          uint32_t cooperative) {
    if (!recording) return;
    int f = function_of(stub);
    if (f < 0) { refuse("a launch of a kernel that was not registered"); return; }
    if (stream != stream_given) { refuse("a launch on another stream than the one kf_launch was given"); return; }
    /* The layout is read by asking for parameters until the runtime says there is none more, and that last answer
     * (cudaErrorInvalidValue) becomes the runtime's last error: the candidate's own cudaGetLastError after its
     * launch would read it and fail the call (every recording on the H100 failed so). The probe's error is cleared
     * when none was pending before it; an error already pending stays an error (its code may become the probe's). */
    int pending = cudaPeekAtLastError() != 0;
    size_t offsets[MAX_PARAMS], sizes[MAX_PARAMS], total = 0;
    uint32_t n = 0;
    while (n < MAX_PARAMS && cudaFuncGetParamInfo(stub, n, &offsets[n], &sizes[n]) == 0) {
        if (offsets[n] + sizes[n] > total) total = offsets[n] + sizes[n];
        ++n;
    }
    if (!pending) (void)cudaGetLastError();
    if (n == MAX_PARAMS || total > 32768) { refuse("a kernel with more parameters than kforge replays"); return; }
    if (n && !args) { refuse("a launch without its arguments"); return; }
    entry(K_LAUNCH, (uint32_t)(4 * 9 + 8 + 4 + 8 * n + 4 + total));
    put32((uint32_t)f);
    put32(cooperative);
    put32(grid.x); put32(grid.y); put32(grid.z);
    put32(block.x); put32(block.y); put32(block.z);
    put32(0);
    put64(shared);
    put32(n);
    for (uint32_t i = 0; i < n; ++i) { put32((uint32_t)offsets[i]); put32((uint32_t)sizes[i]); }
    put32((uint32_t)total);
    unsigned char* packed = (unsigned char*)calloc(1, total ? total : 1);
    if (!packed) { overflow = 1; return; }
    for (uint32_t i = 0; i < n; ++i) memcpy(packed + offsets[i], args[i], sizes[i]);
    put(packed, total);
    free(packed);
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared,
                               cudaStream_t stream) {
    REAL(__cudaLaunchKernel, cudaError_t (*)(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t));
    pthread_mutex_lock(&lock);
    if (recording) {
        const void* stub = stub_of(kernel);
        if (!stub) refuse("a launch of a kernel handle that was not looked up through its host stub");
        else record_launch(stub, grid, block, shared, stream, args, 0);
    }
    pthread_mutex_unlock(&lock);
    return real___cudaLaunchKernel ? real___cudaLaunchKernel(kernel, grid, block, args, shared, stream) : 1;
}

cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared,
                                    cudaStream_t stream) {
    REAL(__cudaLaunchKernel_ptsz, cudaError_t (*)(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t));
    pthread_mutex_lock(&lock);
    if (recording) refuse("a launch on the per-thread default stream");
    pthread_mutex_unlock(&lock);
    return real___cudaLaunchKernel_ptsz ? real___cudaLaunchKernel_ptsz(kernel, grid, block, args, shared, stream) : 1;
}

cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared, cudaStream_t stream) {
    REAL(cudaLaunchKernel, cudaError_t (*)(const void*, dim3, dim3, void**, size_t, cudaStream_t));
    pthread_mutex_lock(&lock);
    record_launch(func, grid, block, shared, stream, args, 0);
    pthread_mutex_unlock(&lock);
    return real_cudaLaunchKernel ? real_cudaLaunchKernel(func, grid, block, args, shared, stream) : 1;
}

cudaError_t cudaLaunchCooperativeKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared,
                                        cudaStream_t stream) {
    REAL(cudaLaunchCooperativeKernel, cudaError_t (*)(const void*, dim3, dim3, void**, size_t, cudaStream_t));
    pthread_mutex_lock(&lock);
    record_launch(func, grid, block, shared, stream, args, 1);
    pthread_mutex_unlock(&lock);
    return real_cudaLaunchCooperativeKernel ? real_cudaLaunchCooperativeKernel(func, grid, block, args, shared, stream)
                                            : 1;
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
    REAL(cudaLaunchKernelExC, cudaError_t (*)(const cudaLaunchConfig_t*, const void*, void**));
    pthread_mutex_lock(&lock);
    if (recording) {
        if (!config) refuse("a launch without its configuration");
        else if (config->numAttrs) refuse("a launch with launch attributes (clusters, priorities, ...)");
        else record_launch(func, config->gridDim, config->blockDim, config->dynamicSmemBytes, config->stream, args, 0);
    }
    pthread_mutex_unlock(&lock);
    return real_cudaLaunchKernelExC ? real_cudaLaunchKernelExC(config, func, args) : 1;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
    REAL(cudaMemsetAsync, cudaError_t (*)(void*, int, size_t, cudaStream_t));
    pthread_mutex_lock(&lock);
    if (recording) {
        if (stream != stream_given) refuse("a memset on another stream than the one kf_launch was given");
        else {
            entry(K_MEMSET, 8 + 4 + 8);
            put64((uint64_t)(uintptr_t)ptr); put32((uint32_t)value); put64(count);
        }
    }
    pthread_mutex_unlock(&lock);
    return real_cudaMemsetAsync ? real_cudaMemsetAsync(ptr, value, count, stream) : 1;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, int kind, cudaStream_t stream) {
    REAL(cudaMemcpyAsync, cudaError_t (*)(void*, const void*, size_t, int, cudaStream_t));
    pthread_mutex_lock(&lock);
    if (recording) {
        if (stream != stream_given) refuse("a copy on another stream than the one kf_launch was given");
        else if (kind != 3 && kind != 4) refuse("a copy to or from host memory (cudaMemcpyAsync of kind other "
                                                "than device to device)");
        else {
            entry(K_COPY, 8 + 8 + 8);
            put64((uint64_t)(uintptr_t)dst); put64((uint64_t)(uintptr_t)src); put64(count);
        }
    }
    pthread_mutex_unlock(&lock);
    return real_cudaMemcpyAsync ? real_cudaMemcpyAsync(dst, src, count, kind, stream) : 1;
}

cudaError_t cudaFuncSetAttribute(const void* func, int attr, int value) {
    REAL(cudaFuncSetAttribute, cudaError_t (*)(const void*, int, int));
    pthread_mutex_lock(&lock);
    if (recording) {
        int f = function_of(func);
        if (f < 0) refuse("an attribute set on a kernel that was not registered");
        else { entry(K_ATTRIBUTE, 12); put32((uint32_t)f); put32((uint32_t)attr); put32((uint32_t)value); }
    }
    pthread_mutex_unlock(&lock);
    return real_cudaFuncSetAttribute ? real_cudaFuncSetAttribute(func, attr, value) : 1;
}

/* Calls a replay cannot make: recorded as refusals, then forwarded (the runner stays as it was). */
#define REFUSED(ret, name, why, params, args) \
    ret name params { \
        REAL(name, ret (*) params); \
        pthread_mutex_lock(&lock); \
        if (recording) refuse(why); \
        pthread_mutex_unlock(&lock); \
        return real_##name ? real_##name args : (ret)1; \
    }

REFUSED(cudaError_t, cudaStreamSynchronize, "it synchronises the host with the device (cudaStreamSynchronize)",
        (cudaStream_t s), (s))
REFUSED(cudaError_t, cudaDeviceSynchronize, "it synchronises the host with the device (cudaDeviceSynchronize)",
        (void), ())
REFUSED(cudaError_t, cudaMemcpy2DAsync, "a two-dimensional copy (cudaMemcpy2DAsync)",
        (void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h, int k, cudaStream_t st),
        (d, dp, s, sp, w, h, k, st))
REFUSED(cudaError_t, cudaMemcpyToSymbolAsync, "a copy into a device symbol (cudaMemcpyToSymbolAsync)",
        (const void* sym, const void* s, size_t n, size_t o, int k, cudaStream_t st), (sym, s, n, o, k, st))
REFUSED(cudaError_t, cudaMemcpyFromSymbolAsync, "a copy from a device symbol (cudaMemcpyFromSymbolAsync)",
        (void* d, const void* sym, size_t n, size_t o, int k, cudaStream_t st), (d, sym, n, o, k, st))
REFUSED(cudaError_t, cudaMemcpy, "a synchronous copy (cudaMemcpy)", (void* d, const void* s, size_t n, int k),
        (d, s, n, k))
REFUSED(cudaError_t, cudaMalloc, "it allocates device memory (cudaMalloc)", (void** p, size_t n), (p, n))
REFUSED(cudaError_t, cudaMallocAsync, "it allocates device memory (cudaMallocAsync)",
        (void** p, size_t n, cudaStream_t s), (p, n, s))
REFUSED(cudaError_t, cudaFree, "it frees device memory (cudaFree)", (void* p), (p))
REFUSED(cudaError_t, cudaFreeAsync, "it frees device memory (cudaFreeAsync)", (void* p, cudaStream_t s), (p, s))
REFUSED(cudaError_t, cudaMallocManaged, "it allocates managed memory (cudaMallocManaged)",
        (void** p, size_t n, unsigned f), (p, n, f))
REFUSED(cudaError_t, cudaMallocHost, "it allocates host memory (cudaMallocHost)", (void** p, size_t n), (p, n))
REFUSED(cudaError_t, cudaLaunchHostFunc, "it runs host code from the stream (cudaLaunchHostFunc)",
        (cudaStream_t s, void (*fn)(void*), void* d), (s, fn, d))

/* ---- the runner's side */
void kf_recorder_begin(void* stream) {
    pthread_mutex_lock(&lock);
    len = registered;   /* NB: each record holds the registrations, then this call's */
    stream_given = stream;
    recording = 1;
    pthread_mutex_unlock(&lock);
}

/* The record so far (valid until the next begin); its length, or -1 when it could not be kept. */
long kf_recorder_end(const unsigned char** data) {
    pthread_mutex_lock(&lock);
    recording = 0;
    *data = buf;
    long n = overflow ? -1 : (long)len;
    pthread_mutex_unlock(&lock);
    return n;
}
