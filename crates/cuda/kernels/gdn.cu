// Gated DeltaNet: the gates, and the gated delta rule in its recurrent form.
//
// The delta rule runs one block per (value head, sequence); thread j owns column j of the head's
// state S [key_dim, value_dim], which stays in the state pool (f32) and is updated in place token by
// token: S <- e^g S; S += k (beta (v - S^T k))^T; o = S^T q. Every thread touches only its own
// column, so no synchronisation is needed on S; q and k (l2-normed, q scaled by key_dim^-0.5) are
// staged in shared memory per token. Prefill uses the same loop (mathematically the chunked form).
// This plain kernel takes the dims the row-coalesced one below is not compiled for.
//
// seqs [n_seqs, 4] = (start row, new tokens, state slot, first snapshot index or -1);
// snaps = the snapshot slots of all sequences back to back.

// g = -exp(a_log) * softplus(a + dt_bias) (torch softplus: threshold 20), beta = sigmoid(b).
__device__ __forceinline__ float gdn_decay_gate(float a, float a_log, float dt_bias) {
    const double x = (double)a + (double)dt_bias;
    const double softplus = x > 20.0 ? x : log1p(exp(x));
    return (float)(-exp((double)a_log) * softplus);
}
__device__ __forceinline__ float gdn_beta_gate(float b) { return (float)(1.0 / (1.0 + exp(-(double)b))); }

extern "C" __global__ void gdn_gates(const float* a, const float* b, const float* a_log, const float* dt_bias,
                                     float* g, float* beta, i64 n, int heads) {
    AFTER_PREVIOUS_KERNEL();
    FOR_EACH(i, n) {
        const int h = (int)(i % heads);
        g[i] = gdn_decay_gate(a[i], a_log[h], dt_bias[h]);
        beta[i] = gdn_beta_gate(b[i]);
    }
}

// Where the row kernels take a token's gates from: g and beta as gdn_gates wrote them, or (with
// `a` set) the raw projections, turned into gates by the same functions, so that decode needs no
// gates launch and computes them bit for bit alike.
struct GdnGates {
    const float* g;
    const float* beta;
    const float* a;
    const float* b;
    const float* a_log;
    const float* dt_bias;
};

