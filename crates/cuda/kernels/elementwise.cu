// Elementwise and row-copy ops on f32 activations: add, silu-mul, sigmoid gates, column concat, row
// gather / weighted scatter-add, the bf16 embedding gather and the f32 -> bf16 cast before a GEMM.

extern "C" __global__ void add_inplace(float* acc, const float* x, i64 n) {
    AFTER_PREVIOUS_KERNEL();
    FOR_EACH(i, n) acc[i] += x[i];
}

extern "C" __global__ void silu_mul(const float* gate, const float* up, float* out, i64 n) {
    AFTER_PREVIOUS_KERNEL();
    FOR_EACH(i, n) out[i] = silu_f(gate[i]) * up[i];
}

extern "C" __global__ void sigmoid_mul_inplace(float* x, const float* gate, i64 n) {
    AFTER_PREVIOUS_KERNEL();
    FOR_EACH(i, n) x[i] *= sigmoid_f(gate[i]);
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

// Activations rounded to bf16 (nearest even) for the bf16 GEMM.
extern "C" __global__ void cast_f32_to_bf16(const float* x, bf16_bits* out, i64 n) {
    AFTER_PREVIOUS_KERNEL();
    FOR_EACH(i, n) out[i] = f32_to_bf16(x[i]);
}
