// Elementwise and row-copy ops on f32 activations: add, silu-mul, sigmoid gates, column concat, row
// gather / weighted scatter-add, the bf16 embedding gather and the f32 -> bf16 cast before a GEMM.

extern "C" __global__ void add_inplace(float* acc, const float* x, i64 n) {
    AFTER_PREVIOUS_KERNEL();
    FOR_EACH(i, n) acc[i] += x[i];
}

// Four values a thread with 16-byte accesses (the buffers are whole allocations, so aligned), then
// the tail; launched over ceil(n / 4) threads.
extern "C" __global__ void silu_mul(const float* gate, const float* up, float* out, i64 n) {
    AFTER_PREVIOUS_KERNEL();
    const i64 quads = n / 4;
    FOR_EACH(i, quads) {
        const float4 g = reinterpret_cast<const float4*>(gate)[i], u = reinterpret_cast<const float4*>(up)[i];
        reinterpret_cast<float4*>(out)[i] =
            make_float4(silu_f(g.x) * u.x, silu_f(g.y) * u.y, silu_f(g.z) * u.z, silu_f(g.w) * u.w);
    }
    FOR_EACH(i, n - 4 * quads) out[4 * quads + i] = silu_f(gate[4 * quads + i]) * up[4 * quads + i];
}

// As silu_mul, four values a thread (27B prefill of 2048 tokens on the H200: 0.98 -> 0.64 ms over
// its 16 calls, docs/measurements/h200-s19-c1-*profile*).
extern "C" __global__ void sigmoid_mul_inplace(float* x, const float* gate, i64 n) {
    AFTER_PREVIOUS_KERNEL();
    const i64 quads = ROW_QUADS ? n / 4 : 0;
    FOR_EACH(i, quads) {
        const float4 g = reinterpret_cast<const float4*>(gate)[i], v = reinterpret_cast<const float4*>(x)[i];
        reinterpret_cast<float4*>(x)[i] =
            make_float4(v.x * sigmoid_f(g.x), v.y * sigmoid_f(g.y), v.z * sigmoid_f(g.z), v.w * sigmoid_f(g.w));
    }
    FOR_EACH(i, n - 4 * quads) x[4 * quads + i] *= sigmoid_f(gate[4 * quads + i]);
}

// x [rows, dim] *= sigmoid(gate[row]).
extern "C" __global__ void sigmoid_scale_rows(float* x, const float* gate, i64 rows, int dim) {
    AFTER_PREVIOUS_KERNEL();
    FOR_EACH(i, rows * dim) x[i] *= sigmoid_f(gate[i / dim]);
}

// out [rows, a_dim + b_dim] = a [rows, a_dim] | b [rows, b_dim].
extern "C" __global__ void concat_cols(const float* a, const float* b, float* out, i64 rows, int a_dim, int b_dim) {
    AFTER_PREVIOUS_KERNEL();
    const int width = a_dim + b_dim;
    FOR_EACH(i, rows * width) {
        const i64 r = i / width;
        const int c = (int)(i % width);
        out[i] = c < a_dim ? a[r * a_dim + c] : b[r * b_dim + (c - a_dim)];
    }
}

// out [n, dim] = src[rows[i]].
extern "C" __global__ void gather_rows(const float* src, const unsigned int* rows, float* out, i64 n, int dim) {
    AFTER_PREVIOUS_KERNEL();
    FOR_EACH(i, n * dim) out[i] = src[(i64)rows[i / dim] * dim + i % dim];
}

// acc[rows[i]] += weights[i] * src[i] for i in order: one thread per column walks the rows
// sequentially, so repeated rows are added in list order and the result is deterministic.
// Computed in double like the reference (the f32 product is exact there; one rounding to f32).
extern "C" __global__ void scatter_add_rows(float* acc, const float* src, const unsigned int* rows,
                                            const float* weights, int n, int dim) {
    AFTER_PREVIOUS_KERNEL();
    FOR_EACH(d, dim) {
        for (int i = 0; i < n; ++i) {
            float* dst = acc + (i64)rows[i] * dim + d;
            *dst = (float)((double)*dst + (double)weights[i] * (double)src[(i64)i * dim + d]);
        }
    }
}

// out [n, hidden] = table[ids[t]] for a bf16 table.
extern "C" __global__ void embedding_bf16(const bf16_bits* table, const unsigned int* ids, float* out, i64 n, int hidden) {
    AFTER_PREVIOUS_KERNEL();
    FOR_EACH(i, n * hidden) out[i] = bf16_to_f32(table[(i64)ids[i / hidden] * hidden + i % hidden]);
}

