// Gated DeltaNet prefill in chunked form on the tensor cores (docs/model.md, "Gated DeltaNet",
// chunked form; the WY representation of the Gated DeltaNet paper): the map of the recurrence in
// gdn.cu, computed GDN_CHUNK tokens at a time. Per value head, with S0 [KD, VD] the state at a
// chunk's start, G the cumulative log-decay inside the chunk (G_t <= 0), q and k l2-normed (q also
// scaled by KD^-1/2):
//   A[t][j] = beta_t e^(G_t - G_j) (k_t . k_j) for j < t      T = (I + A)^-1 (unit lower triangular)
//   W  = T diag(beta e^G) K   [C, KD]       U0 = T diag(beta) V   [C, VD]
//   P[t][j] = e^(G_t - G_j) (q_t . k_j) for j <= t
//   Q' = diag(e^G) Q - P W    [C, KD]       O0 = P U0             [C, VD]
//   Kd = diag(e^(G_last - G)) K [C, KD]
// and then, chunk after chunk,
//   U = U0 - W S0 (the chunk's deltas)   O = Q' S0 + O0   S = e^(G_last) S0 + Kd^T U.
// Everything above the line is independent of the state, so `gdn_chunk_prepare` computes it for all
// chunks and heads at once into a workspace; `gdn_chunk_scan` then walks each sequence's chunks in
// order with its slice of S in shared memory: three small matrix products a chunk instead of a
// token-by-token recurrence.
//
// Products run on the tensor cores in TF32 (`mma.m16n8k8`, operands rounded to nearest, f32
// accumulation): a relative rounding of 2^-11 per operand, below the bf16 rounding of the
// activations around this op on the bf16 backend (the only one that takes this path; the f32 backend
// keeps the exact recurrence). T is inverted by blocks: the four 16 x 16 diagonal blocks by forward
// substitution on the CUDA cores (f32), the blocks below them from T_ij = -T_ii sum_k A_ik T_kj.
//
// Shared-memory rows are padded so that the eight row groups of an mma fragment fall in different
// banks: a row stride of 4 (mod 32) floats for row-major operand reads, 8 (mod 32) for reads across
// rows (transposed A, B operands).
#define GDN_CHUNK 64
#define GDN_SLICE 64
#define GDN_MAX_VALUE_DIM 128
#define PREP_WARPS 8
#define SCAN_WARPS 16
// The warp layouts below: in the prepare kernel warp w takes row block w % 4 and half w / 4 of the
// column tiles; in the scan warp w takes row block w % 4 and column tiles 2 (w / 4), 2 (w / 4) + 1.
static_assert(GDN_CHUNK / 16 == 4, "four 16-row blocks a chunk");
static_assert(PREP_WARPS == 2 * (GDN_CHUNK / 16), "prepare: two warps a row block");
static_assert(SCAN_WARPS * 2 == (GDN_CHUNK / 16) * (GDN_SLICE / 8), "scan: two column tiles a warp");