// Dynamic shared memory: (2 * key_dim + 32) floats.
extern "C" __global__ void gated_delta_rule(const float* mixed, const float* g, const float* beta, float* ssm,
                                            float* out, const int* seqs, const int* snaps, int key_heads,
                                            int value_heads, int key_dim, int value_dim) {
    AFTER_PREVIOUS_KERNEL();
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

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The recurrence for whole rows of the state: lane l of a warp owns C consecutive value columns
// (C = 4: a warp reads or writes a 128-column state row in one 512-byte sweep; C = 1: 32 columns in
// 128 bytes, four times the blocks for batches too small to fill the GPU) and warp w owns key rows
// w*R .. w*R+R-1 (R = KD / ROW_WARPS), the block's slice of S living in registers for the whole
// sequence. Per token one pass over the registers gives S^T k, S^T q and k.q (partial sums per warp,
// added in warp order through shared memory: the same order for every column, C and batch, so both
// widths give bitwise the same results), because
//   m = e^g S^T k,  delta = beta (v - m),  S' = e^g S + k delta^T,  o = S'^T q = e^g S^T q + delta (k.q).
// The next token's inputs are loaded while the current one is computed, and the shared arrays are
// double-buffered by token parity, so a token costs two barriers.
// Grid: (value head, sequence, group of 32 * C value columns); ROW_WARPS * 32 threads; value_dim % C == 0.
// Static shared memory only.
#define ROW_WARPS 8

template <int C>
struct Cols {
    float x[C];
};

template <int C>
__device__ __forceinline__ Cols<C> load_cols(const float* p) {
    Cols<C> v;
    if (C == 4) {
        const float4 f = *reinterpret_cast<const float4*>(p);
        v.x[0] = f.x;
        v.x[C > 1 ? 1 : 0] = f.y;
        v.x[C > 2 ? 2 : 0] = f.z;
        v.x[C > 3 ? 3 : 0] = f.w;
    } else {
#pragma unroll
        for (int c = 0; c < C; ++c) v.x[c] = p[c];
    }
    return v;
}

template <int C>
__device__ __forceinline__ void store_cols(float* p, const Cols<C>& v) {
    if (C == 4) {
        *reinterpret_cast<float4*>(p) = make_float4(v.x[0], v.x[C > 1 ? 1 : 0], v.x[C > 2 ? 2 : 0], v.x[C > 3 ? 3 : 0]);
    } else {
#pragma unroll
        for (int c = 0; c < C; ++c) p[c] = v.x[c];
    }
}

template <int C>
__device__ __forceinline__ Cols<C> zero_cols() {
    Cols<C> v;
#pragma unroll
    for (int c = 0; c < C; ++c) v.x[c] = 0.0f;
    return v;
}

template <int KD, int C>
struct RowTokenInputs {
    float qk[(KD + 31) / 32];  // warp 0: q, warp 1: k (lane-strided); other warps load nothing
    Cols<C> v;
    float g, beta;
};

template <int KD, int C>
__device__ __forceinline__ void fetch_row_token(RowTokenInputs<KD, C>& in, const float* mixed, const GdnGates& gates,
                                                i64 row, int conv_dim, int key_heads, int kh,
                                                int h, int value_heads, int value_dim, int col, bool owns) {
    const float* qkv = mixed + row * conv_dim;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp < 2) {
        const float* src = qkv + (warp == 0 ? kh * KD : key_heads * KD + kh * KD);
#pragma unroll
        for (int e = 0; e < (KD + 31) / 32; ++e) {
            const int x = lane + 32 * e;
            in.qk[e] = x < KD ? src[x] : 0.0f;
        }
    }
    in.v = owns ? load_cols<C>(qkv + 2 * key_heads * KD + h * value_dim + col) : zero_cols<C>();
    const i64 at = row * value_heads + h;
    if (gates.a) {
        in.g = gdn_decay_gate(gates.a[at], gates.a_log[h], gates.dt_bias[h]);
        in.beta = gdn_beta_gate(gates.b[at]);
    } else {
        in.g = gates.g[at];
        in.beta = gates.beta[at];
    }
}

template <int KD, int C>
__device__ void delta_rule_rows(const float* mixed, const GdnGates& gates, float* ssm, float* out,
                                const int* seqs, const int* snaps, int key_heads, int value_heads, int value_dim) {
    constexpr int R = KD / ROW_WARPS;
    __shared__ float q[2][KD], k[2][KD];
    __shared__ Cols<C> partial_k[2][ROW_WARPS][32], partial_q[2][ROW_WARPS][32];
    __shared__ float partial_kq[2][ROW_WARPS];
    __shared__ float norms[2][2];  // per buffer: 1/|q| * KD^-0.5, 1/|k|
    const int h = blockIdx.x;
    const int* seq = seqs + 4 * blockIdx.y;
    const int start = seq[0], len = seq[1], slot = seq[2], snap = seq[3];
    const int kh = h / (value_heads / key_heads);
    const int conv_dim = 2 * key_heads * KD + value_heads * value_dim;
    const i64 head_state = (i64)KD * value_dim;
    float* S = ssm + ((i64)slot * value_heads + h) * head_state;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int col = (blockIdx.z * 32 + lane) * C;
    const bool owns = col < value_dim;
    const int row0 = warp * R;
    Cols<C> s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = owns ? load_cols<C>(S + (i64)(row0 + r) * value_dim + col) : zero_cols<C>();
    // Tokens whose inputs are in flight: a token's work is shorter than a load's latency, so one
    // sequence (prefill) keeps several ahead; a wide batch (C = 4) has the parallelism already and
    // keeps its registers for the state.
    constexpr int AHEAD = C == 1 ? 4 : 1;
    RowTokenInputs<KD, C> ring[AHEAD];
#pragma unroll
    for (int u = 0; u < AHEAD; ++u)
        if (u < len) fetch_row_token<KD, C>(ring[u], mixed, gates, start + u, conv_dim, key_heads, kh, h, value_heads, value_dim, col, owns);
    for (int i0 = 0; i0 < len; i0 += AHEAD) {
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) {
        const int i = i0 + u;
        if (i >= len) break;
        const int buf = i & 1;
        const i64 row = start + i;
        const RowTokenInputs<KD, C> cur = ring[u];
        if (i + AHEAD < len)
            fetch_row_token<KD, C>(ring[u], mixed, gates, row + AHEAD, conv_dim, key_heads, kh, h, value_heads, value_dim, col, owns);
        if (warp < 2) {
            float* dst = warp == 0 ? q[buf] : k[buf];
            float ss = 0.0f;
#pragma unroll
            for (int e = 0; e < (KD + 31) / 32; ++e) {
                const int x = lane + 32 * e;
                if (x < KD) dst[x] = cur.qk[e];
                ss += cur.qk[e] * cur.qk[e];
            }
            ss = warp_sum(ss);
            if (lane == 0) norms[buf][warp] = warp == 0 ? rsqrtf(ss + 1e-6f) * rsqrtf((float)KD) : rsqrtf(ss + 1e-6f);
        }
        __syncthreads();
        const float qn = norms[buf][0], kn = norms[buf][1];
        Cols<C> sk = zero_cols<C>(), sq = zero_cols<C>();
        float kq = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float kv = k[buf][row0 + r] * kn, qv = q[buf][row0 + r] * qn;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                sk.x[c] = fmaf(s[r].x[c], kv, sk.x[c]);
                sq.x[c] = fmaf(s[r].x[c], qv, sq.x[c]);
            }
            kq = fmaf(kv, qv, kq);
        }
        partial_k[buf][warp][lane] = sk;
        partial_q[buf][warp][lane] = sq;
        if (lane == 0) partial_kq[buf][warp] = kq;
        __syncthreads();
        Cols<C> tk = partial_k[buf][0][lane], tq = partial_q[buf][0][lane];
        float kq_total = partial_kq[buf][0];
