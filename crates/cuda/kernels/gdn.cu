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

// The same recurrence with state columns in registers, for decode and verify steps: the block is one
// warp, and each value column belongs to GDN_COLUMN_LANES adjacent lanes, lane q of them holding key
// rows q * KD / L .. (q + 1) * KD / L - 1, so a column needs no other warp and no barrier. The sums
// keep the row kernel's order: KD / ROW_WARPS rows a partial, each summed by the lane that holds
// them, the 8 partials gathered by shuffles and added in order (k.q the same way), so the results
// are bit for bit delta_rule_rows'. Tokens are staged COLUMN_TOKENS at a time: their q and k
// normalised in shared memory, their values there too, lane u's gates and k.q for token u, none of
// which depends on the state, so only the update itself stays sequential. The value dim is compiled
// in (the state's row stride: with it a lane's addresses are one base and constant offsets).
// Grid: (value head, sequence, group of 32 / L value columns); 32 threads; KD % ROW_WARPS == 0.
#define COLUMN_TOKENS 8
#ifndef GDN_COLUMN_LANES
#define GDN_COLUMN_LANES 4
#endif

__device__ __forceinline__ void copy16_async(float* dst, const float* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void copy4_async(float* dst, const float* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(shared_address(dst)), "l"(src) : "memory");
}

// The sum of the 8 partials in order, partial w held as part[w % G] by lane w / G of the column's L
// lanes (G = ROW_WARPS / L).
template <int L>
__device__ __forceinline__ float sum_partials_in_order(const float* part, int first_lane) {
    constexpr int G = ROW_WARPS / L;
    float total = 0.0f;
#pragma unroll
    for (int j = 0; j < L; ++j)
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const float p = L == 1 ? part[g] : __shfl_sync(0xffffffffu, part[g], first_lane + j);
            total = j == 0 && g == 0 ? p : total + p;
        }
    return total;
}

template <int KD, int VD>
__device__ void delta_rule_columns(const float* mixed, const GdnGates& gates, float* ssm, float* out,
                                   const int* seqs, const int* snaps, int key_heads, int value_heads) {
    constexpr int L = GDN_COLUMN_LANES;
    static_assert(ROW_WARPS % L == 0 && 32 % L == 0, "a column's lanes split the partials evenly");
    constexpr int value_dim = VD;
    constexpr int R = KD / ROW_WARPS;   // rows a partial
    constexpr int G = ROW_WARPS / L;    // partials a lane
    constexpr int ROWS = KD / L;        // rows a lane
    constexpr int E = (KD + 31) / 32;
    __shared__ __align__(16) float qs[COLUMN_TOKENS][KD], ks[COLUMN_TOKENS][KD], vs[COLUMN_TOKENS][32];
    const int h = blockIdx.x;
    const int* seq = seqs + 4 * blockIdx.y;
    const int start = seq[0], len = seq[1], slot = seq[2], snap = seq[3];
    const int kh = h / (value_heads / key_heads);
    const int conv_dim = 2 * key_heads * KD + value_heads * value_dim;
    const i64 head_state = (i64)KD * value_dim;
    float* S = ssm + ((i64)slot * value_heads + h) * head_state;
    const int lane = threadIdx.x & 31;
    const int part = lane % L, first_lane = lane - part;
    const int col = blockIdx.z * (32 / L) + lane / L;
    const int row0 = part * ROWS;
    const bool owns = col < value_dim;
    float s[ROWS];
    if (owns) {
        const float* column = S + (i64)row0 * value_dim + col;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) s[r] = column[(i64)r * value_dim];
    } else {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) s[r] = 0.0f;
    }
    for (int i0 = 0; i0 < len; i0 += COLUMN_TOKENS) {
        const int n = min(COLUMN_TOKENS, len - i0);
        __syncwarp();  // the previous tokens' reads of qs / ks / vs are done
        // The tokens' q, k and v are copied to shared memory without passing through registers
        // (the state holds many of them), all in flight at once.
#pragma unroll 1
        for (int u = 0; u < n; ++u) {
            const float* qkv = mixed + (start + i0 + u) * (i64)conv_dim;
            for (int c = lane; c < KD / 4; c += 32) {
                copy16_async(&qs[u][4 * c], qkv + kh * KD + 4 * c);
                copy16_async(&ks[u][4 * c], qkv + key_heads * KD + kh * KD + 4 * c);
            }
            if (owns)
                copy4_async(&vs[u][lane], qkv + 2 * key_heads * KD + h * value_dim + col);
            else
                vs[u][lane] = 0.0f;
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        float my_g = 0.0f, my_beta = 0.0f;
        if (lane < n) {
            const i64 at = (start + i0 + lane) * (i64)value_heads + h;
            if (gates.a) {
                my_g = gdn_decay_gate(gates.a[at], gates.a_log[h], gates.dt_bias[h]);
                my_beta = gdn_beta_gate(gates.b[at]);
            } else {
                my_g = gates.g[at];
                my_beta = gates.beta[at];
            }
        }
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncwarp();
        // Normalise q and k in place; each lane rewrites only the elements it read.
#pragma unroll 2
        for (int u = 0; u < n; ++u) {
            float qv[E], kv[E];
            float qss = 0.0f, kss = 0.0f;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const int x = lane + 32 * e;
                qv[e] = x < KD ? qs[u][x] : 0.0f;
                kv[e] = x < KD ? ks[u][x] : 0.0f;
                qss += qv[e] * qv[e];
                kss += kv[e] * kv[e];
            }
            qss = warp_sum(qss);
            kss = warp_sum(kss);
            const float qn = rsqrtf(qss + 1e-6f) * rsqrtf((float)KD), kn = rsqrtf(kss + 1e-6f);
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const int x = lane + 32 * e;
                if (x < KD) {
                    qs[u][x] = qv[e] * qn;
                    ks[u][x] = kv[e] * kn;
                }
            }
        }
        __syncwarp();
        float my_kq = 0.0f;
        if (lane < n) {
            float partial[ROW_WARPS];
#pragma unroll
            for (int w = 0; w < ROW_WARPS; ++w) {
                partial[w] = 0.0f;
#pragma unroll
                for (int r = 0; r < R; ++r) partial[w] = fmaf(ks[lane][w * R + r], qs[lane][w * R + r], partial[w]);
            }
            my_kq = partial[0];
#pragma unroll
            for (int w = 1; w < ROW_WARPS; ++w) my_kq += partial[w];
        }