__device__ __forceinline__ unsigned int to_tf32(float x) {
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// x rounded to TF32, kept as an f32 value (its low mantissa bits zero): operands stored this way
// in shared memory or the workspace go to the tensor cores without another conversion.
__device__ __forceinline__ float round_tf32(float x) { return __uint_as_float(to_tf32(x)); }

// d (16 x 8) += a (16 x 8) * b (8 x 8), TF32 in, f32 accumulate. Fragments: thread (g = lane / 4,
// c = lane % 4) holds a = {A[g][c], A[g+8][c], A[g][c+4], A[g+8][c+4]}, b = {B[c][g], B[c+4][g]}
// and d = {D[g][2c], D[g][2c+1], D[g+8][2c], D[g+8][2c+1]}.
__device__ __forceinline__ void mma_tf32(float* d, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A fragment of rows r0.., columns k0.. of row-major M (row stride ld), times `sign`; ROUNDED: M
// holds TF32 values already.
template <bool ROUNDED = false>
__device__ __forceinline__ void frag_a(unsigned int* a, const float* m, int ld, int r0, int k0, int g, int c,
                                       float sign = 1.0f) {
    const float v[4] = {m[(r0 + g) * ld + k0 + c], m[(r0 + g + 8) * ld + k0 + c], m[(r0 + g) * ld + k0 + c + 4],
                        m[(r0 + g + 8) * ld + k0 + c + 4]};
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = ROUNDED ? __float_as_uint(sign * v[i]) : to_tf32(sign * v[i]);
}

// A fragment of the transpose of M (TF32 values already): A[r][k] = M[k][r].
__device__ __forceinline__ void frag_a_t(unsigned int* a, const float* m, int ld, int r0, int k0, int g, int c) {
    a[0] = __float_as_uint(m[(k0 + c) * ld + r0 + g]);
    a[1] = __float_as_uint(m[(k0 + c) * ld + r0 + g + 8]);
    a[2] = __float_as_uint(m[(k0 + c + 4) * ld + r0 + g]);
    a[3] = __float_as_uint(m[(k0 + c + 4) * ld + r0 + g + 8]);
}

// The B fragment of rows k0.., column n0 + g of row-major M holding TF32 values.
__device__ __forceinline__ void frag_b(unsigned int* b, const float* m, int ld, int k0, int n0, int g, int c) {
    b[0] = __float_as_uint(m[(k0 + c) * ld + n0 + g]);
    b[1] = __float_as_uint(m[(k0 + c + 4) * ld + n0 + g]);
}

// 16 bytes from global to shared memory without passing through registers; zeros when !valid.
__device__ __forceinline__ void copy16_async(float* dst, const float* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void wait_async_copies() {
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

// Floats of dynamic shared memory `gdn_chunk_prepare` needs for key dim KD (gdn.rs mirrors this).
#define PREP_SMEM_FLOATS(KD) \
    (2 * GDN_CHUNK * ((KD) + 4) + GDN_CHUNK * (GDN_MAX_VALUE_DIM + 4) + 3 * GDN_CHUNK * (GDN_CHUNK + 4) + 3 * GDN_CHUNK + PREP_WARPS * 16 * 24)

// One block per (chunk_base + blockIdx.x, value head): the state-independent part of a chunk (see the
// top). chunks [n_chunks, 2] = (first row, tokens in 1..GDN_CHUNK); outputs are indexed by
// (row - row0, value head), `last_decay` by (chunk, value head).
template <int KD>
__device__ void chunk_prepare(const float* __restrict__ mixed, const float* __restrict__ g_in,
                              const float* __restrict__ beta_in, const int* __restrict__ chunks, float* w_out,
                              float* q_out, float* k_out, float* u_out, float* o_out, float* last_decay,
                              int chunk_base, int row0, int key_heads, int value_heads, int value_dim) {
    constexpr int C = GDN_CHUNK, KS = KD + 4, VS = GDN_MAX_VALUE_DIM + 4, CS = C + 4, MS = 24;
    constexpr int KT = KD / 8;                    // n-tiles over the key dim
    constexpr int VT_MAX = GDN_MAX_VALUE_DIM / 8;  // n-tiles over the value dim, at most
    extern __shared__ __align__(16) float prep_smem[];
    float* Qn = prep_smem;    // [C][KS]
    float* Kn = Qn + C * KS;  // [C][KS]; W once Kd has been written
    float* V = Kn + C * KS;   // [C][VS]; U0 once W is done
    float* A = V + C * VS;    // [C][CS]
    float* T = A + C * CS;    // [C][CS]
    float* P = T + C * CS;    // [C][CS]
    float* G = P + C * CS;    // [C] cumulative log-decay
    float* Bt = G + C;        // [C] beta
    float* BG = Bt + C;       // [C] beta e^G
    float* scratch = BG + C;  // [PREP_WARPS][16][MS]

    const int chunk = chunk_base + blockIdx.x, h = blockIdx.y;
    const int first = chunks[2 * chunk], n = chunks[2 * chunk + 1];
    const int kh = h / (value_heads / key_heads);
    const i64 conv_dim = 2 * key_heads * KD + value_heads * value_dim;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int vtiles = (value_dim + 7) / 8;
    const float q_scale = 1.0f / sqrtf((float)KD);

    // 1. q, k and v rows of the chunk, all copies in flight at once (rows past its end are zero),
    // the gates beside them; then q and k l2-normed in place and the cumulative log-decay.
    for (int i = tid; i < C * (2 * KD + GDN_MAX_VALUE_DIM) / 4; i += PREP_WARPS * 32) {
        const int t = i / ((2 * KD + GDN_MAX_VALUE_DIM) / 4), x = 4 * (i % ((2 * KD + GDN_MAX_VALUE_DIM) / 4));
        const float* qkv = mixed + (i64)(first + t) * conv_dim;
        if (x < KD) {
            copy16_async(Qn + t * KS + x, t < n ? qkv + kh * KD + x : mixed, t < n);
        } else if (x < 2 * KD) {
            copy16_async(Kn + t * KS + x - KD, t < n ? qkv + key_heads * KD + kh * KD + x - KD : mixed, t < n);
        } else {
            const int j = x - 2 * KD;
            const bool valid = t < n && j < value_dim;
            copy16_async(V + t * VS + j, valid ? qkv + 2 * key_heads * KD + h * value_dim + j : mixed, valid);
        }
    }
    if (tid < C) {
        const i64 row = first + tid;
        G[tid] = tid < n ? g_in[row * value_heads + h] : 0.0f;
        Bt[tid] = tid < n ? beta_in[row * value_heads + h] : 0.0f;
    }
    wait_async_copies();
    __syncthreads();
    if (warp == 0) {
        // Inclusive prefix sum of the 64 log-decays: two per lane, then across the lanes.
        const float a = G[2 * lane], b = G[2 * lane + 1];
        float s = a + b;
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        const float before = s - (a + b);
        G[2 * lane] = before + a;
        G[2 * lane + 1] = before + a + b;
    }
    for (int t = warp; t < C; t += PREP_WARPS) {
        float qss = 0.0f, kss = 0.0f;
        for (int x = lane; x < KD; x += 32) {
            qss += Qn[t * KS + x] * Qn[t * KS + x];
            kss += Kn[t * KS + x] * Kn[t * KS + x];
        }
        for (int o = 16; o > 0; o >>= 1) {
            qss += __shfl_xor_sync(0xffffffffu, qss, o);
            kss += __shfl_xor_sync(0xffffffffu, kss, o);
        }
        const float q_mul = q_scale / sqrtf(qss + 1e-6f), k_mul = 1.0f / sqrtf(kss + 1e-6f);
        for (int x = lane; x < KD; x += 32) {
            Qn[t * KS + x] = round_tf32(Qn[t * KS + x] * q_mul);
            Kn[t * KS + x] = round_tf32(Kn[t * KS + x] * k_mul);
        }
    }
    __syncthreads();
    if (tid < C) BG[tid] = Bt[tid] * expf(G[tid]);

    // Warp w owns row block mt = w % 4 (rows 16 mt .. 16 mt + 15) and half h2 = w / 4 of the column
    // tiles of every product below.
    const int mt = warp & 3, h2 = warp >> 2, r0 = 16 * mt;

    // 2. k.k and q.k products of the chunk -> A and P (TF32 values: they are operands below).
    {
        float kk[4][4], qk[4][4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int i = 0; i < 4; ++i) kk[q][i] = qk[q][i] = 0.0f;
#pragma unroll 4
        for (int k0 = 0; k0 < KD; k0 += 8) {
            unsigned int ak[4], aq[4];
            frag_a<true>(ak, Kn, KS, r0, k0, g, c);
            frag_a<true>(aq, Qn, KS, r0, k0, g, c);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int n0 = 8 * (4 * h2 + q);
                const unsigned int b0 = __float_as_uint(Kn[(n0 + g) * KS + k0 + c]);
                const unsigned int b1 = __float_as_uint(Kn[(n0 + g) * KS + k0 + c + 4]);
                mma_tf32(kk[q], ak, b0, b1);
                mma_tf32(qk[q], aq, b0, b1);
            }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int t = r0 + g + (i >= 2 ? 8 : 0), j = 8 * (4 * h2 + q) + 2 * c + (i & 1);
                const float decay = j <= t ? expf(G[t] - G[j]) : 0.0f;
                A[t * CS + j] = round_tf32(j < t ? Bt[t] * decay * kk[q][i] : 0.0f);
                P[t * CS + j] = round_tf32(decay * qk[q][i]);
            }
    }
    __syncthreads();

    // 3. T = (I + A)^-1. Diagonal 16 x 16 blocks by forward substitution, one thread a column.
    if (tid < C) {
        const int j = tid, b0 = j & ~15;
        for (int t = 0; t < b0; ++t) T[t * CS + j] = 0.0f;
        float column[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            const int t = b0 + r;
            float v = t == j ? 1.0f : 0.0f;
#pragma unroll
            for (int i = 0; i < r; ++i)
                if (t > j && b0 + i >= j) v = fmaf(-A[t * CS + b0 + i], column[i], v);
            column[r] = v;
            T[t * CS + j] = round_tf32(v);
        }
    }
    __syncthreads();
    // Blocks below the diagonal, block row by block row: T_ij = -T_ii sum_{k=j}^{i-1} A_ik T_kj.
    for (int bi = 1; bi < C / 16; ++bi) {
        if (warp < bi) {
            const int bj = warp;
            float m[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
            for (int k0 = 16 * bj; k0 < 16 * bi; k0 += 8) {
                unsigned int a[4];
                frag_a<true>(a, A, CS, 16 * bi, k0, g, c);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    unsigned int b[2];
                    frag_b(b, T, CS, k0, 16 * bj + 8 * nt, g, c);
                    mma_tf32(m[nt], a, b[0], b[1]);
                }
            }
            float* M = scratch + warp * 16 * MS;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    M[(g + (i >= 2 ? 8 : 0)) * MS + 8 * nt + 2 * c + (i & 1)] = round_tf32(m[nt][i]);
            __syncwarp();
            float r[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int k0 = 0; k0 < 16; k0 += 8) {
                unsigned int a[4];
                frag_a<true>(a, T, CS, 16 * bi, 16 * bi + k0, g, c, -1.0f);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    unsigned int b[2];
                    frag_b(b, M, MS, k0, 8 * nt, g, c);
                    mma_tf32(r[nt], a, b[0], b[1]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    T[(16 * bi + g + (i >= 2 ? 8 : 0)) * CS + 16 * bj + 8 * nt + 2 * c + (i & 1)] = round_tf32(r[nt][i]);
        }
        __syncthreads();
    }

    // 4. W = T diag(beta e^G) K and U0 = T diag(beta) V (row block mt of T is zero past column
    // 16 mt + 15).
    const i64 out_row = (i64)(first - row0) * value_heads + h;  // record of the chunk's first token
    constexpr int KH = KT / 2;                                   // key-dim tiles per half
    {
        float acc[KH][4];
#pragma unroll
        for (int q = 0; q < KH; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
        for (int k0 = 0; k0 < r0 + 16; k0 += 8) {
            unsigned int a[4];
            frag_a<true>(a, T, CS, r0, k0, g, c);
            const float s0 = BG[k0 + c], s1 = BG[k0 + c + 4];
#pragma unroll
            for (int q = 0; q < KH; ++q) {
                const int n0 = 8 * (KH * h2 + q);
                mma_tf32(acc[q], a, to_tf32(s0 * Kn[(k0 + c) * KS + n0 + g]), to_tf32(s1 * Kn[(k0 + c + 4) * KS + n0 + g]));
            }
        }
        // Kd (an operand of the scan: TF32), before Kn's rows become W's.
        const float g_last = G[n - 1];
        for (int i = tid; i < n * KD; i += PREP_WARPS * 32) {
            const int t = i / KD, x = i % KD;
            k_out[(out_row + (i64)t * value_heads) * KD + x] = round_tf32(expf(g_last - G[t]) * Kn[t * KS + x]);
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < KH; ++q)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int t = r0 + g + (i >= 2 ? 8 : 0), x = 8 * (KH * h2 + q) + 2 * c + (i & 1);
                const float w = round_tf32(acc[q][i]);
                Kn[t * KS + x] = w;
                if (t < n) w_out[(out_row + (i64)t * value_heads) * KD + x] = w;
            }
    }
    constexpr int VH = VT_MAX / 2;  // value-dim tiles per half, at most
    {
        float acc[VH][4];
#pragma unroll
        for (int q = 0; q < VH; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
        for (int k0 = 0; k0 < r0 + 16; k0 += 8) {
            unsigned int a[4];
            frag_a<true>(a, T, CS, r0, k0, g, c);
            const float s0 = Bt[k0 + c], s1 = Bt[k0 + c + 4];
#pragma unroll
            for (int q = 0; q < VH; ++q) {
                const int n0 = 8 * (VH * h2 + q);
                if (n0 < 8 * vtiles)
                    mma_tf32(acc[q], a, to_tf32(s0 * V[(k0 + c) * VS + n0 + g]), to_tf32(s1 * V[(k0 + c + 4) * VS + n0 + g]));
            }
        }
        __syncthreads();  // every warp has read V
#pragma unroll
        for (int q = 0; q < VH; ++q)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int t = r0 + g + (i >= 2 ? 8 : 0), j = 8 * (VH * h2 + q) + 2 * c + (i & 1);
                if (j >= 8 * vtiles) continue;
                V[t * VS + j] = round_tf32(acc[q][i]);
                if (t < n && j < value_dim) u_out[(out_row + (i64)t * value_heads) * value_dim + j] = acc[q][i];
            }
    }
    __syncthreads();

    // 5. Q' = diag(e^G) Q - P W and O0 = P U0 (P is zero right of its diagonal).
    {
        float acc[KH][4];
#pragma unroll
        for (int q = 0; q < KH; ++q)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int t = r0 + g + (i >= 2 ? 8 : 0), x = 8 * (KH * h2 + q) + 2 * c + (i & 1);
                acc[q][i] = expf(G[t]) * Qn[t * KS + x];
            }
        for (int k0 = 0; k0 < r0 + 16; k0 += 8) {
            unsigned int a[4];
            frag_a<true>(a, P, CS, r0, k0, g, c, -1.0f);
#pragma unroll
            for (int q = 0; q < KH; ++q) {
                unsigned int b[2];
                frag_b(b, Kn, KS, k0, 8 * (KH * h2 + q), g, c);
                mma_tf32(acc[q], a, b[0], b[1]);
            }
        }
#pragma unroll
        for (int q = 0; q < KH; ++q)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int t = r0 + g + (i >= 2 ? 8 : 0), x = 8 * (KH * h2 + q) + 2 * c + (i & 1);
                if (t < n) q_out[(out_row + (i64)t * value_heads) * KD + x] = round_tf32(acc[q][i]);
            }
    }
    {
        float acc[VH][4];
#pragma unroll
        for (int q = 0; q < VH; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
        for (int k0 = 0; k0 < r0 + 16; k0 += 8) {
            unsigned int a[4];
            frag_a<true>(a, P, CS, r0, k0, g, c);
#pragma unroll
            for (int q = 0; q < VH; ++q) {
                const int n0 = 8 * (VH * h2 + q);
                if (n0 < 8 * vtiles) {
                    unsigned int b[2];
                    frag_b(b, V, VS, k0, n0, g, c);
                    mma_tf32(acc[q], a, b[0], b[1]);
                }
            }
        }
#pragma unroll
        for (int q = 0; q < VH; ++q)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int t = r0 + g + (i >= 2 ? 8 : 0), j = 8 * (VH * h2 + q) + 2 * c + (i & 1);
                if (j < 8 * vtiles && t < n && j < value_dim)
                    o_out[(out_row + (i64)t * value_heads) * value_dim + j] = acc[q][i];
            }
    }
    if (tid == 0) last_decay[chunk * value_heads + h] = expf(G[n - 1]);
}

// GDN_SCAN_PIPELINE (default 1 where a block may have the shared memory, backend.rs; =0 in
// DELTASERVE_CUDA_DEFINES turns it off) has the scan load
// the next chunk's operands while it computes the current one: W, Q' and O0 (read only by the U/O
// products) while the state update runs, K (read only by the update) while the next U/O products
// run, and U0 into a second buffer. The same products in the same order, so bit for bit the
// sequential scan; Nsight Compute had it latency-bound (349 us a layer of a 27B prefill of 2048,
// DRAM 9-18 %, session 6), each chunk waiting for its 128 KB before any product.
#ifndef GDN_SCAN_PIPELINE
#define GDN_SCAN_PIPELINE 1
#endif
// A scan block's shared memory leaves room for one block an SM; saying so lets ptxas give the
// pipelined scan the registers it needs (96 for key dim 128, where left to itself it stopped at 64
// and spilled). The sequential scan keeps the bounds it was measured with.
#if GDN_SCAN_PIPELINE
#define SCAN_BOUNDS __launch_bounds__(SCAN_WARPS * 32, 1)
#else
#define SCAN_BOUNDS __launch_bounds__(SCAN_WARPS * 32)
#endif

// Floats of dynamic shared memory `gdn_chunk_scan` needs for key dim KD (gdn.rs mirrors this): the
// state slice, W, Q', K and U (twice when pipelined) and O0.
#define SCAN_SMEM_FLOATS(KD)                                                                 \
    ((KD) * (GDN_SLICE + 8) + 2 * GDN_CHUNK * ((KD) + 4) + GDN_CHUNK * ((KD) + 8) + \
     (2 + GDN_SCAN_PIPELINE) * GDN_CHUNK * (GDN_SLICE + 8))

// The scan's view of one chunk: its rows, their count and the record of its first row and head in
// the workspace.
struct ScanChunk {
    int first, n;
    i64 rec;
};

__device__ __forceinline__ ScanChunk scan_chunk(const int* chunks, int chunk, int row0, int value_heads, int h) {
    ScanChunk k;
    k.first = chunks[2 * chunk];
    k.n = chunks[2 * chunk + 1];
    k.rec = (i64)(k.first - row0) * value_heads + h;
    return k;
}

// Copies in flight (not committed) of a chunk's rows of a [rows][width] workspace record set into
// shared rows of stride `ld`, zeros past the chunk's end (and past `cols` columns).
template <int WIDTH, int THREADS>
__device__ __forceinline__ void scan_copy(float* dst, int ld, const float* src, const ScanChunk& k, int value_heads,
                                          int stride, int col0, int cols, int tid) {
    for (int i = tid; i < GDN_CHUNK * WIDTH / 4; i += THREADS) {
        const int t = i / (WIDTH / 4), x = 4 * (i % (WIDTH / 4));
        const bool valid = t < k.n && x < cols;
        const i64 at = valid ? (k.rec + (i64)t * value_heads) * stride + col0 + x : 0;
        copy16_async(dst + t * ld + x, src + at, valid);
    }
}

__device__ __forceinline__ void commit_async_copies() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void wait_async_groups() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// U = U0 - W S0 and O = O0 + Q' S0 for the chunk (W and Q' hold TF32 values; S0 is rounded here):
// U back into U (rounded to TF32 for the update), O to `out`. Warp w takes row block w % 4 and
// column tiles 2 (w / 4), 2 (w / 4) + 1.
template <int KD>
__device__ __forceinline__ void scan_products(const float* S, const float* Ws, const float* Qs, float* U,
                                              const float* Os, const ScanChunk& k, float* out, int h,
                                              int value_heads, int value_dim, int col0, int cols, int warp,
                                              int g, int c) {
    constexpr int KS = KD + 4, SS = GDN_SLICE + 8;
    const int r0 = 16 * (warp & 3), nb = 2 * (warp >> 2);
    float u[2][4], o[2][4];
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int t = r0 + g + (i >= 2 ? 8 : 0), j = 8 * (nb + q) + 2 * c + (i & 1);
            u[q][i] = U[t * SS + j];
            o[q][i] = Os[t * SS + j];
        }
#pragma unroll 4
    for (int k0 = 0; k0 < KD; k0 += 8) {
        unsigned int aw[4], aq[4];
        frag_a<true>(aw, Ws, KS, r0, k0, g, c, -1.0f);
        frag_a<true>(aq, Qs, KS, r0, k0, g, c);
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const unsigned int b0 = to_tf32(S[(k0 + c) * SS + 8 * (nb + q) + g]);
            const unsigned int b1 = to_tf32(S[(k0 + c + 4) * SS + 8 * (nb + q) + g]);
            mma_tf32(u[q], aw, b0, b1);
            mma_tf32(o[q], aq, b0, b1);
        }
    }
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int t = r0 + g + (i >= 2 ? 8 : 0), j = 8 * (nb + q) + 2 * c + (i & 1);
            U[t * SS + j] = round_tf32(u[q][i]);
            if (t < k.n && j < cols) out[((i64)(k.first + t) * value_heads + h) * value_dim + col0 + j] = o[q][i];
        }
}

