// Gated DeltaNet: the gates, and the gated delta rule in its recurrent form.
//
// The delta rule runs one block per (value head, sequence); thread j owns column j of the head's
// state S [key_dim, value_dim], which stays in the state pool (f32) and is updated in place token by
// token: S <- e^g S; S += k (beta (v - S^T k))^T; o = S^T q. Every thread touches only its own
// column, so no synchronisation is needed on S; q and k (l2-normed, q scaled by key_dim^-0.5) are
// staged in shared memory per token. Prefill uses the same loop (mathematically the chunked form).
//
// seqs [n_seqs, 4] = (start row, new tokens, state slot, first snapshot index or -1);
// snaps = the snapshot slots of all sequences back to back.

// g = -exp(a_log) * softplus(a + dt_bias) (torch softplus: threshold 20), beta = sigmoid(b).
extern "C" __global__ void gdn_gates(const float* a, const float* b, const float* a_log, const float* dt_bias,
                                     float* g, float* beta, i64 n, int heads) {
    FOR_EACH(i, n) {
        const int h = (int)(i % heads);
        const double x = (double)a[i] + (double)dt_bias[h];
        const double softplus = x > 20.0 ? x : log1p(exp(x));
        g[i] = (float)(-exp((double)a_log[h]) * softplus);
        beta[i] = (float)(1.0 / (1.0 + exp(-(double)b[i])));
    }
}

// Dynamic shared memory: (2 * key_dim + 32) floats.
extern "C" __global__ void gated_delta_rule(const float* mixed, const float* g, const float* beta, float* ssm,
                                            float* out, const int* seqs, const int* snaps, int key_heads,
                                            int value_heads, int key_dim, int value_dim) {
    extern __shared__ float smem[];
    float* q = smem;
    float* k = smem + key_dim;
    float* scratch = smem + 2 * key_dim;
    const int h = blockIdx.x;
    const int* seq = seqs + 4 * blockIdx.y;
    const int start = seq[0], len = seq[1], slot = seq[2], snap = seq[3];
    const int kh = h / (value_heads / key_heads);
    const int conv_dim = 2 * key_heads * key_dim + value_heads * value_dim;
    const i64 head_state = (i64)key_dim * value_dim;
    float* S = ssm + ((i64)slot * value_heads + h) * head_state;
    const int j = threadIdx.x;
    const float q_scale = 1.0f / sqrtf((float)key_dim);
    for (int i = 0; i < len; ++i) {
        const i64 row = start + i;
        const float* qkv = mixed + row * conv_dim;
        float qss = 0.0f, kss = 0.0f;
        for (int x = threadIdx.x; x < key_dim; x += blockDim.x) {
            const float qv = qkv[kh * key_dim + x], kv = qkv[key_heads * key_dim + kh * key_dim + x];
            q[x] = qv;
            k[x] = kv;
            qss += qv * qv;
            kss += kv * kv;
        }
        const float q_inv = 1.0f / sqrtf(block_sum(qss, scratch) + 1e-6f);
        const float k_inv = 1.0f / sqrtf(block_sum(kss, scratch) + 1e-6f);
        // block_sum ended with a barrier after q/k were written; normalise in place, then sync again.
        for (int x = threadIdx.x; x < key_dim; x += blockDim.x) {
            q[x] = q[x] * q_inv * q_scale;
            k[x] = k[x] * k_inv;
        }
        __syncthreads();
        if (j < value_dim) {
            const float decay = expf(g[row * value_heads + h]);
            const float b = beta[row * value_heads + h];
            const float v = qkv[2 * key_heads * key_dim + h * value_dim + j];
            float m = 0.0f;
            for (int x = 0; x < key_dim; ++x) {
                const float s = S[(i64)x * value_dim + j] * decay;
                S[(i64)x * value_dim + j] = s;
                m = fmaf(s, k[x], m);
            }
            const float delta = b * (v - m);
            float o = 0.0f;
            for (int x = 0; x < key_dim; ++x) {
                const float s = fmaf(k[x], delta, S[(i64)x * value_dim + j]);
                S[(i64)x * value_dim + j] = s;
                o = fmaf(s, q[x], o);
            }
            out[(row * value_heads + h) * value_dim + j] = o;
            if (snap >= 0) {
                float* D = ssm + ((i64)snaps[snap + i] * value_heads + h) * head_state;
                for (int x = 0; x < key_dim; ++x) D[(i64)x * value_dim + j] = S[(i64)x * value_dim + j];
            }
        }
        __syncthreads();  // q and k are overwritten by the next token
    }
}

