// Paged causal attention with GQA. `kv_write` stores the new K/V rows at their cache offsets
// (computed on the host from the block tables); `paged_attention` then runs one block per
// (token, q head) with an online softmax over the sequence's visible positions, a tile of
// blockDim positions at a time: each thread scores one position, then each thread accumulates
// its own output dims over the tile.
//
// The pool's element type KV is a template parameter: float, or bf16_bits (each value rounded to
// nearest even when written, widened exactly when read; the arithmetic stays f32). Every kernel
// below is instantiated once per type, as `<name>_f32` and `<name>_bf16`.
//
// rows [T, 2] = (visible positions = position + 1, offset of the sequence's table in `blocks`).

__device__ __forceinline__ void kv_store(float* p, float x) { *p = x; }
__device__ __forceinline__ void kv_store(bf16_bits* p, float x) { *p = f32_to_bf16(x); }
__device__ __forceinline__ float kv_load(const float* p) { return *p; }
__device__ __forceinline__ float kv_load(const bf16_bits* p) { return bf16_to_f32(*p); }

// Instantiates `KERNEL(NAME, KV)` for both pool element types.
#define FOR_EACH_KV_DTYPE(KERNEL) KERNEL(f32, float) KERNEL(bf16, bf16_bits)

template <typename KV>
__device__ void kv_write(const float* k, const float* v, KV* k_pool, KV* v_pool, const i64* offsets, i64 tokens,
                         int kv_row) {
    FOR_EACH(i, tokens * kv_row) {
        const i64 t = i / kv_row;
        const i64 at = offsets[t] + i % kv_row;
        kv_store(k_pool + at, k[i]);
        kv_store(v_pool + at, v[i]);
    }
}

#define KV_WRITE(NAME, KV)                                                                                  \
    extern "C" __global__ void kv_write_##NAME(const float* k, const float* v, KV* k_pool, KV* v_pool,     \
                                               const i64* offsets, i64 tokens, int kv_row) {                \
        AFTER_PREVIOUS_KERNEL();                                                                            \
        kv_write<KV>(k, v, k_pool, v_pool, offsets, tokens, kv_row);                                        \
    }
FOR_EACH_KV_DTYPE(KV_WRITE)

// Dynamic shared memory: (2 * head_dim + blockDim.x + 32) floats.
template <typename KV>
__device__ void paged_attention(const float* q, const KV* k_pool, const KV* v_pool, float* out, const int* rows,
                                const unsigned int* blocks, int q_heads, int kv_heads, int head_dim, int block_size,
                                float scale) {
    extern __shared__ float smem[];
    float* qs = smem;
    float* acc = smem + head_dim;
    float* probs = acc + head_dim;
    float* scratch = probs + blockDim.x;
    const i64 t = blockIdx.x / q_heads;
    const int h = blockIdx.x % q_heads;
    const int kvh = h / (q_heads / kv_heads);
    const int visible = rows[2 * t];
    const unsigned int* table = blocks + rows[2 * t + 1];
    const i64 kv_row = (i64)kv_heads * head_dim;
    const float* qrow = q + (t * q_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        qs[d] = qrow[d];
        acc[d] = 0.0f;
    }
    __syncthreads();
    float running_max = NEG_INF, running_sum = 0.0f;
    for (int tile = 0; tile < visible; tile += blockDim.x) {
        const int p = tile + threadIdx.x;
        float score = NEG_INF;
        if (p < visible) {
            const KV* kp = k_pool + ((i64)table[p / block_size] * block_size + p % block_size) * kv_row + (i64)kvh * head_dim;
            float dot = 0.0f;
            for (int d = 0; d < head_dim; ++d) dot = fmaf(qs[d], kv_load(kp + d), dot);
            score = dot * scale;
        }
        const float new_max = fmaxf(running_max, block_max(score, scratch));
        const float prob = p < visible ? expf(score - new_max) : 0.0f;
        probs[threadIdx.x] = prob;
        const float rescale = expf(running_max - new_max);  // 0 on the first tile
        running_sum = running_sum * rescale + block_sum(prob, scratch);  // its barriers publish `probs`
        const int n = min((int)blockDim.x, visible - tile);
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float a = acc[d] * rescale;
            for (int jj = 0; jj < n; ++jj) {
                const int pp = tile + jj;
                const KV* vp = v_pool + ((i64)table[pp / block_size] * block_size + pp % block_size) * kv_row + (i64)kvh * head_dim;
                a = fmaf(probs[jj], kv_load(vp + d), a);
            }
            acc[d] = a;
        }
        running_max = new_max;
        __syncthreads();  // `probs` is rewritten by the next tile
    }
    float* orow = out + (t * q_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) orow[d] = acc[d] / running_sum;
}

