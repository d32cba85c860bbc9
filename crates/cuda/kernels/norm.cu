// Row norms (one block per row of `dim`): zero-centred RMSNorm `x * rsqrt(mean(x^2) + eps) * (1 + w)`,
// the same fused with the residual add before it,
// and the GDN output's gated RMSNorm `w * x * rsqrt(mean(x^2) + eps) * silu(z)`.

extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, int dim, float eps) {
    AFTER_PREVIOUS_KERNEL();
    __shared__ float scratch[32];
    rms_norm_row(x + (i64)blockIdx.x * dim, w, out + (i64)blockIdx.x * dim, dim, eps, scratch);
}

// The residual add fused with the next norm: acc += x, then out = rms_norm(acc). Each thread reads
// back only what it wrote, and the sums run in rms_norm's order, so the result is bit for bit the
// two ops one after the other.
// Values per thread add_rms_norm keeps in registers (the launcher's block covers dim <= 8192 at 8 a
// thread): the loads of a row all issue before the first store, instead of one dependent round
// trip per step. Measured on the H200 at 32 a thread: a one-row launch of a 2048-wide row spent ~7 us
// issuing the predicated code of 32 steps (179 registers, 9 cycles per instruction); 8 keep it short.
#define ADD_NORM_PER_THREAD 8

extern "C" __global__ void add_rms_norm(float* __restrict__ acc, const float* __restrict__ x,
                                        const float* __restrict__ w, float* __restrict__ out, int dim, float eps) {
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * dim;
    float ss = 0.0f;
    if (dim <= ADD_NORM_PER_THREAD * (int)blockDim.x) {
        // The scale is a weight: read before the wait, it is in registers when the sum is done
        // instead of one more round trip after it.
        float scale[ADD_NORM_PER_THREAD];
#pragma unroll
        for (int j = 0; j < ADD_NORM_PER_THREAD; ++j) {
            const int i = threadIdx.x + j * blockDim.x;
            scale[j] = i < dim ? 1.0f + load_streaming_f32(w + i) : 0.0f;
        }
        AFTER_PREVIOUS_KERNEL();
        float v[ADD_NORM_PER_THREAD];
#pragma unroll
        for (int j = 0; j < ADD_NORM_PER_THREAD; ++j) {
            const int i = threadIdx.x + j * blockDim.x;
            v[j] = i < dim ? acc[base + i] + x[base + i] : 0.0f;
        }
        // The same order of squares as the loop below and as rms_norm.
#pragma unroll
        for (int j = 0; j < ADD_NORM_PER_THREAD; ++j) {
            const int i = threadIdx.x + j * blockDim.x;
            if (i < dim) {
                acc[base + i] = v[j];
                ss += v[j] * v[j];
            }
        }
        const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
#pragma unroll
        for (int j = 0; j < ADD_NORM_PER_THREAD; ++j) {
            const int i = threadIdx.x + j * blockDim.x;
            if (i < dim) out[base + i] = v[j] * inv * scale[j];
        }
        return;
    }
    AFTER_PREVIOUS_KERNEL();
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = acc[base + i] + x[base + i];
        acc[base + i] = v;
        ss += v * v;
    }
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[base + i] = acc[base + i] * inv * (1.0f + w[i]);
}

extern "C" __global__ void gated_rms_norm(const float* x, const float* z, const float* w, float* out, int dim, float eps) {
    AFTER_PREVIOUS_KERNEL();
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += x[base + i] * x[base + i];
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[base + i] = w[i] * x[base + i] * inv * silu_f(z[base + i]);
}