// The same recurrence with each thread's state column held in registers for the whole sequence
// (read once, written once, instead of twice per token), and value columns split over blocks of one
// warp: grid (value head, sequence, column slice), so a single sequence still fills the GPU. The
// arithmetic is the loop above, term for term. KD = key_dim, a compile-time constant so the column
// stays in registers. Dynamic shared memory: (2 * KD + 32) floats.
template <int KD>
__device__ void delta_rule_in_registers(const float* mixed, const float* g, const float* beta, float* ssm,
                                        float* out, const int* seqs, const int* snaps, int key_heads,
                                        int value_heads, int value_dim) {
    extern __shared__ float smem[];
    float* q = smem;
    float* k = smem + KD;
    float* scratch = smem + 2 * KD;
    const int h = blockIdx.x;
    const int* seq = seqs + 4 * blockIdx.y;
    const int start = seq[0], len = seq[1], slot = seq[2], snap = seq[3];
    const int kh = h / (value_heads / key_heads);
    const int conv_dim = 2 * key_heads * KD + value_heads * value_dim;
    const i64 head_state = (i64)KD * value_dim;
    float* S = ssm + ((i64)slot * value_heads + h) * head_state;
    const int j = blockIdx.z * blockDim.x + threadIdx.x;
    const bool owns_column = j < value_dim;
    const float q_scale = 1.0f / sqrtf((float)KD);
    float s[KD];
#pragma unroll
    for (int x = 0; x < KD; ++x) s[x] = owns_column ? S[(i64)x * value_dim + j] : 0.0f;
    for (int i = 0; i < len; ++i) {
        const i64 row = start + i;
        const float* qkv = mixed + row * conv_dim;
        float qss = 0.0f, kss = 0.0f;
        for (int x = threadIdx.x; x < KD; x += blockDim.x) {
            const float qv = qkv[kh * KD + x], kv = qkv[key_heads * KD + kh * KD + x];
            q[x] = qv;
            k[x] = kv;
            qss += qv * qv;
            kss += kv * kv;
        }
        const float q_inv = 1.0f / sqrtf(block_sum(qss, scratch) + 1e-6f);
        const float k_inv = 1.0f / sqrtf(block_sum(kss, scratch) + 1e-6f);
        for (int x = threadIdx.x; x < KD; x += blockDim.x) {
            q[x] = q[x] * q_inv * q_scale;
            k[x] = k[x] * k_inv;
        }
        __syncthreads();
        if (owns_column) {
            const float decay = expf(g[row * value_heads + h]);
            const float b = beta[row * value_heads + h];
            const float v = qkv[2 * key_heads * KD + h * value_dim + j];
            float m = 0.0f;
#pragma unroll
            for (int x = 0; x < KD; ++x) {
                s[x] = s[x] * decay;
                m = fmaf(s[x], k[x], m);
            }
            const float delta = b * (v - m);
            float o = 0.0f;
#pragma unroll
            for (int x = 0; x < KD; ++x) {
                s[x] = fmaf(k[x], delta, s[x]);
                o = fmaf(s[x], q[x], o);
            }
            out[(row * value_heads + h) * value_dim + j] = o;
            if (snap >= 0) {
                float* D = ssm + ((i64)snaps[snap + i] * value_heads + h) * head_state;
#pragma unroll
                for (int x = 0; x < KD; ++x) D[(i64)x * value_dim + j] = s[x];
            }
        }
        __syncthreads();  // q and k are overwritten by the next token
    }
    if (owns_column) {
#pragma unroll
        for (int x = 0; x < KD; ++x) S[(i64)x * value_dim + j] = s[x];
    }
}

#define DELTA_RULE_IN_REGISTERS(KD)                                                                          \
    extern "C" __global__ void gated_delta_rule_k##KD(const float* mixed, const float* g, const float* beta,  \
                                                      float* ssm, float* out, const int* seqs,              \
                                                      const int* snaps, int key_heads, int value_heads,     \
                                                      int value_dim) {                                      \
        delta_rule_in_registers<KD>(mixed, g, beta, ssm, out, seqs, snaps, key_heads, value_heads,           \
                                    value_dim);                                                             \
    }
DELTA_RULE_IN_REGISTERS(16)
DELTA_RULE_IN_REGISTERS(32)
DELTA_RULE_IN_REGISTERS(64)
DELTA_RULE_IN_REGISTERS(128)
DELTA_RULE_IN_REGISTERS(256)