#define PAGED_ATTENTION(NAME, KV)                                                                            \
    extern "C" __global__ void paged_attention_##NAME(const float* q, const KV* k_pool, const KV* v_pool,   \
                                                      float* out, const int* rows, const unsigned int* blocks, \
                                                      int q_heads, int kv_heads, int head_dim, int block_size, \
                                                      float scale) {                                        \
        AFTER_PREVIOUS_KERNEL();                                                                            \
        paged_attention<KV>(q, k_pool, v_pool, out, rows, blocks, q_heads, kv_heads, head_dim, block_size,    \
                            scale);                                                                         \
    }
FOR_EACH_KV_DTYPE(PAGED_ATTENTION)

// The same attention with coalesced loads and more parallelism, for head_dim = 32 * DPL: each warp
// takes one position at a time (lane l holds dims l*DPL .. l*DPL+DPL-1 of q, k, v, so a warp reads a
// K or V row in one sweep) with its own online softmax; a block covers ATTENTION_SPLIT positions of
// one (token, q head) with ATTENTION_WARPS warps, merged in shared memory. grid = (tokens * q_heads,
// splits): with several splits each block leaves a partial (max, sum, unnormalised output) and
// `attention_combine` merges them, as flash-decoding does.
// Dynamic shared memory: ATTENTION_WARPS * head_dim floats.
#define ATTENTION_WARPS 4
#define ATTENTION_SPLIT 64

template <int DPL>
__device__ __forceinline__ void load_lane(const float* p, float* dst) {
    if (DPL % 4 == 0) {
#pragma unroll
        for (int i = 0; i < DPL; i += 4) {
            const float4 v = *reinterpret_cast<const float4*>(p + i);
            dst[i] = v.x;
            dst[i + 1] = v.y;
            dst[i + 2] = v.z;
            dst[i + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < DPL; ++i) dst[i] = p[i];
    }
}

// DPL bf16 values widened to f32: 2 * DPL bytes, one vector load (the lane's dims are DPL-aligned).
template <int DPL>
__device__ __forceinline__ void load_lane(const bf16_bits* p, float* dst) {
    if (DPL % 8 == 0) {
#pragma unroll
        for (int i = 0; i < DPL; i += 8) bf16x8_to_f32(*reinterpret_cast<const uint4*>(p + i), dst + i);
    } else if (DPL == 4) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        dst[0] = __uint_as_float(v.x << 16);
        dst[1] = __uint_as_float(v.x & 0xffff0000u);
        dst[2] = __uint_as_float(v.y << 16);
        dst[3] = __uint_as_float(v.y & 0xffff0000u);
    } else if (DPL == 2) {
        const unsigned int v = *reinterpret_cast<const unsigned int*>(p);
        dst[0] = __uint_as_float(v << 16);
        dst[1] = __uint_as_float(v & 0xffff0000u);
    } else {
#pragma unroll
        for (int i = 0; i < DPL; ++i) dst[i] = bf16_to_f32(p[i]);
    }
}

