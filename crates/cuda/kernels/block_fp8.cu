// Block-FP8 weights on the GPU (fp8.rs): quantizing generated weights as the host quantizer does
// (`--load-format dummy --quantization fp8`), and widening a matrix to bf16 for the cuBLAS path
// (prefill and batches the FP8 GEMV kernels do not take). Blocks are 128 x 128 (the launcher checks).

// The exact value of an e4m3fn code (NaN codes are never written by the quantizer).
__device__ __forceinline__ float e4m3_to_f32(unsigned char code) {
    const unsigned int e = (code >> 3) & 0xfu, m = code & 7u;
    const float magnitude = e == 0 ? (float)m * 0.001953125f  // m * 2^-9
                                   : __uint_as_float((e + 120u) << 23) * (1.0f + (float)m * 0.125f);
    return (code & 0x80u) ? -magnitude : magnitude;
}

// One block per 128 x 128 tile (grid: tile columns x tile rows): scale = amax / 448 (1 for an
// all-zero tile), code = e4m3(value / scale). `values` are bf16 bits [rows, cols].
extern "C" __global__ void quantize_block_fp8(const bf16_bits* __restrict__ values, unsigned char* __restrict__ codes,
                                              float* __restrict__ scales, int rows, int cols) {
    AFTER_PREVIOUS_KERNEL();
    __shared__ float scratch[32];
    const int r0 = blockIdx.y * FP8_BLOCK, c0 = blockIdx.x * FP8_BLOCK;
    const int tile_rows = min(FP8_BLOCK, rows - r0), tile_cols = min(FP8_BLOCK, cols - c0);
    float amax = 0.0f;
    for (int i = threadIdx.x; i < tile_rows * tile_cols; i += blockDim.x) {
        const i64 at = (i64)(r0 + i / tile_cols) * cols + c0 + i % tile_cols;
        amax = fmaxf(amax, fabsf(bf16_to_f32(values[at])));
    }
    amax = block_max(amax, scratch);
    const float scale = block_scale(amax);
    if (threadIdx.x == 0) scales[(i64)blockIdx.y * gridDim.x + blockIdx.x] = scale;
    for (int i = threadIdx.x; i < tile_rows * tile_cols; i += blockDim.x) {
        const i64 at = (i64)(r0 + i / tile_cols) * cols + c0 + i % tile_cols;
        codes[at] = f32_to_e4m3(__fdiv_rn(bf16_to_f32(values[at]), scale));
    }
}

// out[r][c] = bf16(e4m3(codes[r][c]) * scales[r / 128][c / 128]): the bits the host path gives
// (dequantized to f32 there, then rounded to bf16 on upload). A thread widens 8 codes of one row
// (cols % 8 == 0, checked by the launcher: 8 divides 128, so one scale covers them).
extern "C" __global__ void dequantize_block_fp8_bf16(const unsigned char* __restrict__ codes,
                                                     const float* __restrict__ scales, bf16_bits* __restrict__ out,
                                                     int rows, int cols) {
    AFTER_PREVIOUS_KERNEL();
    const int scale_cols = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
    const int vectors_per_row = cols / 8;
    FOR_EACH(v, (i64)rows * vectors_per_row) {
        const int r = (int)(v / vectors_per_row), c = (int)(v - (i64)r * vectors_per_row) * 8;
        const float scale = scales[(i64)(r / FP8_BLOCK) * scale_cols + c / FP8_BLOCK];
        const uint2 packed = *(const uint2*)(codes + v * 8);
        const unsigned int words[2] = {packed.x, packed.y};
        unsigned int pairs[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const unsigned int word = words[j / 2], shift = 16 * (j % 2);
            const bf16_bits lo = f32_to_bf16(__fmul_rn(e4m3_to_f32((word >> shift) & 0xffu), scale));
            const bf16_bits hi = f32_to_bf16(__fmul_rn(e4m3_to_f32((word >> (shift + 8)) & 0xffu), scale));
            pairs[j] = (unsigned int)lo | ((unsigned int)hi << 16);
        }
        *(uint4*)(out + v * 8) = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    }
}

// Activations for the FP8 tensor-core GEMM (fp8_gemm.rs): each token's f32 row cut into groups of
// 128 columns (the weights' block width), per group scale = amax / 448 (1 for an all-zero group) and
// code = e4m3(value / scale), the weights' recipe on a 1 x 128 block. Rows from `tokens` to `rows`
// pad the batch to the GEMM's row multiple: zero codes, scale 1. One warp per (row, group), four
// values a lane; cols % 128 == 0 (the launcher checks). Scales are group-major, row contiguous
// (`scales[g * rows + t]`), as cuBLASLt's 1 x 128 (VEC128) scale mode reads them.
extern "C" __global__ void quantize_activations_fp8(const float* __restrict__ x, unsigned char* __restrict__ codes,
                                                    float* __restrict__ scales, int tokens, int rows, int cols) {
    AFTER_PREVIOUS_KERNEL();
    const int groups = cols / FP8_BLOCK;
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= (i64)rows * groups) return;
    const int t = (int)(warp / groups), g = (int)(warp - (i64)t * groups);
    const i64 at = (i64)t * cols + (i64)g * FP8_BLOCK + 4 * lane;
    const float4 v = t < tokens ? *(const float4*)(x + at) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    store_fp8_group_quad(codes, scales, rows, cols, t, g, v);
}
