// Rotate-half (NeoX) RoPE on the first `rotary_dim` dims of every head of x [T, heads, head_dim].
// The angle is the same f32 product as the reference's (`position * inv_freq`, inv_freq computed on
// the host exactly as there); cos, sin and the rotation run in double, as in the reference.

extern "C" __global__ void rope(float* x, const unsigned int* positions, const float* inv_freq,
                                i64 tokens, int heads, int head_dim, int rotary_dim) {
    AFTER_PREVIOUS_KERNEL();
    const int half = rotary_dim / 2;
    FOR_EACH(i, tokens * heads * half) {
        const int f = (int)(i % half);
        const i64 th = i / half;  // token * heads + head
        const i64 t = th / heads;
        const float angle = __fmul_rn((float)positions[t], inv_freq[f]);
        const double c = cos((double)angle), s = sin((double)angle);
        float* v = x + th * head_dim;
        const double a = (double)v[f], b = (double)v[f + half];
        v[f] = (float)__dsub_rn(__dmul_rn(a, c), __dmul_rn(b, s));
        v[f + half] = (float)__dadd_rn(__dmul_rn(b, c), __dmul_rn(a, s));
    }
}