// out [n, hidden] = table[ids[t]] for an f32 table.
extern "C" __global__ void embedding_f32(const float* table, const unsigned int* ids, float* out, i64 n, int hidden) {
    AFTER_PREVIOUS_KERNEL();
    FOR_EACH(i, n * hidden) out[i] = table[(i64)ids[i / hidden] * hidden + i % hidden];
}

// silu_mul rounded to bf16 as cast_f32_to_bf16 rounds: the gated MLP's activation written once, in the
// form the down projection's bf16 GEMM reads (a prefill's act of 2048 x 17408 values is 143 MB as f32;
// silu_mul then the cast wrote it and read it back). Bit for bit silu_mul then cast_f32_to_bf16.
extern "C" __global__ void silu_mul_bf16(const float* gate, const float* up, bf16_bits* out, i64 n) {
    AFTER_PREVIOUS_KERNEL();
    const i64 quads = n / 4;
    FOR_EACH(i, quads) {
        const float4 g = reinterpret_cast<const float4*>(gate)[i], u = reinterpret_cast<const float4*>(up)[i];
        reinterpret_cast<uint2*>(out)[i] =
            make_uint2(pack_bf16x2(silu_f(g.x) * u.x, silu_f(g.y) * u.y), pack_bf16x2(silu_f(g.z) * u.z, silu_f(g.w) * u.w));
    }
    FOR_EACH(i, n - 4 * quads) out[4 * quads + i] = f32_to_bf16(silu_f(gate[4 * quads + i]) * up[4 * quads + i]);
}

// silu_mul_bf16 of gate and up products the GEMMs wrote in bf16 (`MLP_BF16_GATE_UP=1`, opt-in: the
// products rounded to bf16 before the activation, as SGLang's and vLLM's bf16 GEMMs write them),
// which halves what the gate/up GEMMs write and this pass reads. Four values a thread.
__device__ __forceinline__ unsigned int silu_mul_pair(unsigned int g, unsigned int u) {
    return pack_bf16x2(silu_f(bf16_low(g)) * bf16_low(u), silu_f(bf16_high(g)) * bf16_high(u));
}

extern "C" __global__ void silu_mul_bf16_of_bf16(const bf16_bits* gate, const bf16_bits* up, bf16_bits* out, i64 n) {
    AFTER_PREVIOUS_KERNEL();
    const i64 quads = n / 4;
    FOR_EACH(i, quads) {
        const uint2 g = reinterpret_cast<const uint2*>(gate)[i], u = reinterpret_cast<const uint2*>(up)[i];
        reinterpret_cast<uint2*>(out)[i] = make_uint2(silu_mul_pair(g.x, u.x), silu_mul_pair(g.y, u.y));
    }
    FOR_EACH(i, n - 4 * quads) {
        const i64 j = 4 * quads + i;
        out[j] = f32_to_bf16(silu_f(bf16_to_f32(gate[j])) * bf16_to_f32(up[j]));
    }
}

// Activations rounded to bf16 (nearest even) for the bf16 GEMM: four values a thread (16-byte loads,
// 8-byte stores; both buffers are whole allocations), then the tail; launched over ceil(n / 4).
extern "C" __global__ void cast_f32_to_bf16(const float* x, bf16_bits* out, i64 n) {
    AFTER_PREVIOUS_KERNEL();
    const i64 quads = n / 4;
    FOR_EACH(i, quads) {
        const float4 v = reinterpret_cast<const float4*>(x)[i];
        reinterpret_cast<uint2*>(out)[i] = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
    FOR_EACH(i, n - 4 * quads) out[4 * quads + i] = f32_to_bf16(x[4 * quads + i]);
}

// bf16 values widened to f32 (exact): the FP8 GEMM's bf16 output into the f32 activations. Four
// values a thread as above; launched over ceil(n / 4).
extern "C" __global__ void cast_bf16_to_f32(const bf16_bits* x, float* out, i64 n) {
    AFTER_PREVIOUS_KERNEL();
    const i64 quads = n / 4;
    FOR_EACH(i, quads) {
        const uint2 v = reinterpret_cast<const uint2*>(x)[i];
        reinterpret_cast<float4*>(out)[i] = make_float4(bf16_low(v.x), bf16_high(v.x), bf16_low(v.y), bf16_high(v.y));
    }
    FOR_EACH(i, n - 4 * quads) out[4 * quads + i] = bf16_to_f32(x[4 * quads + i]);
}
