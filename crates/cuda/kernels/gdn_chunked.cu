// Gated DeltaNet prefill in chunked form (docs/model.md, "Gated DeltaNet", chunked form; the WY
// representation of the Gated DeltaNet paper): the same map as the recurrence in gdn.cu, computed
// CHUNK tokens at a time. With the state S0 [KD, VD] at a chunk's start, G the cumulative log-decay
// inside the chunk, q and k l2-normed (q scaled by KD^-0.5):
//   A[t][j] = beta_t e^(G_t - G_j) (k_t . k_j) for j < t          (strictly lower)
//   (I + A) X = [diag(beta) V | diag(beta e^G) K]                  (forward substitution)
//   U = X_V - X_K S0                                               (the deltas of the chunk)
//   O[t] = e^(G_t) q_t S0 + sum_{j<=t} e^(G_t - G_j) (q_t . k_j) U[j]
//   S = e^(G_last) S0 + sum_t e^(G_last - G_t) k_t U[t]^T
// Value columns are independent, so a block owns SLICE of them: grid (value head, sequence, column
// slice), 128 threads, S's slice in shared memory for the whole sequence. Every decay factor is
// e^(non-positive), so nothing overflows. Results equal the recurrence up to rounding. Sequences with
// snapshot slots use the recurrent kernels (verify steps are short and need every token's state).
// Static shared memory: (KD * SLICE + 2 * CHUNK * (KD + 1) + CHUNK * (SLICE + KD) + 2 * CHUNK * CHUNK) floats;
// q and k rows are padded by one float so that threads reading different rows hit different banks.
#define CHUNK 16
#define SLICE 32
#define CHUNK_THREADS 128

