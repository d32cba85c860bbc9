// Row norms (one block per row of `dim`): zero-centred RMSNorm `x * rsqrt(mean(x^2) + eps) * (1 + w)`,
// the same fused with the residual add before it,
// and the GDN output's gated RMSNorm `w * x * rsqrt(mean(x^2) + eps) * silu(z)` (a block per row, or a
// warp per row for rows of up to 256 values).

// row_config (dense.rs) gives rows past 8192 values blocks of 1024 threads: the bound keeps a
// thread within the 64 registers such a block may have (without it add_rms_norm took more, and a
// 9000-wide row failed to launch with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES on the H200).
#define ROW_NORM_BOUNDS __launch_bounds__(1024)

extern "C" __global__ void ROW_NORM_BOUNDS rms_norm(const float* x, const float* w, float* out, int dim, float eps) {
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

#define ADD_NORM_QUADS_PER_THREAD (ADD_NORM_PER_THREAD / 4)

// add_rms_norm for a row width that is a multiple of 4, by float4 (common.cuh's quad order, as
// rms_norm_row sums such rows).
__device__ __forceinline__ void add_rms_norm_quads(float4* __restrict__ acc, const float4* __restrict__ x,
                                                   const float* __restrict__ w, float4* __restrict__ out,
                                                   bf16_bits* __restrict__ twin, const Fp8TwinRow& fp8, int dim,
                                                   float eps, float* scratch) {
    const int quads = dim / 4;
    float ss = 0.0f;
    if (quads <= ADD_NORM_QUADS_PER_THREAD * (int)blockDim.x) {
        float4 scale[ADD_NORM_QUADS_PER_THREAD];
#pragma unroll
        for (int j = 0; j < ADD_NORM_QUADS_PER_THREAD; ++j) {
            const int q = threadIdx.x + j * blockDim.x;
            scale[j] = q < quads ? one_plus4(load_streaming_f32x4(w + 4 * q)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        AFTER_PREVIOUS_KERNEL();
        float4 v[ADD_NORM_QUADS_PER_THREAD];
#pragma unroll
        for (int j = 0; j < ADD_NORM_QUADS_PER_THREAD; ++j) {
            const int q = threadIdx.x + j * blockDim.x;
            v[j] = q < quads ? add4(acc[q], x[q]) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int j = 0; j < ADD_NORM_QUADS_PER_THREAD; ++j) {
            const int q = threadIdx.x + j * blockDim.x;
            if (q < quads) {
                acc[q] = v[j];
                ss = add_squares4(ss, v[j]);
            }
        }
        const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
#pragma unroll
        for (int j = 0; j < ADD_NORM_QUADS_PER_THREAD; ++j) {
            const int q = threadIdx.x + j * blockDim.x;
            if (q < quads) {
                const float4 o = scale4(v[j], inv, scale[j]);
                store4_with_twin(out, twin, q, o);
                if (fp8.codes != nullptr) store_fp8_twin_quad(fp8, dim, q, o);
            }
        }
        return;
    }
    AFTER_PREVIOUS_KERNEL();
    for (int q = threadIdx.x; q < quads; q += blockDim.x) {
        const float4 v = add4(acc[q], x[q]);
        acc[q] = v;
        ss = add_squares4(ss, v);
    }
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    for (int q = threadIdx.x; q < quads; q += blockDim.x) {
        const float4 o = scale4(acc[q], inv, one_plus4(w4[q]));
        store4_with_twin(out, twin, q, o);
        if (fp8.codes != nullptr) store_fp8_twin_quad(fp8, dim, q, o);
    }
}

// `twin`: null, or the output's bf16 twin (common.cuh).
extern "C" __global__ void ROW_NORM_BOUNDS add_rms_norm(float* __restrict__ acc, const float* __restrict__ x,
                                                        const float* __restrict__ w, float* __restrict__ out,
                                                        bf16_bits* __restrict__ twin, int dim, float eps) {
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * dim;
    if (twin != nullptr) twin += base;
    if (BY_QUADS(dim)) {
        add_rms_norm_quads(reinterpret_cast<float4*>(acc + base), reinterpret_cast<const float4*>(x + base), w,
                           reinterpret_cast<float4*>(out + base), twin, Fp8TwinRow{nullptr, nullptr, 0, 0}, dim, eps,
                           scratch);
        return;
    }
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
            if (i < dim) store_with_twin(out + base, twin, i, v[j] * inv * scale[j]);
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
    for (int i = threadIdx.x; i < dim; i += blockDim.x) store_with_twin(out + base, twin, i, acc[base + i] * inv * (1.0f + w[i]));
}

// add_rms_norm that also writes the output's FP8 twin (buffer.rs): its codes [fp8_rows, dim] and
// scales [dim / 128, fp8_rows] as quantize_activations_fp8 would make them. A block per padded
// row: those past `rows` write the padding (zero codes, scale 1). dim % 128 == 0 and blocks of
// whole warps (the launcher's), so each warp holds whole 128-column groups.
extern "C" __global__ void ROW_NORM_BOUNDS add_rms_norm_fp8(float* __restrict__ acc, const float* __restrict__ x,
                                                            const float* __restrict__ w, float* __restrict__ out,
                                                            unsigned char* __restrict__ fp8_codes,
                                                            float* __restrict__ fp8_scales, int fp8_rows, int rows,
                                                            int dim, float eps) {
    __shared__ float scratch[32];
    const Fp8TwinRow fp8{fp8_codes, fp8_scales, fp8_rows, (int)blockIdx.x};
    if ((int)blockIdx.x >= rows) {
        // An earlier step's GEMM may read these codes until the wait.
        AFTER_PREVIOUS_KERNEL();
        for (int q = threadIdx.x; q < dim / 4; q += blockDim.x) store_fp8_twin_quad(fp8, dim, q, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        return;
    }
    const i64 base = (i64)blockIdx.x * dim;
    add_rms_norm_quads(reinterpret_cast<float4*>(acc + base), reinterpret_cast<const float4*>(x + base), w,
                       reinterpret_cast<float4*>(out + base), nullptr, fp8, dim, eps, scratch);
}

extern "C" __global__ void ROW_NORM_BOUNDS gated_rms_norm(const float* x, const float* z, const float* w, float* out, int dim, float eps) {
    AFTER_PREVIOUS_KERNEL();
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += x[base + i] * x[base + i];
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[base + i] = w[i] * x[base + i] * inv * silu_f(z[base + i]);
}

// gated_rms_norm with a warp per row, for rows of at most 32 * GATED_NORM_PER_LANE values (the GDN
// heads' 128): a block-per-row launch spends a block, two barriers and a shared-memory reduction on
// 128 values, and a 2048-token prefill of the 27B shape launches 98,304 of them. Lane l holds values
// l, l + 32, ... and the warp adds the lanes' sums by butterfly: a different order of the same sum
// than the block kernel, the same for every row whatever the batch. Grid: ceil(rows /
// GATED_NORM_WARPS) blocks of 32 * GATED_NORM_WARPS threads.
#define GATED_NORM_PER_LANE 8
#define GATED_NORM_WARPS 8
#define GATED_NORM_QUADS_PER_LANE (GATED_NORM_PER_LANE / 4)

// gated_rms_norm_warps for a row width that is a multiple of 4, by float4: lane l holds quads l,
// l + 32 (27B prefill of 2048 tokens on the H200: 3.01 -> 2.61 ms over its 48 calls).
__device__ __forceinline__ void gated_rms_norm_warp_quads(const float* __restrict__ x, const float* __restrict__ z,
                                                          const float* __restrict__ w, float* __restrict__ out,
                                                          bf16_bits* __restrict__ twin, i64 row, i64 rows, int dim,
                                                          float eps) {
    const int lane = threadIdx.x & 31, quads = dim / 4;
    float4 scale[GATED_NORM_QUADS_PER_LANE];
#pragma unroll
    for (int j = 0; j < GATED_NORM_QUADS_PER_LANE; ++j) {
        const int q = lane + 32 * j;
        scale[j] = q < quads ? load_streaming_f32x4(w + 4 * q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    AFTER_PREVIOUS_KERNEL();
    if (row >= rows) return;
    const float4 *x4 = reinterpret_cast<const float4*>(x + row * dim), *z4 = reinterpret_cast<const float4*>(z + row * dim);
    float4 v[GATED_NORM_QUADS_PER_LANE], g[GATED_NORM_QUADS_PER_LANE];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < GATED_NORM_QUADS_PER_LANE; ++j) {
        const int q = lane + 32 * j;
        v[j] = q < quads ? x4[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        g[j] = q < quads ? z4[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int j = 0; j < GATED_NORM_QUADS_PER_LANE; ++j) ss = add_squares4(ss, v[j]);
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    float4* out4 = reinterpret_cast<float4*>(out + row * dim);
    if (twin != nullptr) twin += row * dim;
#pragma unroll
    for (int j = 0; j < GATED_NORM_QUADS_PER_LANE; ++j) {
        const int q = lane + 32 * j;
        if (q < quads) {
            const float4 s = scale[j];
            store4_with_twin(out4, twin, q,
                             make_float4(s.x * v[j].x * inv * silu_f(g[j].x), s.y * v[j].y * inv * silu_f(g[j].y),
                                         s.z * v[j].z * inv * silu_f(g[j].z), s.w * v[j].w * inv * silu_f(g[j].w)));
        }
    }
}

// `twin`: null, or the output's bf16 twin (common.cuh).
extern "C" __global__ void __launch_bounds__(32 * GATED_NORM_WARPS)
    gated_rms_norm_warps(const float* __restrict__ x, const float* __restrict__ z, const float* __restrict__ w,
                         float* __restrict__ out, bf16_bits* __restrict__ twin, int rows, int dim, float eps) {
    const int lane = threadIdx.x & 31;
    const i64 row = (i64)blockIdx.x * GATED_NORM_WARPS + (threadIdx.x >> 5);
    if (BY_QUADS(dim)) {
        gated_rms_norm_warp_quads(x, z, w, out, twin, row, rows, dim, eps);
        return;
    }
    float scale[GATED_NORM_PER_LANE];
#pragma unroll
    for (int j = 0; j < GATED_NORM_PER_LANE; ++j) {
        const int i = lane + 32 * j;
        scale[j] = i < dim ? load_streaming_f32(w + i) : 0.0f;
    }
    AFTER_PREVIOUS_KERNEL();
    if (row >= rows) return;
    const i64 base = row * dim;
    float v[GATED_NORM_PER_LANE], g[GATED_NORM_PER_LANE];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < GATED_NORM_PER_LANE; ++j) {
        const int i = lane + 32 * j;
        v[j] = i < dim ? x[base + i] : 0.0f;
        g[j] = i < dim ? z[base + i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < GATED_NORM_PER_LANE; ++j) ss += v[j] * v[j];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int j = 0; j < GATED_NORM_PER_LANE; ++j) {
        const int i = lane + 32 * j;
        if (i < dim) store_with_twin(out, twin, base + i, scale[j] * v[j] * inv * silu_f(g[j]));
    }
}
