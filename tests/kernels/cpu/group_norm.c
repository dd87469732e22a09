/* Correct group_norm for a contiguous float32 N,C,* input with per-channel weight and bias:
 * one (sample, group) per OpenMP task, two-pass statistics in double. */
#include "kforge.h"

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    const float* x = (const float*)in[0].data;
    const float* w = (const float*)in[1].data;
    const float* b = (const float*)in[2].data;
    float* y = (float*)out[0].data;
    int64_t n = in[0].sizes[0], c = in[0].sizes[1], hw = 1;
    for (int d = 2; d < in[0].ndim; ++d) hw *= in[0].sizes[d];
    int64_t groups = (int64_t)params[0];
    float eps = (float)params[1];
    int64_t cpg = c / groups, len = cpg * hw;
    #pragma omp parallel for collapse(2)
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t g = 0; g < groups; ++g) {
            const float* xg = x + (i * c + g * cpg) * hw;
            float* yg = y + (i * c + g * cpg) * hw;
            double sum = 0.0;
            for (int64_t k = 0; k < len; ++k) sum += xg[k];
            double mean = sum / len, var = 0.0;
            for (int64_t k = 0; k < len; ++k) { double d = xg[k] - mean; var += d * d; }
            float rstd = 1.0f / sqrtf((float)(var / len) + eps);
            for (int64_t ch = 0; ch < cpg; ++ch) {
                float scale = rstd * (w ? w[g * cpg + ch] : 1.f);
                float shift = (b ? b[g * cpg + ch] : 0.f) - (float)mean * scale;
                for (int64_t k = 0; k < hw; ++k) yg[ch * hw + k] = xg[ch * hw + k] * scale + shift;
            }
        }
    }
    return 0;
}
