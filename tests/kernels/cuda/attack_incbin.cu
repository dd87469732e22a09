// Attack corpus (CUDA): the assembler's .incbin puts a file's bytes (/etc/passwd) into the library's host data,
// copied into the output. Expected: REJECTED by the screen (inline assembly); with it off, COMPILE_ERROR (the
// compiler's jail refuses to read the file), or WRONG_RESULT where the kernel has no Landlock.
#define EXTERN_C extern "C"
#include "kforge.h"
#include <stdlib.h>
#include <string.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define SHAPE int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d]; \
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    cudaStream_t s = (cudaStream_t)stream;

/* /etc/passwd assembled into the library's read-only data, then copied into the output */
__asm__(".section .rodata\n.globl kf_loot\nkf_loot:\n.incbin \"/etc/passwd\"\n.byte 0\n.previous\n");
EXTERN_C const char kf_loot[];

ENTRY { SHAPE (void)x;
    size_t n = strlen(kf_loot), total = (size_t)(rows * cols) * sizeof(float);
    cudaMemsetAsync(y, 0, total, s);
    cudaMemcpyAsync(y, kf_loot, n < total ? n : total, cudaMemcpyHostToDevice, s);
    return (int)cudaGetLastError();
}