// A block takes G query heads of one kv head together (G divides q_heads / kv_heads; G = 1 is one
// head a block): each K and V row is loaded once for the G heads instead of once per head, G times
// less traffic for grouped-query attention. Every head's arithmetic (its dot, online softmax, merge
// and partials) is the one-head kernel's, in the same order, so any G gives bitwise the same output.
// grid = (tokens * q_heads / G, splits).
template <int DPL, typename KV, int G>
__device__ void attention_by_warps(const float* q, const KV* k_pool, const KV* v_pool, float* out,
                                   float* part_stats, float* part_acc, const int* rows, const unsigned int* blocks,
                                   int q_heads, int kv_heads, int block_size, float scale) {
    extern __shared__ float warp_acc[];  // [G][ATTENTION_WARPS][head_dim]
    __shared__ float warp_max[G][ATTENTION_WARPS], warp_sum[G][ATTENTION_WARPS];
    const int head_dim = DPL * 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int groups = q_heads / G;
    const i64 t = blockIdx.x / groups;
    const int h0 = (blockIdx.x % groups) * G;
    const int kvh = h0 / (q_heads / kv_heads);
    const int visible = rows[2 * t];
    if (blockIdx.y * ATTENTION_SPLIT >= visible) return;  // the combine reads only the splits a row uses
    const unsigned int* table = blocks + rows[2 * t + 1];
    const i64 kv_row = (i64)kv_heads * head_dim;
    float qv[G][DPL], kv[DPL], vv[DPL], acc[G][DPL];
    float running_max[G], running_sum[G];
#pragma unroll
    for (int j = 0; j < G; ++j) {
        load_lane<DPL>(q + (t * q_heads + h0 + j) * head_dim + lane * DPL, qv[j]);
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[j][i] = 0.0f;
        running_max[j] = NEG_INF;
        running_sum[j] = 0.0f;
    }
    // Block y takes chunks y, y + splits, ... of ATTENTION_SPLIT positions (one chunk when the grid
    // has a split per chunk; several when the partials' workspace was capped).
    for (int chunk = blockIdx.y; chunk * ATTENTION_SPLIT < visible; chunk += gridDim.y) {
    const int begin = chunk * ATTENTION_SPLIT, end = min(visible, begin + ATTENTION_SPLIT);
    for (int p = begin + warp; p < end; p += ATTENTION_WARPS) {
        const i64 at = ((i64)table[p / block_size] * block_size + p % block_size) * kv_row + (i64)kvh * head_dim + lane * DPL;
        load_lane<DPL>(k_pool + at, kv);
        load_lane<DPL>(v_pool + at, vv);
#pragma unroll
        for (int j = 0; j < G; ++j) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; ++i) dot = fmaf(qv[j][i], kv[i], dot);
            for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            const float score = dot * scale;
            const float new_max = fmaxf(running_max[j], score);
            const float rescale = expf(running_max[j] - new_max);  // 0 on the first position
            const float weight = expf(score - new_max);
            running_sum[j] = running_sum[j] * rescale + weight;
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[j][i] = fmaf(weight, vv[i], acc[j][i] * rescale);
            running_max[j] = new_max;
        }
    }
    }
#pragma unroll
    for (int j = 0; j < G; ++j) {
        if (lane == 0) {
            warp_max[j][warp] = running_max[j];
            warp_sum[j][warp] = running_sum[j];
        }
#pragma unroll
        for (int i = 0; i < DPL; ++i) warp_acc[(j * ATTENTION_WARPS + warp) * head_dim + lane * DPL + i] = acc[j][i];
    }
    __syncthreads();
    const int splits = gridDim.y;
    for (int j = 0; j < G; ++j) {
        float block_max_v = NEG_INF;
        for (int w = 0; w < ATTENTION_WARPS; ++w) block_max_v = fmaxf(block_max_v, warp_max[j][w]);
        float factor[ATTENTION_WARPS];
        float total = 0.0f;
        for (int w = 0; w < ATTENTION_WARPS; ++w) {
            // A warp that saw no position has max -inf and contributes nothing.
            factor[w] = warp_max[j][w] == NEG_INF ? 0.0f : expf(warp_max[j][w] - block_max_v);
            total += warp_sum[j][w] * factor[w];
        }
        const i64 row_head = t * q_heads + h0 + j;
        const i64 part = row_head * splits + blockIdx.y;
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float a = 0.0f;
            for (int w = 0; w < ATTENTION_WARPS; ++w) a += warp_acc[(j * ATTENTION_WARPS + w) * head_dim + d] * factor[w];
            if (splits == 1) {
                out[row_head * head_dim + d] = a / total;
            } else {
                part_acc[part * head_dim + d] = a;
            }
        }
        if (splits > 1 && threadIdx.x == 0) {
            part_stats[2 * part] = block_max_v;
            part_stats[2 * part + 1] = total;
        }
    }
}