// S = decay S0 + Kd^T U (Kd and U hold TF32 values).
template <int KD>
__device__ __forceinline__ void scan_update(float* S, const float* Ks, const float* U, float decay, int warp, int g,
                                            int c) {
    constexpr int C = GDN_CHUNK, KTS = KD + 8, SS = GDN_SLICE + 8;
    constexpr int MT = KD / 16, NT = GDN_SLICE / 8;
    for (int tile = warp; tile < MT * NT; tile += SCAN_WARPS) {
        const int m0 = 16 * (tile / NT), n0 = 8 * (tile % NT);
        float acc[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = decay * S[(m0 + g + (i >= 2 ? 8 : 0)) * SS + n0 + 2 * c + (i & 1)];
#pragma unroll
        for (int k0 = 0; k0 < C; k0 += 8) {
            unsigned int a[4], b[2];
            frag_a_t(a, Ks, KTS, m0, k0, g, c);
            frag_b(b, U, SS, k0, n0, g, c);
            mma_tf32(acc, a, b[0], b[1]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) S[(m0 + g + (i >= 2 ? 8 : 0)) * SS + n0 + 2 * c + (i & 1)] = acc[i];
    }
}

// One block per (value head, piece piece_base + blockIdx.y, GDN_SLICE-column slice of the state):
// the piece's chunks in order. pieces [n_pieces, 4] = (first chunk, chunk count, state slot, unused);
// a piece is a run of one sequence's new tokens, its chunks consecutive in `chunks`.
template <int KD>
__device__ void chunk_scan(const float* __restrict__ w_in, const float* __restrict__ q_in,
                           const float* __restrict__ k_in, const float* __restrict__ u_in,
                           const float* __restrict__ o_in, const float* __restrict__ last_decay,
                           const int* __restrict__ chunks, const int* __restrict__ pieces, float* ssm, float* out,
                           int piece_base, int row0, int value_heads, int value_dim) {
    constexpr int C = GDN_CHUNK, SV = GDN_SLICE, KS = KD + 4, KTS = KD + 8, SS = SV + 8;
    constexpr int THREADS = SCAN_WARPS * 32;
    extern __shared__ __align__(16) float scan_smem[];
    float* S = scan_smem;     // [KD][SS]: this block's columns of the state
    float* Ws = S + KD * SS;  // [C][KS]
    float* Qs = Ws + C * KS;  // [C][KS]
    float* Ks = Qs + C * KS;  // [C][KTS]
    float* Os = Ks + C * KTS;  // [C][SS]: O0
    // U buffer b (0, and 1 when pipelined): [C][SS], U0, then U.
#define u_buffer(B) (Os + (1 + (B)) * C * SS)

    const int h = blockIdx.x;
    const int* piece = pieces + 4 * (piece_base + blockIdx.y);
    const int first_chunk = piece[0], count = piece[1], slot = piece[2];
    const int col0 = blockIdx.z * SV, cols = min(SV, value_dim - col0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    float* state = ssm + ((i64)slot * value_heads + h) * KD * value_dim;

    for (int i = tid; i < KD * SV; i += THREADS) {
        const int x = i / SV, j = i % SV;
        S[x * SS + j] = j < cols ? state[(i64)x * value_dim + col0 + j] : 0.0f;
    }
    // What the U/O products read (W, Q', O0 and U0 into U buffer `buf`), and what the update reads (K).
#define LOAD_PRODUCTS(K, BUF)                                                                      \
    do {                                                                                           \
        scan_copy<KD, THREADS>(Ws, KS, w_in, K, value_heads, KD, 0, KD, tid);                      \
        scan_copy<KD, THREADS>(Qs, KS, q_in, K, value_heads, KD, 0, KD, tid);                      \
        scan_copy<SV, THREADS>(u_buffer(BUF), SS, u_in, K, value_heads, value_dim, col0, cols, tid); \
        scan_copy<SV, THREADS>(Os, SS, o_in, K, value_heads, value_dim, col0, cols, tid);          \
    } while (0)
#define LOAD_UPDATE(K) scan_copy<KD, THREADS>(Ks, KTS, k_in, K, value_heads, KD, 0, KD, tid)
    if (GDN_SCAN_PIPELINE && count > 0) {
        const ScanChunk k = scan_chunk(chunks, first_chunk, row0, value_heads, h);
        LOAD_PRODUCTS(k, 0);
        commit_async_copies();
        LOAD_UPDATE(k);
        commit_async_copies();
    }
    for (int ci = 0; ci < count; ++ci) {
        const int chunk = first_chunk + ci, buf = GDN_SCAN_PIPELINE ? ci & 1 : 0;
        const ScanChunk k = scan_chunk(chunks, chunk, row0, value_heads, h);
        if (GDN_SCAN_PIPELINE) {
            wait_async_groups<1>();  // this chunk's product operands; its K may still be in flight
        } else {
            LOAD_PRODUCTS(k, 0);
            LOAD_UPDATE(k);
            wait_async_copies();
        }
        __syncthreads();
        scan_products<KD>(S, Ws, Qs, u_buffer(buf), Os, k, out, h, value_heads, value_dim, col0, cols, warp, g, c);
        if (GDN_SCAN_PIPELINE) wait_async_groups<0>();  // this chunk's K
        __syncthreads();
        const bool next = GDN_SCAN_PIPELINE && ci + 1 < count;
        const ScanChunk after = next ? scan_chunk(chunks, chunk + 1, row0, value_heads, h) : k;
        if (next) {
            // W, Q' and O0 are free once every warp has done its products; U0 goes to the other buffer.
            LOAD_PRODUCTS(after, buf ^ 1);
            commit_async_copies();
        }
        scan_update<KD>(S, Ks, u_buffer(buf), last_decay[chunk * value_heads + h], warp, g, c);
        __syncthreads();
        if (next) {
            LOAD_UPDATE(after);  // K is free once every warp has done its update
            commit_async_copies();
        }
    }
    for (int i = tid; i < KD * SV; i += THREADS) {
        const int x = i / SV, j = i % SV;
        if (j < cols) state[(i64)x * value_dim + col0 + j] = S[x * SS + j];
    }
}
#undef LOAD_PRODUCTS
#undef LOAD_UPDATE
#undef u_buffer

#define GDN_CHUNK_KERNELS(KD)                                                                                    \
    extern "C" __global__ void __launch_bounds__(PREP_WARPS * 32) gdn_chunk_prepare_k##KD(                      \
        const float* mixed, const float* g, const float* beta, const int* chunks, float* w_out, float* q_out,   \
        float* k_out, float* u_out, float* o_out, float* last_decay, int chunk_base, int row0, int key_heads,   \
        int value_heads, int value_dim) {                                                                        \
        AFTER_PREVIOUS_KERNEL();                                                                                 \
        chunk_prepare<KD>(mixed, g, beta, chunks, w_out, q_out, k_out, u_out, o_out, last_decay, chunk_base,    \
                          row0, key_heads, value_heads, value_dim);                                              \
    }                                                                                                            \
    extern "C" __global__ void SCAN_BOUNDS gdn_chunk_scan_k##KD(                         \
        const float* w_in, const float* q_in, const float* k_in, const float* u_in, const float* o_in,          \
        const float* last_decay, const int* chunks, const int* pieces, float* ssm, float* out, int piece_base,  \
        int row0, int value_heads, int value_dim) {                                                              \
        AFTER_PREVIOUS_KERNEL();                                                                                 \
        chunk_scan<KD>(w_in, q_in, k_in, u_in, o_in, last_decay, chunks, pieces, ssm, out, piece_base, row0,    \
                       value_heads, value_dim);                                                                  \
    }
GDN_CHUNK_KERNELS(16)
GDN_CHUNK_KERNELS(32)
GDN_CHUNK_KERNELS(64)
GDN_CHUNK_KERNELS(128)
