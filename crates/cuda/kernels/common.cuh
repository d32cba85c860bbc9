// Helpers shared by every kernel file (prepended to each one before NVRTC compiles it).
// Self-contained on purpose: no CUDA headers are needed, so NVRTC alone can compile the kernels.
// Every kernel here is launched with a block size that is a multiple of 32 (full warps).

typedef unsigned short bf16_bits;
typedef long long i64;

// -infinity without <math.h>.
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf16_to_f32(bf16_bits b) {
    return __uint_as_float(((unsigned int)b) << 16);
}

// Round to nearest even, as torch and the `half` crate do; NaN stays a (quiet) NaN.
__device__ __forceinline__ bf16_bits f32_to_bf16(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16_bits)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_bits)(u >> 16);
}

// Two bf16 values as one 32-bit pair, the first in the low half (memory order, and the order mma
// expects), and back.
__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
    return (unsigned int)f32_to_bf16(lo) | ((unsigned int)f32_to_bf16(hi) << 16);
}
__device__ __forceinline__ float bf16_low(unsigned int pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_high(unsigned int pair) { return __uint_as_float(pair & 0xffff0000u); }

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// Sum of `v` over the block; every thread gets the same value. `scratch` holds 32 floats.
// Deterministic: the per-warp partials are added in warp order by every thread.
__device__ float block_sum(float v, float* scratch) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    __syncthreads();  // a previous reduction may still be reading `scratch`
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += scratch[w];
    return total;
}

// ---- rows read four values at a time (norm.cu, rope.cu, elementwise.cu) ----
// A row norm over a width that is a multiple of 4 reads and writes its row as float4: the buffers
// are whole allocations and rows start at multiples of 4 values, so every access is 16-byte aligned.
// 27B prefill of 2048 tokens on the H200 (docs/measurements/h200-s19-c1-*profile*): add_rms_norm
// 10.62 -> 7.57 ms over 127 rows of 5120 x 2048. Thread t takes quads t, t + blockDim, ... and adds their squares in
// this order in every norm, so the fused and the separate ops keep summing a row alike.
// ROW_QUADS=0 (DELTASERVE_CUDA_DEFINES) reads one value at a time, to measure.
#ifndef ROW_QUADS
#define ROW_QUADS 1
#endif
#define BY_QUADS(dim) (ROW_QUADS && ((dim) & 3) == 0)
__device__ __forceinline__ float add_squares4(float ss, const float4 v) {
    ss += v.x * v.x;
    ss += v.y * v.y;
    ss += v.z * v.z;
    ss += v.w * v.w;
    return ss;
}

