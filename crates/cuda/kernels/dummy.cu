// `--load-format dummy` on the device: the values crates/model/src/dummy.rs draws on the host, bit for
// bit. Each chunk of `chunk_elems` elements is a SplitMix64 stream; its state after p steps is
// seed + p * golden, so element i needs no sequential walk: pair p = (i mod chunk) / 2 is draw p + 1,
// the first of a pair takes bits 40.., the second bits 16..40. Exact f32 rounding (no FMA contraction)
// keeps `lo + u * scale` equal to the host's.

__device__ __forceinline__ unsigned long long splitmix64_at(unsigned long long seed, unsigned long long step) {
    unsigned long long z = seed + step * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Writes n values as bf16 bits (out_bf16 != 0) or f32 (out_f32), the f32 ones rounded through bf16
// when `bf16_values` (a bf16 checkpoint widened for f32 GEMMs).
extern "C" __global__ void dummy_fill(bf16_bits* out_bf16, float* out_f32, i64 n, const unsigned long long* chunk_seeds,
                                      int chunk_elems, float lo, float hi, int bf16_values) {
    const float scale = __fdiv_rn(__fsub_rn(hi, lo), 16777216.0f);
    FOR_EACH(i, n) {
        const i64 chunk = i / chunk_elems;
        const i64 within = i - chunk * chunk_elems;
        const unsigned long long r = splitmix64_at(chunk_seeds[chunk], (unsigned long long)(within / 2) + 1ull);
        const unsigned int bits = (within & 1) ? (unsigned int)((r >> 16) & 0xFFFFFFull) : (unsigned int)(r >> 40);
        const float x = __fadd_rn(lo, __fmul_rn((float)bits, scale));
        if (out_bf16) {
            out_bf16[i] = f32_to_bf16(x);
        } else {
            out_f32[i] = bf16_values ? bf16_to_f32(f32_to_bf16(x)) : x;
        }
    }
}
