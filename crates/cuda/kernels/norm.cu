// Row norms (one block per row of `dim`): zero-centred RMSNorm `x * rsqrt(mean(x^2) + eps) * (1 + w)`
// and the GDN output's gated RMSNorm `w * x * rsqrt(mean(x^2) + eps) * silu(z)`.

extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, int dim, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (i64)blockIdx.x * dim;
    float* orow = out + (i64)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) orow[i] = xr[i] * inv * (1.0f + w[i]);
}

extern "C" __global__ void gated_rms_norm(const float* x, const float* z, const float* w, float* out, int dim, float eps) {
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += x[base + i] * x[base + i];
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[base + i] = w[i] * x[base + i] * inv * silu_f(z[base + i]);
}