__device__ __forceinline__ float4 add4(const float4 a, const float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__device__ __forceinline__ float4 one_plus4(const float4 w) {
    return make_float4(1.0f + w.x, 1.0f + w.y, 1.0f + w.z, 1.0f + w.w);
}

// v * inv * scale, rounded as the one-value code `x * inv * (1.0f + w)` rounds it.
__device__ __forceinline__ float4 scale4(const float4 v, float inv, const float4 scale) {
    return make_float4(v.x * inv * scale.x, v.y * inv * scale.y, v.z * inv * scale.z, v.w * inv * scale.w);
}

// ---- an op's output with its bf16 twin (buffer.rs) ----
// Ops whose output goes on to bf16 GEMMs take a `twin` pointer, null or a bf16 array beside `out`,
// and write the values rounded as cast_f32_to_bf16 rounds them, so the GEMM needs no cast.
__device__ __forceinline__ void store_with_twin(float* out, bf16_bits* twin, i64 i, float v) {
    out[i] = v;
    if (twin != nullptr) twin[i] = f32_to_bf16(v);
}

#define FP8_BLOCK 128
#define E4M3_MAX 448.0f

// The e4m3fn code nearest to x, ties to even, finite magnitudes from 448 up saturating to 448:
// crates/tensor/src/e4m3.rs `f32_to_e4m3`, step for step.
__device__ __forceinline__ unsigned char f32_to_e4m3(float x) {
    if (x != x) return 0x7f;
    const unsigned int sign = (__float_as_uint(x) >> 24) & 0x80u;
    const float a = fabsf(x);
    if (a >= E4M3_MAX) return (unsigned char)(sign | 0x7eu);
    // Below the smallest normal (2^-6) the step is 2^-9.
    if (a < 0.015625f) return (unsigned char)(sign | (unsigned int)rintf(a * 512.0f));
    // a is a normal f32 here: its exponent field is floor(log2 a).
    int e = (int)((__float_as_uint(a) >> 23) & 0xffu) - 127;
    // a * 2^(3 - e) in [8, 16), exactly (a power-of-two scale).
    int significand = (int)rintf(a * __uint_as_float((unsigned int)(127 + 3 - e) << 23));
    if (significand == 16) {
        significand = 8;
        e += 1;
    }
    const int biased = e + 7;
    if (biased > 15 || (biased == 15 && significand > 14)) return (unsigned char)(sign | 0x7eu);
    return (unsigned char)(sign | ((unsigned int)biased << 3) | (unsigned int)(significand - 8));
}

// The scale of a block whose largest magnitude is amax: amax / 448, so that the block's codes span
// e4m3's range, and 1 for an all-zero block: crates/tensor/src/e4m3.rs `block_scale`.
__device__ __forceinline__ float block_scale(float amax) { return amax > 0.0f ? __fdiv_rn(amax, E4M3_MAX) : 1.0f; }

// Lane l's quad of a warp that holds group `group` (128 values, lane l's at columns 4l .. 4l + 3)
// of row `row` of an activation matrix [rows, cols], written as the FP8 GEMMs read activations:
// e4m3 codes [rows, cols] and one scale a token and group, group-major (`scales[group * rows +
// row]`); scale = amax / 448 of the group, code = e4m3(value / scale): the steps of
// quantize_activations_fp8 (block_fp8.cu) and of the norms' FP8 twins (norm.cu; tests/fp8.rs checks
// the two agree bit for bit). The whole warp calls it (the amax is a butterfly over its lanes).
__device__ __forceinline__ void store_fp8_group_quad(unsigned char* codes, float* scales, int rows, int cols, i64 row,
                                                     int group, const float4 v) {
    const int lane = threadIdx.x & 31;
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = block_scale(amax);
    const unsigned int packed = (unsigned int)f32_to_e4m3(__fdiv_rn(v.x, scale)) |
                                ((unsigned int)f32_to_e4m3(__fdiv_rn(v.y, scale)) << 8) |
                                ((unsigned int)f32_to_e4m3(__fdiv_rn(v.z, scale)) << 16) |
                                ((unsigned int)f32_to_e4m3(__fdiv_rn(v.w, scale)) << 24);
    *(unsigned int*)(codes + row * cols + (i64)group * FP8_BLOCK + 4 * lane) = packed;
    if (lane == 0) scales[(i64)group * rows + row] = scale;
}

// A norm's FP8 twin (buffer.rs): where to write the FP8 form of the row it computes.
struct Fp8TwinRow {
    unsigned char* codes;  // null: no FP8 twin
    float* scales;
    int rows;  // the twin's rows (the tokens padded), the scales' stride
    int row;
};

// Quad `q` of the row in its FP8 twin. A block-per-row norm's thread t holds quads t, t + blockDim,
// ..., so with blocks of whole warps and dim % 128 == 0 a warp holds one 128-value group per step,
// lane l the group's quad l; the whole warp calls it.
__device__ __forceinline__ void store_fp8_twin_quad(const Fp8TwinRow& t, int dim, int q, const float4 v) {
    store_fp8_group_quad(t.codes, t.scales, t.rows, dim, t.row, q / 32, v);
}

// Quad `q` (values 4q .. 4q + 3) of out and of its twin (8-byte aligned: whole allocations).
__device__ __forceinline__ void store4_with_twin(float4* out, bf16_bits* twin, i64 q, const float4 v) {
    out[q] = v;
    if (twin != nullptr) reinterpret_cast<uint2*>(twin)[q] = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
}

// The sum of squares of a row of `dim` (a multiple of 4) by the block, in the quad order above.
__device__ __forceinline__ float block_sum_squares4(const float* x, int dim, float* scratch) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float ss = 0.0f;
    for (int q = threadIdx.x; q < dim / 4; q += blockDim.x) ss = add_squares4(ss, x4[q]);
    return block_sum(ss, scratch);
}