template <int KD>
__device__ void delta_rule_chunked(const float* mixed, const float* g, const float* beta, float* ssm, float* out,
                                   const int* seqs, int key_heads, int value_heads, int value_dim) {
    __shared__ float S[KD * SLICE];
    constexpr int RS = KD + 1;  // padded row stride of Kc and Qc
    __shared__ float Kc[CHUNK * RS], Qc[CHUNK * RS];
    __shared__ float X[CHUNK * (SLICE + KD)];  // [t][SLICE value columns | KD key columns]
    __shared__ float A[CHUNK * CHUNK], QK[CHUNK * CHUNK];
    __shared__ float G[CHUNK], B[CHUNK], decay_in[CHUNK], decay_out[CHUNK];
    const int h = blockIdx.x;
    const int* seq = seqs + 4 * blockIdx.y;
    const int start = seq[0], len = seq[1], slot = seq[2];
    const int kh = h / (value_heads / key_heads);
    const int conv_dim = 2 * key_heads * KD + value_heads * value_dim;
    const i64 head_state = (i64)KD * value_dim;
    float* state = ssm + ((i64)slot * value_heads + h) * head_state;
    const int col0 = blockIdx.z * SLICE;
    const int cols = min(SLICE, value_dim - col0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    const float q_scale = 1.0f / sqrtf((float)KD);

    for (int i = tid; i < KD * SLICE; i += blockDim.x) {
        const int x = i / SLICE, c = i % SLICE;
        S[i] = c < cols ? state[(i64)x * value_dim + col0 + c] : 0.0f;
    }
    for (int c0 = 0; c0 < len; c0 += CHUNK) {
        const int n = min(CHUNK, len - c0);
        __syncthreads();  // the previous chunk is done with every shared array
        // q, k rows of the chunk, l2-normed: one warp per row.
        for (int t = warp; t < CHUNK; t += warps) {
            const float* qkv = mixed + (i64)(start + c0 + t) * conv_dim;
            float qss = 0.0f, kss = 0.0f;
            for (int x = lane; x < KD; x += 32) {
                const float qv = t < n ? qkv[kh * KD + x] : 0.0f;
                const float kv = t < n ? qkv[key_heads * KD + kh * KD + x] : 0.0f;
                Qc[t * RS + x] = qv;
                Kc[t * RS + x] = kv;
                qss += qv * qv;
                kss += kv * kv;
            }
            for (int o = 16; o > 0; o >>= 1) {
                qss += __shfl_xor_sync(0xffffffffu, qss, o);
                kss += __shfl_xor_sync(0xffffffffu, kss, o);
            }
            const float q_inv = 1.0f / sqrtf(qss + 1e-6f), k_inv = 1.0f / sqrtf(kss + 1e-6f);
            for (int x = lane; x < KD; x += 32) {
                Qc[t * RS + x] *= q_inv * q_scale;
                Kc[t * RS + x] *= k_inv;
            }
        }
        if (tid == 0) {
            float cumulative = 0.0f;
            for (int t = 0; t < CHUNK; ++t) {
                const i64 row = start + c0 + t;
                cumulative += t < n ? g[row * value_heads + h] : 0.0f;
                G[t] = cumulative;
                B[t] = t < n ? beta[row * value_heads + h] : 0.0f;
            }
            for (int t = 0; t < CHUNK; ++t) {
                decay_in[t] = expf(G[t]);             // from the chunk's start to token t
                decay_out[t] = expf(G[n - 1] - G[t]);  // from token t to the chunk's end
            }
        }
        __syncthreads();
        // A (strictly lower) and the causal, decayed q.k scores.
        for (int i = tid; i < CHUNK * CHUNK; i += blockDim.x) {
            const int t = i / CHUNK, j = i % CHUNK;
            float kk = 0.0f, qk = 0.0f;
            if (j <= t) {
                for (int x = 0; x < KD; ++x) {
                    kk = fmaf(Kc[t * RS + x], Kc[j * RS + x], kk);
                    qk = fmaf(Qc[t * RS + x], Kc[j * RS + x], qk);
                }
            }
            const float decay = j <= t ? expf(G[t] - G[j]) : 0.0f;
            A[i] = j < t ? B[t] * decay * kk : 0.0f;
            QK[i] = qk * decay;
        }
        // Right-hand sides: beta V (this block's columns) and beta e^G K.
        for (int i = tid; i < CHUNK * (SLICE + KD); i += blockDim.x) {
            const int t = i / (SLICE + KD), c = i % (SLICE + KD);
            float rhs;
            if (c < SLICE) {
                rhs = (t < n && c < cols)
                          ? B[t] * mixed[(i64)(start + c0 + t) * conv_dim + 2 * key_heads * KD + h * value_dim + col0 + c]
                          : 0.0f;
            } else {
                rhs = B[t] * decay_in[t] * Kc[t * RS + (c - SLICE)];
            }
            X[i] = rhs;
        }
        __syncthreads();
        // (I + A) X = rhs by forward substitution; every column is independent.
        for (int c = tid; c < SLICE + KD; c += blockDim.x) {
            for (int t = 1; t < CHUNK; ++t) {
                float v = X[t * (SLICE + KD) + c];
                for (int j = 0; j < t; ++j) v = fmaf(-A[t * CHUNK + j], X[j * (SLICE + KD) + c], v);
                X[t * (SLICE + KD) + c] = v;
            }
        }
        __syncthreads();
        // U = X_V - X_K S0, kept in X's value columns (each thread owns whole (t, c) entries and
        // reads only the key columns and S).
        for (int i = tid; i < CHUNK * SLICE; i += blockDim.x) {
            const int t = i / SLICE, c = i % SLICE;
            float u = X[t * (SLICE + KD) + c];
            for (int x = 0; x < KD; ++x) u = fmaf(-X[t * (SLICE + KD) + SLICE + x], S[x * SLICE + c], u);
            X[t * (SLICE + KD) + c] = u;
        }
        __syncthreads();
        // Outputs of the chunk's tokens.
        for (int i = tid; i < CHUNK * SLICE; i += blockDim.x) {
            const int t = i / SLICE, c = i % SLICE;
            if (t >= n || c >= cols) continue;
            float from_state = 0.0f;
            for (int x = 0; x < KD; ++x) from_state = fmaf(Qc[t * RS + x], S[x * SLICE + c], from_state);
            float o = decay_in[t] * from_state;
            for (int j = 0; j <= t; ++j) o = fmaf(QK[t * CHUNK + j], X[j * (SLICE + KD) + c], o);
            out[((i64)(start + c0 + t) * value_heads + h) * value_dim + col0 + c] = o;
        }
        __syncthreads();
        // The state after the chunk.
        const float chunk_decay = decay_in[n - 1];
        for (int i = tid; i < KD * SLICE; i += blockDim.x) {
            const int x = i / SLICE, c = i % SLICE;
            float s = chunk_decay * S[i];
            for (int t = 0; t < n; ++t) s = fmaf(Kc[t * RS + x] * decay_out[t], X[t * (SLICE + KD) + c], s);
            S[i] = s;
        }
    }
    __syncthreads();
    for (int i = tid; i < KD * SLICE; i += blockDim.x) {
        const int x = i / SLICE, c = i % SLICE;
        if (c < cols) state[(i64)x * value_dim + col0 + c] = S[i];
    }
}

#define DELTA_RULE_CHUNKED(KD)                                                                               \
    extern "C" __global__ void gated_delta_rule_chunked_k##KD(const float* mixed, const float* g,            \
                                                              const float* beta, float* ssm, float* out,     \
                                                              const int* seqs, int key_heads,                \
                                                              int value_heads, int value_dim) {              \
        delta_rule_chunked<KD>(mixed, g, beta, ssm, out, seqs, key_heads, value_heads, value_dim);            \
    }
DELTA_RULE_CHUNKED(16)
DELTA_RULE_CHUNKED(32)
DELTA_RULE_CHUNKED(64)
DELTA_RULE_CHUNKED(128)
