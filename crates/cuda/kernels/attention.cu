// Paged causal attention with GQA. `kv_write` stores the new K/V rows at their cache offsets
// (computed on the host from the block tables); `paged_attention` then runs one block per
// (token, q head) with an online softmax over the sequence's visible positions, a tile of
// blockDim positions at a time: each thread scores one position, then each thread accumulates
// its own output dims over the tile.
//
// rows [T, 2] = (visible positions = position + 1, offset of the sequence's table in `blocks`).

extern "C" __global__ void kv_write(const float* k, const float* v, float* k_pool, float* v_pool,
                                    const i64* offsets, i64 tokens, int kv_row) {
    FOR_EACH(i, tokens * kv_row) {
        const i64 t = i / kv_row;
        const i64 at = offsets[t] + i % kv_row;
        k_pool[at] = k[i];
        v_pool[at] = v[i];
    }
}

// Dynamic shared memory: (2 * head_dim + blockDim.x + 32) floats.
extern "C" __global__ void paged_attention(const float* q, const float* k_pool, const float* v_pool, float* out,
                                           const int* rows, const unsigned int* blocks, int q_heads, int kv_heads,
                                           int head_dim, int block_size, float scale) {
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
            const float* kp = k_pool + ((i64)table[p / block_size] * block_size + p % block_size) * kv_row + (i64)kvh * head_dim;
            float dot = 0.0f;
            for (int d = 0; d < head_dim; ++d) dot = fmaf(qs[d], kp[d], dot);
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
                const float* vp = v_pool + ((i64)table[pp / block_size] * block_size + pp % block_size) * kv_row + (i64)kvh * head_dim;
                a = fmaf(probs[jj], vp[d], a);
            }
            acc[d] = a;
        }
        running_max = new_max;
        __syncthreads();  // `probs` is rewritten by the next tile
    }
    float* orow = out + (t * q_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) orow[d] = acc[d] / running_sum;
}