// Zero-centred RMSNorm of one row by one block: `out = x * rsqrt(mean(x^2) + eps) * (1 + w)`
// (rms_norm, and the per-head norms of qk_norm_rope, which must match it bit for bit).
__device__ __forceinline__ void rms_norm_row(const float* x, const float* w, float* out, int dim, float eps,
                                             float* scratch) {
    if (BY_QUADS(dim)) {
        const float inv = 1.0f / sqrtf(block_sum_squares4(x, dim, scratch) / (float)dim + eps);
        const float4 *x4 = reinterpret_cast<const float4*>(x), *w4 = reinterpret_cast<const float4*>(w);
        float4* out4 = reinterpret_cast<float4*>(out);
        for (int q = threadIdx.x; q < dim / 4; q += blockDim.x) out4[q] = scale4(x4[q], inv, one_plus4(w4[q]));
        return;
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[i] = x[i] * inv * (1.0f + w[i]);
}

// Maximum of `v` over the block; every thread gets the same value. `scratch` holds 32 floats.
__device__ float block_max(float v, float* scratch) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float m = scratch[0];
    for (int w = 1; w < warps; ++w) m = fmaxf(m, scratch[w]);
    return m;
}

// ---- floats as ordered integer keys (sampling.cu, moe.cu) ----