#pragma unroll
        for (int w = 1; w < ROW_WARPS; ++w) {
            const Cols<C> pk = partial_k[buf][w][lane], pq = partial_q[buf][w][lane];
#pragma unroll
            for (int c = 0; c < C; ++c) {
                tk.x[c] += pk.x[c];
                tq.x[c] += pq.x[c];
            }
            kq_total += partial_kq[buf][w];
        }
        const float decay = expf(cur.g), b = cur.beta;
        Cols<C> delta, o;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            delta.x[c] = b * (cur.v.x[c] - decay * tk.x[c]);
            o.x[c] = fmaf(decay, tq.x[c], delta.x[c] * kq_total);
        }
        if (warp == 0 && owns) store_cols<C>(out + (row * value_heads + h) * value_dim + col, o);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float kv = k[buf][row0 + r] * kn;
#pragma unroll
            for (int c = 0; c < C; ++c) s[r].x[c] = fmaf(decay, s[r].x[c], kv * delta.x[c]);
        }
        if (snap >= 0 && owns) {
            float* D = ssm + ((i64)snaps[snap + i] * value_heads + h) * head_state;
#pragma unroll
            for (int r = 0; r < R; ++r) store_cols<C>(D + (i64)(row0 + r) * value_dim + col, s[r]);
        }
    }
    }
    if (owns) {
#pragma unroll
        for (int r = 0; r < R; ++r) store_cols<C>(S + (i64)(row0 + r) * value_dim + col, s[r]);
    }
}

#define DELTA_RULE_ROWS(KD, C)                                                                               \
    extern "C" __global__ void __launch_bounds__(ROW_WARPS * 32, 2) gated_delta_rule_rows_k##KD##_c##C(      \
        const float* mixed, const GdnGates gates, float* ssm, float* out, const int* seqs,                   \
        const int* snaps, int key_heads, int value_heads, int value_dim) { AFTER_PREVIOUS_KERNEL();                                   \
        delta_rule_rows<KD, C>(mixed, gates, ssm, out, seqs, snaps, key_heads, value_heads, value_dim);      \
    }
DELTA_RULE_ROWS(16, 1)
DELTA_RULE_ROWS(32, 1)
DELTA_RULE_ROWS(64, 1)
DELTA_RULE_ROWS(128, 1)
DELTA_RULE_ROWS(256, 1)
DELTA_RULE_ROWS(16, 4)
DELTA_RULE_ROWS(32, 4)
DELTA_RULE_ROWS(64, 4)
DELTA_RULE_ROWS(128, 4)
DELTA_RULE_ROWS(256, 4)