// One head a block: paged_attention_d<DPL>_<dtype>; G heads: paged_attention_d<DPL>_g<G>_<dtype>.
#define ATTENTION_BY_WARPS_KERNEL(KERNEL, DPL, KV, G)                                                       \
    extern "C" __global__ void KERNEL(                                                                       \
        const float* q, const KV* k_pool, const KV* v_pool, float* out, float* part_stats, float* part_acc,  \
        const int* rows, const unsigned int* blocks, int q_heads, int kv_heads, int block_size, float scale) {  \
        AFTER_PREVIOUS_KERNEL();                                                                             \
        attention_by_warps<DPL, KV, G>(q, k_pool, v_pool, out, part_stats, part_acc, rows, blocks, q_heads,    \
                                       kv_heads, block_size, scale);                                         \
    }
#define ATTENTION_BY_WARPS(DPL, NAME, KV) ATTENTION_BY_WARPS_KERNEL(paged_attention_d##DPL##_##NAME, DPL, KV, 1)
#define ATTENTION_BY_WARPS_ALL_DPL(NAME, KV) \
    ATTENTION_BY_WARPS(1, NAME, KV)          \
    ATTENTION_BY_WARPS(2, NAME, KV)          \
    ATTENTION_BY_WARPS(4, NAME, KV)          \
    ATTENTION_BY_WARPS(8, NAME, KV)
FOR_EACH_KV_DTYPE(ATTENTION_BY_WARPS_ALL_DPL)
// Grouped heads for the head dims of the model family (128, 256) and its group sizes.
#define ATTENTION_GROUPED(DPL, G, NAME, KV) \
    ATTENTION_BY_WARPS_KERNEL(paged_attention_d##DPL##_g##G##_##NAME, DPL, KV, G)
#define ATTENTION_GROUPED_ALL(NAME, KV)  \
    ATTENTION_GROUPED(4, 2, NAME, KV)    \
    ATTENTION_GROUPED(4, 4, NAME, KV)    \
    ATTENTION_GROUPED(4, 6, NAME, KV)    \
    ATTENTION_GROUPED(4, 8, NAME, KV)    \
    ATTENTION_GROUPED(8, 2, NAME, KV)    \
    ATTENTION_GROUPED(8, 4, NAME, KV)    \
    ATTENTION_GROUPED(8, 6, NAME, KV)    \
    ATTENTION_GROUPED(8, 8, NAME, KV)
FOR_EACH_KV_DTYPE(ATTENTION_GROUPED_ALL)

// Merges the partials of the splits a row used: one block per (token, q head). A row with no visible
// position is another kernel's (flash_attention.cu) and is left alone.
extern "C" __global__ void attention_combine(const float* part_stats, const float* part_acc, float* out, const int* rows,
                                             int q_heads, int head_dim, int splits) {
    AFTER_PREVIOUS_KERNEL();
    const i64 t = blockIdx.x / q_heads;
    const int used = min((rows[2 * t] + ATTENTION_SPLIT - 1) / ATTENTION_SPLIT, splits);
    if (used == 0) return;
    const i64 first = (i64)blockIdx.x * splits;
    float block_max_v = NEG_INF;
    for (int s = 0; s < used; ++s) block_max_v = fmaxf(block_max_v, part_stats[2 * (first + s)]);
    float total = 0.0f;
    for (int s = 0; s < used; ++s) total += part_stats[2 * (first + s) + 1] * expf(part_stats[2 * (first + s)] - block_max_v);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < used; ++s) a += part_acc[(first + s) * head_dim + d] * expf(part_stats[2 * (first + s)] - block_max_v);
        out[(i64)blockIdx.x * head_dim + d] = a / total;
    }
}