// Larger key = larger float (total order; positive NaN ranks above +inf, as Rust's total_cmp).
__device__ __forceinline__ unsigned int order_key(float x) {
    const unsigned int u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_value(unsigned int key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// ---- weight streaming and tensor-core helpers (gemv.cu, moe.cu) ----

// Weights are read once per step: stream them past L1 so that the activations stay there.
__device__ __forceinline__ uint4 load_streaming(const bf16_bits* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// One f32 of a weight (a norm's scale), read the same way: allowed before the wait for the previous
// kernel, since weights do not change while the kernels that read them run.
__device__ __forceinline__ float load_streaming_f32(const float* p) {
    float v;
    asm volatile("ld.global.nc.L1::no_allocate.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

// Four of them (a quad of a norm's scales, common.cuh's row quads).
__device__ __forceinline__ float4 load_streaming_f32x4(const float* p) {
    float4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
    return v;
}

// d += a (16x16, rows of W) * b (16x8, tokens), bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_bf16(float* d, unsigned int a0, unsigned int a1, unsigned int a2,
                                         unsigned int a3, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// bf16(lo) in the low half and bf16(hi) in the high half, rounded to nearest even.
__device__ __forceinline__ unsigned int pack_bf16(float lo, float hi) {
    unsigned int d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// The diagonal row-pair mma of the lane kernels' tensor-core forms (gemv.cu's GEMV_*_DIAG, moe.cu's
// MOE_DIAG): lane (g = lane / 4, c = lane % 4) gives two rows' values of its own columns as rows g
// and g + 8 of A and the activations of those columns as column g of B, so entries (g, g) and
// (g + 8, g) of the product are quad g's pieces of the two rows' dot products. Lane c = g / 2 holds
// both: diag_owner says whether this lane is it, diag_piece reads its first (g, g) or second
// (g + 8, g) entry from d.
__device__ __forceinline__ bool diag_owner(int lane) { return (lane & 3) == (lane >> 3); }
__device__ __forceinline__ float diag_piece(const float* d, int lane, bool second) {
    const bool odd_quad = (lane >> 2) & 1;
    return second ? (odd_quad ? d[3] : d[2]) : (odd_quad ? d[1] : d[0]);
}

// d += the diagonal row-pair products of one 16-byte bf16 vector of two rows (`first`, `second`)
// with the 8 activations of its columns as 4 bf16 pairs `x`.
__device__ __forceinline__ void mma_bf16_row_pair(float* d, const uint4 first, const uint4 second,
                                                  const unsigned int* x) {
    mma_bf16(d, first.x, second.x, first.y, second.y, x[0], x[1]);
    mma_bf16(d, first.z, second.z, first.w, second.w, x[2], x[3]);
}

// The 8 f32 values at p (zeros where !in) as 4 bf16 pairs, nearest even.
__device__ __forceinline__ void load_bf16_pairs8(const float* p, bool in, unsigned int* out) {
    const float4 a = in ? *(const float4*)p : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 b = in ? *(const float4*)(p + 4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    out[0] = pack_bf16(a.x, a.y);
    out[1] = pack_bf16(a.z, a.w);
    out[2] = pack_bf16(b.x, b.y);
    out[3] = pack_bf16(b.z, b.w);
}

__device__ __forceinline__ void bf16x8_to_f32(const uint4 v, float* f) {
    const unsigned int parts[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(parts[i] << 16);
        f[2 * i + 1] = __uint_as_float(parts[i] & 0xffff0000u);
    }
}

// Eight activations of an f32 row rounded to bf16, as cast_f32_to_bf16 stores them: the CUDA-core
// GEMV kernels read the f32 activations themselves (a few KB, from L2) and save the cast's launch.
__device__ __forceinline__ void load_rounded8(const float* p, float* f) {
    const float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
    const float in[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = bf16_to_f32(f32_to_bf16(in[i]));
}

// ---- block-FP8 weights (gemv.cu, moe.cu) ----

// The weight formats of the CUDA-core kernels. A 16-byte vector holds 8 bf16 weights, or 16 block-FP8
// codes that all lie in one 128-column block (16 divides 128), so one scale covers a vector.
enum WeightFormat { WEIGHTS_BF16, WEIGHTS_FP8 };

// The element a weight row is made of (bf16 bits or e4m3 codes), its bytes, and the weights a
// 16-byte vector holds.
template <int FORMAT>
struct WeightElement {
    using type = bf16_bits;
};
template <>
struct WeightElement<WEIGHTS_FP8> {
    using type = unsigned char;
};
template <int FORMAT>
__device__ __forceinline__ constexpr int weight_bytes() {
    return sizeof(typename WeightElement<FORMAT>::type);
}
template <int FORMAT>
__device__ __forceinline__ constexpr int weights_per_vector() {
    return 16 / weight_bytes<FORMAT>();
}

// e4m3fn code -> its value times 2^-120, exactly: the code's exponent and mantissa bits are placed
// at the bottom of an f32's (bias 7 inside bias 127, so the value is scaled by 2^-120, and e4m3
// subnormals land on f32 subnormals, which the FMA keeps: NVRTC does not flush them). The 2^120 is
// put back once per vector with the block scale. Three integer operations a weight and no
// conversion unit, so it runs on every GPU.
__device__ __forceinline__ float e4m3_scaled_down(unsigned int word, int byte) {
    const unsigned int b = (word >> (8 * byte)) & 0xffu;
    return __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20));
}
#define E4M3_UNSCALE __int_as_float(0x7b800000)  // 2^120

// With GEMV_FP8_CONVERT (the default on GPUs that have it, sm_89 on) the kernels widen
// codes with the conversion unit instead: two codes to two exact f16 values in one instruction, each
// to f32 in one more, against ~4 integer operations a code above (that kernel issues ~6 instructions
// a weight and is issue-bound at ~2.3 TB/s on the H200). The values are the codes' own, not scaled
// by 2^-120, so FP8_VALUE_UNSCALE is 1 there.
#ifndef GEMV_FP8_CONVERT
#if __CUDA_ARCH__ >= 890
#define GEMV_FP8_CONVERT 1
#else
#define GEMV_FP8_CONVERT 0
#endif
#endif
#if GEMV_FP8_CONVERT
#define FP8_VALUE_UNSCALE 1.0f
#else
#define FP8_VALUE_UNSCALE E4M3_UNSCALE
#endif

// The four e4m3 codes of `word` (lowest byte first) as f32 values: exact either way; scaled by
// 2^-120 without GEMV_FP8_CONVERT (undone by FP8_VALUE_UNSCALE).
__device__ __forceinline__ void e4m3x4_to_f32(unsigned int word, float* out) {
#if GEMV_FP8_CONVERT
    unsigned int lo, hi;
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(word));
    const unsigned int pairs[2] = {lo, hi};
#pragma unroll
    for (int p = 0; p < 2; ++p) {
        asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
            : "=f"(out[2 * p]), "=f"(out[2 * p + 1])
            : "r"(pairs[p]));
    }
#else
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = e4m3_scaled_down(word, j);
#endif
}

// Four e4m3 codes (`word`, lowest byte first) as two bf16 pairs in the mma fragment order (the first
// code in the low half of .x): exact, bf16 holds every e4m3 value.
__device__ __forceinline__ uint2 e4m3x4_to_bf16x4(unsigned int word) {
    float f[4];
    e4m3x4_to_f32(word, f);
    return make_uint2(pack_bf16(f[0] * FP8_VALUE_UNSCALE, f[1] * FP8_VALUE_UNSCALE),
                      pack_bf16(f[2] * FP8_VALUE_UNSCALE, f[3] * FP8_VALUE_UNSCALE));
}

// Eight codes at p (8-byte aligned weights), streamed as load_streaming does.
__device__ __forceinline__ uint2 load_streaming8(const unsigned char* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

// Shared-memory address for cp.async, ldmatrix and the like.
__device__ __forceinline__ unsigned int shared_address(const void* p) {
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// ---- programmatic dependent launch (launcher.rs) ----
// A kernel whose PTX executes `griddepcontrol.wait` is launched so that it may start while the
// previous kernel on the stream still runs; the wait returns once that kernel has completed and its
// writes are visible. So a kernel calls `wait_for_previous_kernel` before it reads anything an
// earlier kernel wrote and before its first global write (the previous kernel may still be reading
// what this one overwrites), and every thread calls it, early exits included, so that this grid
// cannot complete before its predecessor. Without the launch attribute (GPUs before Hopper,
// DELTASERVE_CUDA_PDL=0) it returns at once.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel's blocks start on free SMs once every block of this grid has started; they
// do their independent part (a GEMV's first weight loads) and wait for this grid to complete.
__device__ __forceinline__ void let_next_kernel_start() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The first statement of a kernel that reads its inputs right away. With PDL_TRIGGER_FIRST the next
// kernel may start before this one waits: all of this grid's blocks have started by then, so the
// early blocks of the next one can only take slots this grid does not need, and they do their
// independent part (a GEMV's first weight loads) while this one waits and runs.
// Measured on the H200 (decode tok/s, one call): 27B 63.9 -> 64.2 with the pipelined GEMV, 35B-A3B
// 253.6 -> 255.2; alone, within noise.
#ifndef PDL_TRIGGER_FIRST
#define PDL_TRIGGER_FIRST 1
#endif
__device__ __forceinline__ void after_previous_kernel() {
    if (PDL_TRIGGER_FIRST) let_next_kernel_start();
    wait_for_previous_kernel();
    if (!PDL_TRIGGER_FIRST) let_next_kernel_start();
}
#define AFTER_PREVIOUS_KERNEL() after_previous_kernel()

// Grid-stride loop over `n` elements.
#define FOR_EACH(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (i64)(n); i += (i64)gridDim.x * blockDim.x)
