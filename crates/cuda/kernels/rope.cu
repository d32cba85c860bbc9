// Rotate-half (NeoX) RoPE on the first `rotary_dim` dims of every head of x [T, heads, head_dim].
// The angle is the same f32 product as the reference's (`position * inv_freq`, inv_freq computed on
// the host exactly as there); cos, sin and the rotation run in double, as in the reference.

// Dims f and f + half of one head `v` rotated by the angle of `position` at frequency `inv_freq`
// (rope and qk_norm_rope).
__device__ __forceinline__ void rotate_pair(float* v, int f, int half, unsigned int position, float inv_freq) {
    const float angle = __fmul_rn((float)position, inv_freq);
    const double c = cos((double)angle), s = sin((double)angle);
    const double a = (double)v[f], b = (double)v[f + half];
    v[f] = (float)__dsub_rn(__dmul_rn(a, c), __dmul_rn(b, s));
    v[f + half] = (float)__dadd_rn(__dmul_rn(b, c), __dmul_rn(a, s));
}

extern "C" __global__ void rope(float* x, const unsigned int* positions, const float* inv_freq,
                                i64 tokens, int heads, int head_dim, int rotary_dim) {
    AFTER_PREVIOUS_KERNEL();
    const int half = rotary_dim / 2;
    FOR_EACH(i, tokens * heads * half) {
        const int f = (int)(i % half);
        const i64 th = i / half;  // token * heads + head
        const i64 t = th / heads;
        rotate_pair(x + th * head_dim, f, half, positions[t], inv_freq[f]);
    }
}

// The gated attention's per-head q and k norms (zero-centred RMSNorm over head_dim) and then RoPE on
// both, in one launch: block r < q_rows takes row r of q (one head of one token), the others the
// rows of k. Each part is rms_norm's and rope's code (rms_norm_row and rotate_pair, with row_config's
// block for dim = head_dim, as rms_norm's), so the result is the four launches' bit for bit.
extern "C" __global__ void qk_norm_rope(const float* q_raw, const float* k_raw, const float* q_w, const float* k_w,
                                        float* q, float* k, const unsigned int* positions, const float* inv_freq,
                                        i64 q_rows, int q_heads, int kv_heads, int head_dim, int rotary_dim,
                                        float eps) {
    AFTER_PREVIOUS_KERNEL();
    __shared__ float scratch[32];
    const bool is_q = blockIdx.x < q_rows;
    const i64 row = is_q ? (i64)blockIdx.x : (i64)blockIdx.x - q_rows;
    float* v = (is_q ? q : k) + row * head_dim;
    rms_norm_row((is_q ? q_raw : k_raw) + row * head_dim, is_q ? q_w : k_w, v, head_dim, eps, scratch);
    __syncthreads();  // the rotation reads other threads' normed values
    const int half = rotary_dim / 2;
    const i64 t = row / (is_q ? q_heads : kv_heads);
    for (int f = threadIdx.x; f < half; f += blockDim.x) rotate_pair(v, f, half, positions[t], inv_freq[f]);
}