#pragma unroll 1
        for (int u = 0; u < n; ++u) {
            const int i = i0 + u;
            const float decay = expf(__shfl_sync(0xffffffffu, my_g, u));
            const float b = __shfl_sync(0xffffffffu, my_beta, u);
            const float kq_total = __shfl_sync(0xffffffffu, my_kq, u);
            const float* k_rows = &ks[u][row0];
            const float* q_rows = &qs[u][row0];
            float pk[G], pq[G];
#pragma unroll
            for (int g = 0; g < G; ++g) {
                pk[g] = 0.0f;
                pq[g] = 0.0f;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    pk[g] = fmaf(s[g * R + r], k_rows[g * R + r], pk[g]);
                    pq[g] = fmaf(s[g * R + r], q_rows[g * R + r], pq[g]);
                }
                // One partial's k and q at a time in registers, beside the state.
                asm volatile("" ::: "memory");
            }
            const float tk = sum_partials_in_order<L>(pk, first_lane);
            const float tq = sum_partials_in_order<L>(pq, first_lane);
            const float delta = b * (vs[u][lane] - decay * tk);
            const float o = fmaf(decay, tq, delta * kq_total);
            const i64 row = start + i;
            if (owns && part == 0) out[(row * value_heads + h) * value_dim + col] = o;
            // k is read from shared memory again rather than kept from the sums above: held, it
            // and the state would not fit the registers at KD = 128 with one lane a column.
            asm volatile("" ::: "memory");
#pragma unroll
            for (int r = 0; r < ROWS; ++r) s[r] = fmaf(decay, s[r], k_rows[r] * delta);
            if (snap >= 0 && owns) {
                float* D = ssm + ((i64)snaps[snap + i] * value_heads + h) * head_state + (i64)row0 * value_dim + col;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) D[(i64)r * value_dim] = s[r];
            }
        }
    }
    if (owns) {
        float* column = S + (i64)row0 * value_dim + col;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) column[(i64)r * value_dim] = s[r];
    }
}

#define DELTA_RULE_COLUMNS(KD, VD)                                                                           \
    extern "C" __global__ void __launch_bounds__(32) gated_delta_rule_cols_k##KD##_v##VD(                    \
        const float* mixed, const GdnGates gates, float* ssm, float* out, const int* seqs,                   \
        const int* snaps, int key_heads, int value_heads, int value_dim) { AFTER_PREVIOUS_KERNEL();         \
        delta_rule_columns<KD, VD>(mixed, gates, ssm, out, seqs, snaps, key_heads, value_heads);            \
    }
DELTA_RULE_COLUMNS(16, 16)
DELTA_RULE_COLUMNS(32, 32)
DELTA_RULE_COLUMNS(64, 64)
DELTA_RULE_COLUMNS(128, 128)

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
