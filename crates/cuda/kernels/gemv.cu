// Skinny GEMM for decode: out_m [T, N_m] = xb [T, K] @ W_m [N_m, K]^T for up to GEMV_MATRICES bf16
// weight matrices that share the input, in one launch, for T <= 8 * GEMV_MAX_TOKEN_TILES rows. The
// tensor-core kernel reads xb, the activations already rounded to bf16 (`cast_f32_to_bf16`, as the
// cuBLAS path does); the CUDA-core kernel for up to 4 rows rounds the f32 activations itself.
//
// Decode reads every weight once per step, so this is a bandwidth kernel; it runs on the tensor
// cores only so that the multiply-adds cost almost no instructions. A block owns 16 consecutive
// output rows (of the group's concatenated rows); its GEMV_WARPS warps split K in interleaved
// GEMV_CHUNK-column pieces and stream them with 16-byte loads, a whole piece's weight and
// activation loads in flight before the first `mma.m16n8k16` (bf16 in, f32 accumulate). Each piece
// is summed on the tensor cores from zero and added to the warp's f32 total (the tensor cores'
// accumulation is exact enough over 128 columns, not over 17k); the warps' totals are added in warp
// order through shared memory. Nothing in that order depends on T (more tokens only fill more
// columns of the same products), so a row's result does not depend on what else is batched.
//
// K order inside a 32-column step: thread (group g = lane / 4, c = lane % 4) loads columns
// 8c .. 8c+7 of rows g and g + 8 (and of token g). The mma's k index j in {2c, 2c+1, 2c+8, 2c+9} is
// mapped to columns 8c + {0, 1, 2, 3} in the first mma and 8c + {4, 5, 6, 7} in the second, for the
// weights and the activations alike: the sum over k is the same sum, each column once.

#define GEMV_MATRICES 4
#define GEMV_MAX_TOKEN_TILES 1
#ifndef GEMV_WARPS
#define GEMV_WARPS 8
#endif
// 32-column mma steps per piece, and the piece's width. Measured on the H200 (gate/up 2x17408x5120,
// down 5120x17408, one token): 1 step 3.27 / 3.07 TB/s, 2 steps 3.08 / 2.97, 4 steps 2.41 / 2.20;
// 4, 8 or 16 warps per block change it by less (docs/benchmarks.md).
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 1
#endif
#define GEMV_CHUNK (32 * GEMV_UNROLL)

struct GemvGroup {
    const bf16_bits* w[GEMV_MATRICES];  // block-FP8 codes for the gemv_fp8 kernels
    float* out[GEMV_MATRICES];
    // Block-FP8 scales [ceil(rows/128), ceil(k/128)] of matrix m (gemv_fp8 kernels only).
    const float* scale[GEMV_MATRICES];
    // First global row of matrix m; first_row[count] is the total number of rows.
    int first_row[GEMV_MATRICES + 1];
    int count;
};

// The group's per-matrix fields are picked by compare-and-select over the GEMV_MATRICES constant
// indices, never indexed by a runtime matrix number: indexing made the compiler copy the whole
// by-value parameter to local memory first (120 bytes a thread, stored and reloaded in the prologue
// of every warp; 27B FP8 decode on the H200, session 14: 91.1 tok/s with the copy, 94.0 without).
template <typename T>
__device__ __forceinline__ T group_pick(const T* field, int m) {
    T picked = field[0];
#pragma unroll
    for (int i = 1; i < GEMV_MATRICES; ++i) picked = m == i ? field[i] : picked;
    return picked;
}

// Rows of matrix m of the group.
__device__ __forceinline__ int group_rows(const GemvGroup& group, int m) {
    return group_pick(group.first_row + 1, m) - group_pick(group.first_row, m);
}

// The matrix holding global row `row` of the group and the row's index in it; -1 past the end.
__device__ __forceinline__ int group_row(const GemvGroup& group, int row, int* local) {
    int m = -1, first = 0;
#pragma unroll
    for (int i = 0; i < GEMV_MATRICES; ++i) {
        if (i < group.count && row >= group.first_row[i] && row < group.first_row[i + 1]) {
            m = i;
            first = group.first_row[i];
        }
    }
    *local = row - first;
    return m;
}

template <int TILES>
__device__ __forceinline__ void gemv_block(const GemvGroup& group, const bf16_bits* __restrict__ xb, int tokens, int k) {
    __shared__ float totals[GEMV_WARPS][TILES * 4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int first = blockIdx.x * 16;
    int local_lo = 0, local_hi = 0;
    const int m_lo = group_row(group, first + g, &local_lo);
    const int m_hi = group_row(group, first + g + 8, &local_hi);
    const bf16_bits* w_lo = m_lo >= 0 ? group_pick(group.w, m_lo) + (i64)local_lo * k : nullptr;
    const bf16_bits* w_hi = m_hi >= 0 ? group_pick(group.w, m_hi) + (i64)local_hi * k : nullptr;

    float acc[TILES][4];
#pragma unroll
    for (int t = 0; t < TILES; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;

    for (int base = warp * GEMV_CHUNK; base < k; base += GEMV_WARPS * GEMV_CHUNK) {
        uint4 wa[GEMV_UNROLL], wb[GEMV_UNROLL], xv[TILES][GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int col = base + 32 * u + 8 * c;
            const bool in = col < k;
            wa[u] = (in && w_lo) ? load_streaming(w_lo + col) : make_uint4(0u, 0u, 0u, 0u);
            wb[u] = (in && w_hi) ? load_streaming(w_hi + col) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int t = 0; t < TILES; ++t) {
                const int token = 8 * t + g;
                xv[t][u] = (in && token < tokens) ? *(const uint4*)(xb + (i64)token * k + col)
                                                  : make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
            float piece[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                mma_bf16(piece, wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv[t][u].x, xv[t][u].y);
                mma_bf16(piece, wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv[t][u].z, xv[t][u].w);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[t][i] += piece[i];
        }
    }
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) totals[warp][4 * t + i][lane] = acc[t][i];
    __syncthreads();
    if (warp != 0) return;
    // acc[t]: rows g (0, 1) and g + 8 (2, 3) of the block's 16, tokens 8t + 2c and 8t + 2c + 1.
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float sum = 0.0f;
            for (int w = 0; w < GEMV_WARPS; ++w) sum += totals[w][4 * t + i][lane];
            const int token = 8 * t + 2 * c + (i & 1);
            const int m = i < 2 ? m_lo : m_hi;
            if (m < 0 || token >= tokens) continue;
            group_pick(group.out, m)[(i64)token * group_rows(group, m) + (i < 2 ? local_lo : local_hi)] = sum;
        }
    }
}

// Up to GEMV_LANE_TOKENS tokens on the CUDA cores: each warp owns ROWS rows and reads
// each row in 512-byte sweeps (lane l takes 16-byte vector l, l + 32, ...; whole cache lines per
// instruction, as the memory system likes best), GEMV_LANE_UNROLL sweeps in flight; the f32
// activations come from L1/L2, shared by the warps of an SM. One token rounds its f32 activations to
// bf16 on the way in (no cast launch); two to four tokens read them already rounded (the rounding of
// every token on every weight vector made a four-token verify twice a one-token step on the H200).
// Each lane sums its vectors in order and
// the warp reduces by butterfly: the same order for every token count up to GEMV_LANE_TOKENS, so a
// one-token decode and a four-token verify compute a row bit for bit alike.
#define GEMV_LANE_TOKENS 4
// Rows a warp owns: more rows share each activation load. Measured on the H200 (27B shape, one-token
// decode, tok/s end to end): 2 rows 61.3-61.5, 4 rows 63.6 (twice), 8 rows (2 sweeps in flight) 62.8.
// Two to four tokens keep 2 (their activation loads are already shared by the tokens' weights).
#ifndef GEMV_LANE_ROWS
#define GEMV_LANE_ROWS 4
#endif
#ifndef GEMV_LANE_ROWS_MULTI
#define GEMV_LANE_ROWS_MULTI 2
#endif
// Warps per block here. Measured on the H200 (gate/up, down; one token / four tokens): 4 warps with 4
// sweeps in flight 3.67 / 3.56 and 3.47 / 3.21 TB/s; 8 warps with 8 sweeps 3.64 / 3.56 and 3.06 / 2.96.
#ifndef GEMV_LANE_WARPS
#define GEMV_LANE_WARPS 4
#endif
// Sweeps a lane has in flight per register buffer (two buffers with GEMV_LANE_PIPELINE). Measured on
// the H200 (27B shape, one-token decode, tok/s in one call): 4 sweeps unpipelined 62.0, 2 sweeps
// pipelined 63.9, 1 sweep pipelined 62.9.
#ifndef GEMV_LANE_UNROLL
#define GEMV_LANE_UNROLL 2
#endif

// The lane kernels' iterations that lie wholly inside the rows run without per-load and per-vector
// bounds: the FP8 one-token loop spent ~176 of its 504 instructions per 128 weights a lane on
// addresses, predicates and their descriptors (403 without). H200, one call (session 15): 27B FP8
// decode 101.0 -> 104.4 tok/s, bf16 68.2 -> 69.9, 9B 194.2 -> 202.5. GEMV_LANE_UNCHECKED=0: every
// iteration bounded (the tests' reference for the unbounded loop).
#ifndef GEMV_LANE_UNCHECKED
#define GEMV_LANE_UNCHECKED 1
#endif
// The second loop takes the FP8 one-token kernel from 96 to 138 registers (ptxas, sm_90), which
// would cut it from 5 blocks an SM to 3: held to the 5 it has.
#if GEMV_LANE_UNCHECKED
#define FP8_LANE_BOUNDS __launch_bounds__(32 * GEMV_LANE_WARPS, 5)
#else
#define FP8_LANE_BOUNDS __launch_bounds__(32 * GEMV_LANE_WARPS)
#endif

// With GEMV_LANE_PIPELINE a lane issues the loads of its next GEMV_LANE_UNROLL sweeps before it
// multiplies the current ones (two register buffers), so a warp always has loads in flight instead
// of waiting for a whole batch of them after each batch of multiply-adds.
#ifndef GEMV_LANE_PIPELINE
#define GEMV_LANE_PIPELINE 1
#endif

// With GEMV_FP8_DIAG the one-token FP8 lane kernels multiply on the FP8 tensor cores, in the
// lane kernels' own 512-byte sweeps, with the activations quantized in the kernel as the W8A8
// kernels' are (1 x 128 groups, scale amax / 448, here codes of x times the scale's reciprocal).
// The CUDA-core form issues ~3.8 instructions a weight and is issue-bound at 2.8-3.5 TB/s where the
// bf16 lane kernels stream at 3.7-4.1. A warp's rows go in pairs through `mma.m16n8k32` (e4m3 in,
// f32 out): lane (g = lane / 4, c = lane % 4) puts 8 codes of its vector of the pair's first row in
// the A operand's row g and the same columns of the second row in row g + 8, and its 8 activation
// codes of those columns in the B operand's column g, so entries (g, g) and (g + 8, g) of the product
// are quad g's 64-column pieces of the two rows' dot products (the other entries are cross products
// nobody reads). Those pieces lie in one 128-column block of the weights' and the activations'
// scales, so the quad's owner lane (c = g / 2, which holds both entries) scales them and keeps the
// sums; the butterfly at the end adds the 8 owners' sums. A lane's 16 activations share their
// group with the 7 lanes beside it (8 lanes cover 128 columns), so the group's amax takes three
// shuffles. (A first form widened the codes to f16 for `mma.m16n8k16`: four mma a vector and row
// pair, 27B FP8 decode 82.5-82.7 against 85.3 tok/s on an H100, session 26.)
#ifndef GEMV_FP8_DIAG
#define GEMV_FP8_DIAG 0
#endif
#if GEMV_FP8_DIAG && __CUDA_ARCH__ < 890  // no FP8 tensor cores: the CUDA-core form
#undef GEMV_FP8_DIAG
#define GEMV_FP8_DIAG 0
#endif
// GEMV_BF16_DIAG: the bf16 lane kernels (1-4 tokens, all row counts, the narrow and the paired
// forms alike, so that a one-token decode and a four-token verify still compute a row bit for bit
// alike) in the same arrangement: the weights go to the mma as they are (bf16 pairs) and the
// activations as the bf16 pairs the kernels read or round them to, one mma a token per 8 weights of
// a row pair, instead of ~3 instructions a weight and token on the CUDA cores. A quad's pieces are
// its 32 columns of a sweep, added to the owner's f32 sums sweep by sweep. A different summation
// order than the CUDA-core form (a row's value moves within f32 rounding), the same for every
// token count.
#ifndef GEMV_BF16_DIAG
#define GEMV_BF16_DIAG 0
#endif

// d (16 x 8) += a (16 x 32) * b (32 x 8), e4m3 in, f32 accumulate (sm_89 on). Fragments: thread
// (g = lane / 4, c = lane % 4) holds four codes a word: a0 / a1 rows g / g + 8 at k 4c .. 4c + 3, a2 /
// a3 the same rows at k 16 + 4c ..; b0 / b1 column g at k 4c .. and 16 + 4c ..; d as in mma_bf16.
__device__ __forceinline__ void mma_e4m3(float* d, unsigned int a0, unsigned int a1, unsigned int a2, unsigned int a3,
                                         unsigned int b0, unsigned int b1) {
#if __CUDA_ARCH__ >= 890
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap();  // the launcher takes this path only from compute capability 8.9 on
#endif
}

// Four f32 values as e4m3 codes (nearest even, saturated to +-448), the first in the lowest byte.
__device__ __forceinline__ unsigned int e4m3x4_from_f32(float x0, float x1, float x2, float x3) {
    unsigned int r = 0;
#if __CUDA_ARCH__ >= 890
    asm("{\n\t.reg .b16 lo, hi;\n\tcvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\tmov.b32 %0, {lo, hi};\n\t}"
        : "=r"(r)
        : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
#else
    __trap();
#endif
    return r;
}

// GEMV_BF16_SETS: the bf16 lane kernels of 2-4 tokens (narrow, plain and paired alike) with every
// mma serving up to four tokens; one token takes GEMV_BF16_DIAG's form, whose sums these equal bit
// for bit. The diagonal form uses one eighth of each mma: quad g's activations can only meet quad
// g's own weights, since every quad holds other columns. Here the 8 quads of a warp form two sets
// of 4 (quads 0-3, 4-7) whose quads hold the same columns of different rows, and quad m of a set
// carries token m's activations of those columns as its B column: entry (g, 4s + t) of the product
// is row g's piece for token t, for every quad g of set s, so one mma gives the pieces of up to 4
// tokens. A set covers 64 bytes of a row a sweep, so the block's warps split the row's vectors
// between them (lane c of set s of warp w takes the vectors 8w + 4s + c + 32i: the columns of the
// diagonal form's quad 2w + s, the same 512-byte sweeps over the block), and every warp holds all
// of the block's rows: quad m of each set the rows m, m + 4, m + 8, ... (as mma row pairs). The grid
// and the rows a block covers are the lane kernels'. Each piece is the diagonal form's (the same
// 16 products in the same mma k positions, added to f32 sums sweep by sweep), and the pieces are
// added in its butterfly's order (below), so a row's value does not depend on the token count or
// on the launch being narrow: a one-token decode and a four-token verify compute it alike. Measured
// on an H100 (session 27, this form for 1-4 tokens): 27B MTP k=3 +2.8 %, 35B-A3B +4.4 %, 9B +3 %,
// but one-token decode 1.4-3 % slower than the CUDA cores, where the diagonal form was 2.4-3.3 %
// faster; hence the diagonal form for one token. So split (session 28, H100, against the CUDA
// cores in the same call): decode +2.1-3.1 %, MTP k=3 +2.5-5.6 % on the three bf16 shapes; the
// default since. GEMV_BF16_SETS=0 keeps the CUDA-core form for 1-4 bf16 tokens.
#ifndef GEMV_BF16_SETS
#define GEMV_BF16_SETS 1
#endif

template <int T, bool ROUNDED_X, int ROWS, int UNROLL, bool PAIRED>
__device__ __forceinline__ void gemv_bf16_sets(const GemvGroup& group, const void* __restrict__ x, int k) {
    constexpr int WARPS = GEMV_LANE_WARPS;
    static_assert(WARPS == 4, "the sums equal the diagonal form's for 4 warps (8 quads) a block");
    constexpr int BLOCK_ROWS = ROWS * WARPS;
    static_assert(BLOCK_ROWS % 4 == 0, "each quad of a set holds as many rows as the others");
    constexpr int QUAD_ROWS = BLOCK_ROWS / 4;
    constexpr int HALF = BLOCK_ROWS / 2;  // PAIRED: gate rows, then the up rows of the same indices
    constexpr int ROW_LANES = 8 * WARPS;  // lanes of the block that split a row's vectors
    constexpr int STEP = ROW_LANES * UNROLL;
    __shared__ float partial[WARPS][BLOCK_ROWS][T];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = lane & 3, set = lane >> 4, member = (lane >> 2) & 3;
    const int row_lane = 8 * warp + 4 * set + c;
    const int first = blockIdx.x * (PAIRED ? HALF : BLOCK_ROWS);
    auto locate = [&](int b, int* local) {
        if (PAIRED) {
            *local = first + b % HALF;
            return *local < group.first_row[1] ? b / HALF : -1;
        }
        return group_row(group, first + b, local);
    };
    int local[QUAD_ROWS], mat[QUAD_ROWS];
    const unsigned char* w[QUAD_ROWS];
#pragma unroll
    for (int r = 0; r < QUAD_ROWS; ++r) {
        mat[r] = locate(member + 4 * r, &local[r]);
        w[r] = mat[r] >= 0 ? (const unsigned char*)group_pick(group.w, mat[r]) + (i64)local[r] * k * 2 : nullptr;
    }
    int last_local;
    const bool whole_block = locate(BLOCK_ROWS - 1, &last_local) >= 0;
    let_next_kernel_start();
    float acc[QUAD_ROWS][2];
#pragma unroll
    for (int r = 0; r < QUAD_ROWS; ++r) acc[r][0] = acc[r][1] = 0.0f;
    const int vecs = k / 8;
    const bool carries = member < T;  // this quad's B column is token `member`'s

    auto load = [&](uint4 (&wv)[QUAD_ROWS][UNROLL], int base, bool checked) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int v = base + ROW_LANES * u;
#pragma unroll
            for (int r = 0; r < QUAD_ROWS; ++r)
                wv[r][u] = (!checked || (v < vecs && w[r])) ? load_streaming((const bf16_bits*)(w[r] + 16 * v))
                                                             : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    // Lane c of quad g holds entries (g, 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1): in set s,
    // lanes c = 2s and 2s + 1 hold tokens 2(c - 2s) and 2(c - 2s) + 1 of the quad's row pair. Every
    // lane adds its entries (the others' sums are never read).
    auto multiply = [&](const uint4 (&wv)[QUAD_ROWS][UNROLL], int base, bool checked) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int v = base + ROW_LANES * u;
            const bool in = (!checked || v < vecs) && carries;
            unsigned int xw[4];
            if (ROUNDED_X) {
                const uint4 q = in ? *reinterpret_cast<const uint4*>(static_cast<const bf16_bits*>(x) +
                                                                     (i64)member * k + 8 * (i64)v)
                                   : make_uint4(0u, 0u, 0u, 0u);
                xw[0] = q.x; xw[1] = q.y; xw[2] = q.z; xw[3] = q.w;
            } else {
                load_bf16_pairs8(static_cast<const float*>(x) + 8 * (i64)v, in, xw);
            }
#pragma unroll
            for (int p = 0; p < (QUAD_ROWS + 1) / 2; ++p) {
                const bool partner = 2 * p + 1 < QUAD_ROWS;
                const uint4 second = partner ? wv[(2 * p + 1) % QUAD_ROWS][u] : make_uint4(0u, 0u, 0u, 0u);
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_bf16_row_pair(d, wv[2 * p][u], second, xw);
                acc[2 * p][0] += d[0];
                if (T > 1) acc[2 * p][1] += d[1];
                if (partner) {
                    acc[(2 * p + 1) % QUAD_ROWS][0] += d[2];
                    if (T > 1) acc[(2 * p + 1) % QUAD_ROWS][1] += d[3];
                }
            }
        }
    };

    uint4 wa[QUAD_ROWS][UNROLL], wb[QUAD_ROWS][UNROLL];
    load(wa, row_lane, true);
    wait_for_previous_kernel();
    int base = row_lane;
    // The sweep's first vector (base - row_lane) is the same for the whole block, so every warp
    // runs whole iterations together (the mma is warp-wide).
    if (GEMV_LANE_UNCHECKED && whole_block) {
        for (; base - row_lane + 3 * STEP <= vecs; base += 2 * STEP) {
            load(wb, base + STEP, false);
            multiply(wa, base, false);
            load(wa, base + 2 * STEP, false);
            multiply(wb, base + STEP, false);
        }
    }
    for (; base - row_lane < vecs; base += 2 * STEP) {
        load(wb, base + STEP, true);
        multiply(wa, base, true);
        load(wa, base + 2 * STEP, true);
        multiply(wb, base + STEP, true);
    }
    // Set 1's holder of a row and token is set 0's lane + 18 (quad + 4, c + 2).
    const bool holder = set == 0 && c < 2;
#pragma unroll
    for (int r = 0; r < QUAD_ROWS; ++r) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float sum = acc[r][e] + __shfl_down_sync(0xffffffffu, acc[r][e], 18);
            const int t = 2 * c + e;
            if (holder && t < T) partial[warp][member + 4 * r][t] = sum;
        }
    }
    __syncthreads();
    const int id = threadIdx.x;
    if (id >= (PAIRED ? HALF : BLOCK_ROWS) * T) return;
    const int b = id / T, t = id % T;
    // The diagonal form's butterfly adds its 8 quads' sums as ((q0 + q1) + (q4 + q5)) + ((q2 + q3)
    // + (q6 + q7)); quad q's columns are set q % 2 of warp q / 2 here, so warp w's sum is
    // q(2w) + q(2w + 1) and the same order is (W0 + W2) + (W1 + W3).
    auto warps_sum = [&](int row) {
        return (partial[0][row][t] + partial[2][row][t]) + (partial[1][row][t] + partial[3][row][t]);
    };
    int out_local;
    const int m = locate(b, &out_local);
    if (m < 0) return;
    if (PAIRED) {
        group.out[0][(i64)t * group.first_row[1] + out_local] = silu_f(warps_sum(b)) * warps_sum(b + HALF);
    } else {
        group_pick(group.out, m)[(i64)t * group_rows(group, m) + out_local] = warps_sum(b);
    }
}

// PAIRED: the group is [gate, up] of equal shape and out[0] receives silu(x gate^T) * (x up^T). A
// warp's first ROWS / 2 rows are gate rows and the others the up rows of the same indices, so the
// activation is applied in the epilogue; each row's sum is the unpaired kernel's, bit for bit.
template <int T, bool ROUNDED_X, int ROWS, int FORMAT, int UNROLL, bool PAIRED>
__device__ __forceinline__ void gemv_lanes(const GemvGroup& group, const void* __restrict__ x, int k) {
    if constexpr (GEMV_BF16_SETS && FORMAT == WEIGHTS_BF16 && T > 1) {
        gemv_bf16_sets<T, ROUNDED_X, ROWS, UNROLL, PAIRED>(group, x, k);
        return;
    }
    constexpr int VALUES = weights_per_vector<FORMAT>();
    constexpr int ROW_BYTES_PER_VALUE = weight_bytes<FORMAT>();
    constexpr int HALF = PAIRED ? ROWS / 2 : ROWS;
    static_assert(!PAIRED || ROWS % 2 == 0, "a paired warp holds as many up rows as gate rows");
    constexpr bool DIAG = GEMV_FP8_DIAG && FORMAT == WEIGHTS_FP8 && T == 1;
    static_assert(!DIAG || ROWS % 2 == 0, "the tensor-core form takes a warp's rows in pairs");
    constexpr bool BF16_DIAG = (GEMV_BF16_DIAG || (GEMV_BF16_SETS && T == 1)) && FORMAT == WEIGHTS_BF16;
    // The tensor-core forms run a warp's iterations together (the mma is warp-wide).
    constexpr bool WARP_UNIFORM = DIAG || BF16_DIAG;
    const int lane = threadIdx.x & 31;
    const int first = (blockIdx.x * GEMV_LANE_WARPS + (threadIdx.x >> 5)) * HALF;
    const int scale_cols = (k + 127) / 128;
    int local[ROWS], mat[ROWS];
    const unsigned char* w[ROWS];
    const float* scale_row[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        if (PAIRED) {
            local[r] = first + r % HALF;
            mat[r] = local[r] < group.first_row[1] ? r / HALF : -1;
        } else {
            mat[r] = group_row(group, first + r, &local[r]);
        }
        w[r] = mat[r] >= 0 ? (const unsigned char*)group_pick(group.w, mat[r]) + (i64)local[r] * k * ROW_BYTES_PER_VALUE
                           : nullptr;
        scale_row[r] = (FORMAT == WEIGHTS_FP8 && mat[r] >= 0)
                           ? group_pick(group.scale, mat[r]) + (i64)(local[r] / 128) * scale_cols
                           : nullptr;
    }
    let_next_kernel_start();
    if (mat[0] < 0) {  // every row of this warp is past the end (rows are in order)
        wait_for_previous_kernel();
        return;
    }
    float acc[ROWS][T];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
    const int vecs = k / VALUES;
    constexpr int STEP = 32 * UNROLL;

    // `checked`: vectors past the row's end and rows past the group's may occur (always a
    // constant where called, so each call site compiles to one form).
    auto load = [&](uint4 (&wv)[ROWS][UNROLL], int base, bool checked) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int v = base + 32 * u;
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                wv[r][u] = (!checked || (v < vecs && w[r])) ? load_streaming((const bf16_bits*)(w[r] + 16 * v))
                                                             : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    // GEMV_FP8_DIAG's multiply (above gemv_lanes). Every lane of the warp runs it (the mma is
    // warp-wide): vectors past the row's end have zero weights (load) and zero activations here.
    const bool owner = diag_owner(lane);
    auto multiply_diag = [&](const uint4 (&wv)[ROWS][UNROLL], int base, bool checked) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int v = base + 32 * u;
            const bool in = !checked || v < vecs;
            float4 a[4];
            float amax = 0.0f;
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                a[h] = in ? *(const float4*)(static_cast<const float*>(x) + (i64)VALUES * v + 4 * h)
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                amax = fmaxf(amax, fmaxf(fmaxf(fabsf(a[h].x), fabsf(a[h].y)), fmaxf(fabsf(a[h].z), fabsf(a[h].w))));
            }
            // The 8 lanes of this 128-column group (lanes 8j .. 8j + 7).
#pragma unroll
            for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float x_scale = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
            const float inv = __frcp_rn(x_scale);
            unsigned int xq[4];
#pragma unroll
            for (int h = 0; h < 4; ++h)
                xq[h] = e4m3x4_from_f32(__fmul_rn(a[h].x, inv), __fmul_rn(a[h].y, inv), __fmul_rn(a[h].z, inv),
                                        __fmul_rn(a[h].w, inv));
#pragma unroll
            for (int p = 0; p < ROWS / 2; ++p) {
                const uint4 first = wv[2 * p][u], second = wv[2 * p + 1][u];
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_e4m3(d, first.x, second.x, first.y, second.y, xq[0], xq[1]);
                mma_e4m3(d, first.z, second.z, first.w, second.w, xq[2], xq[3]);
                if (owner) {
                    const int block = (VALUES * v) / 128;
#pragma unroll
                    for (int q = 0; q < 2; ++q) {
                        const int r = 2 * p + q;
                        // A quad's block exists when any of its vectors does (the others add
                        // zero products); rows past the group's end have no scales.
                        const float scale =
                            (!checked || (block < scale_cols && w[r])) ? scale_row[r][block] : 0.0f;
                        acc[r][0] = fmaf(diag_piece(d, lane, q == 1), scale * x_scale, acc[r][0]);
                    }
                }
            }
        }
    };
    // GEMV_BF16_DIAG's multiply: rows in pairs (a lone last row with a zero partner), a token's
    // 8 activations of the lane's vector as 4 bf16 pairs.
    auto multiply_bf16_diag = [&](const uint4 (&wv)[ROWS][UNROLL], int base, bool checked) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int v = base + 32 * u;
            const bool in = !checked || v < vecs;
            unsigned int xw[T][4];
#pragma unroll
            for (int t = 0; t < T; ++t) {
                const i64 at = (i64)t * k + 8 * (i64)v;
                if (ROUNDED_X) {
                    const uint4 q = in ? *reinterpret_cast<const uint4*>(static_cast<const bf16_bits*>(x) + at)
                                       : make_uint4(0u, 0u, 0u, 0u);
                    xw[t][0] = q.x; xw[t][1] = q.y; xw[t][2] = q.z; xw[t][3] = q.w;
                } else {
                    load_bf16_pairs8(static_cast<const float*>(x) + at, in, xw[t]);
                }
            }
#pragma unroll
            for (int p = 0; p < (ROWS + 1) / 2; ++p) {
                const uint4 first = wv[2 * p][u];
                const uint4 second = 2 * p + 1 < ROWS ? wv[(2 * p + 1) % ROWS][u] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_bf16_row_pair(d, first, second, xw[t]);
                    if (owner) {
                        acc[2 * p][t] += diag_piece(d, lane, false);
                        if (2 * p + 1 < ROWS) acc[(2 * p + 1) % ROWS][t] += diag_piece(d, lane, true);
                    }
                }
            }
        }
    };
    auto multiply = [&](const uint4 (&wv)[ROWS][UNROLL], int base, bool checked) {
        if constexpr (DIAG) {
            multiply_diag(wv, base, checked);
            return;
        }
        if constexpr (BF16_DIAG) {
            multiply_bf16_diag(wv, base, checked);
            return;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int v = base + 32 * u;
            if (checked && v >= vecs) continue;  // the weights there are zero: nothing to add
            float xf[T][VALUES];
#pragma unroll
            for (int t = 0; t < T; ++t) {
#pragma unroll
                for (int h = 0; h < VALUES / 8; ++h) {
                    const i64 at = (i64)t * k + (i64)VALUES * v + 8 * h;
                    if (FORMAT == WEIGHTS_FP8) {
                        // Block-FP8 weights multiply the f32 activations as they are (nothing to
                        // round them for: the products are summed on the CUDA cores in f32).
                        const float4 a = *(const float4*)(static_cast<const float*>(x) + at);
                        const float4 b = *(const float4*)(static_cast<const float*>(x) + at + 4);
                        xf[t][8 * h + 0] = a.x; xf[t][8 * h + 1] = a.y; xf[t][8 * h + 2] = a.z; xf[t][8 * h + 3] = a.w;
                        xf[t][8 * h + 4] = b.x; xf[t][8 * h + 5] = b.y; xf[t][8 * h + 6] = b.z; xf[t][8 * h + 7] = b.w;
                    } else if (ROUNDED_X) {
                        bf16x8_to_f32(*reinterpret_cast<const uint4*>(static_cast<const bf16_bits*>(x) + at), &xf[t][8 * h]);
                    } else {
                        load_rounded8(static_cast<const float*>(x) + at, &xf[t][8 * h]);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                float wf[VALUES];
                if (FORMAT == WEIGHTS_FP8) {
                    e4m3x4_to_f32(wv[r][u].x, &wf[0]);
                    e4m3x4_to_f32(wv[r][u].y, &wf[4]);
                    e4m3x4_to_f32(wv[r][u].z, &wf[8]);
                    e4m3x4_to_f32(wv[r][u].w, &wf[12]);
                } else {
                    bf16x8_to_f32(wv[r][u], wf);
                }
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    if (FORMAT == WEIGHTS_FP8) {
                        // A vector's 16 products, then its block's scale (one 128-column block).
                        float s = 0.0f;
#pragma unroll
                        for (int j = 0; j < 16; ++j) s = fmaf(wf[j], xf[t][j], s);
                        // Rows past the group's end have no scales (and zero weights).
                        const float scale = (!checked || w[r]) ? scale_row[r][(VALUES * v) / 128] : 0.0f;
                        acc[r][t] = fmaf(s * FP8_VALUE_UNSCALE, scale, acc[r][t]);
                    } else {
                        float s = acc[r][t];
#pragma unroll
                        for (int j = 0; j < 8; ++j) s = fmaf(wf[j], xf[t][j], s);
                        acc[r][t] = s;
                    }
                }
            }
        }
    };

    // The weights do not depend on earlier kernels: the first sweeps' loads are issued before the
    // wait, so they overlap the previous kernel's tail.
    uint4 wa[ROWS][UNROLL];
    load(wa, lane, true);
    wait_for_previous_kernel();
    if (GEMV_LANE_PIPELINE) {
        uint4 wb[ROWS][UNROLL];
        int base = lane;
#if GEMV_LANE_UNCHECKED
        // A warp whose rows all exist runs its whole iterations (every lane's loads, the next
        // buffer's included, inside the row) without a bound on any load or product; the rest as
        // below. The same vectors in the same order: the same sums.
        if (mat[ROWS - 1] >= 0) {
            for (; base - lane + 3 * STEP <= vecs; base += 2 * STEP) {
                load(wb, base + STEP, false);
                multiply(wa, base, false);
                load(wa, base + 2 * STEP, false);
                multiply(wb, base + STEP, false);
            }
        }
#endif
        for (; (WARP_UNIFORM ? base - lane : base) < vecs; base += 2 * STEP) {
            load(wb, base + STEP, true);
            multiply(wa, base, true);
            load(wa, base + 2 * STEP, true);
            multiply(wb, base + STEP, true);
        }
    } else {
        for (int base = lane; (WARP_UNIFORM ? base - lane : base) < vecs; base += STEP) {
            if (base != lane) load(wa, base, true);
            multiply(wa, base, true);
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            float s = acc[r][t];
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            acc[r][t] = s;
            if (!PAIRED && lane == 0 && mat[r] >= 0) {
                group_pick(group.out, mat[r])[(i64)t * group_rows(group, mat[r]) + local[r]] = s;
            }
        }
    }
    if (PAIRED && lane == 0) {
        const int n = group.first_row[1];
#pragma unroll
        for (int r = 0; r < HALF; ++r)
#pragma unroll
            for (int t = 0; t < T; ++t)
                if (mat[r] >= 0) group.out[0][(i64)t * n + local[r]] = silu_f(acc[r][t]) * acc[r + HALF][t];
    }
}

// Grid: ceil(first_row[count] / (GEMV_LANE_WARPS * rows)) blocks of 32 * GEMV_LANE_WARPS
// threads.
// x: f32 activations for one token, bf16 (already rounded) for two to four.
// The *_silu_gate kernels are the PAIRED form (grid: ceil(gate rows / (GEMV_LANE_WARPS * rows / 2))).
#define GEMV_LANE_KERNEL(T, ROUNDED_X, ROWS, UNROLL)                                                          \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_LANE_WARPS)                                 \
        gemv_bf16_lanes_t##T(const GemvGroup group, const void* __restrict__ x, int tokens, int k) {    \
        gemv_lanes<T, ROUNDED_X, ROWS, WEIGHTS_BF16, UNROLL, false>(group, x, k);                      \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_LANE_WARPS)                                 \
        gemv_bf16_lanes_silu_gate_t##T(const GemvGroup group, const void* __restrict__ x, int tokens, int k) { \
        gemv_lanes<T, ROUNDED_X, ROWS, WEIGHTS_BF16, UNROLL, true>(group, x, k);                       \
    }
GEMV_LANE_KERNEL(1, false, GEMV_LANE_ROWS, GEMV_LANE_UNROLL)
GEMV_LANE_KERNEL(2, true, GEMV_LANE_ROWS_MULTI, GEMV_LANE_UNROLL)
GEMV_LANE_KERNEL(3, true, GEMV_LANE_ROWS_MULTI, GEMV_LANE_UNROLL)
GEMV_LANE_KERNEL(4, true, GEMV_LANE_ROWS_MULTI, GEMV_LANE_UNROLL)

// One row a warp, for launches that would otherwise fill fewer blocks than the GPU has SMs (the
// unquantized GDN gate projections of an FP8 model: 2 x 48 rows, 6 blocks of 16 rows took 15 us
// on the H200 for 1 MB, each warp streaming 4 rows alone): four times the warps, each with a
// quarter of the chain. A row's sum is the same lane order and butterfly, so bit for bit the
// wider kernels' (gemv.rs picks it, `GEMV_LANE_NARROW`).
// NAME: the kernel's name; ROUNDED_X: its activations come rounded to bf16 by a cast launch (2-4
// tokens; rounding them in the kernel instead, without the cast launch, measured slower: 27B FP8
// MTP k=3 257.1 against 270.3 tok/s, session 15).
#define GEMV_NARROW_KERNEL(NAME, T, ROUNDED_X, UNROLL)                                                  \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_LANE_WARPS)                                 \
        NAME(const GemvGroup group, const void* __restrict__ x, int tokens, int k) {                    \
        gemv_lanes<T, ROUNDED_X, 1, WEIGHTS_BF16, UNROLL, false>(group, x, k);                         \
    }
GEMV_NARROW_KERNEL(gemv_bf16_lanes_narrow_t1, 1, false, GEMV_LANE_UNROLL)
GEMV_NARROW_KERNEL(gemv_bf16_lanes_narrow_t2, 2, true, GEMV_LANE_UNROLL)
GEMV_NARROW_KERNEL(gemv_bf16_lanes_narrow_t3, 3, true, GEMV_LANE_UNROLL)
GEMV_NARROW_KERNEL(gemv_bf16_lanes_narrow_t4, 4, true, GEMV_LANE_UNROLL)

// Sweeps in flight per buffer for FP8 weights: the conversion makes these kernels issue-bound, and
// fewer registers a lane let more warps hide it. Measured on the H200 (27B shape, one-token decode,
// pipelined): 1 sweep 83.8 tok/s, 2 sweeps 74.7, 4 unpipelined 75.8.
#ifndef GEMV_FP8_UNROLL
#define GEMV_FP8_UNROLL 1
#endif

// Block-FP8 weights (codes [rows, k], scales [ceil(rows/128), ceil(k/128)] f32 per matrix in
// group.scale): the same grid and block. x: f32 activations of every token (never rounded).
// Requires k % 16 == 0.
#define GEMV_FP8_KERNEL(T, ROWS)                                                                             \
    extern "C" __global__ void FP8_LANE_BOUNDS                                                          \
        gemv_fp8_lanes_t##T(const GemvGroup group, const void* __restrict__ x, int tokens, int k) {     \
        gemv_lanes<T, false, ROWS, WEIGHTS_FP8, GEMV_FP8_UNROLL, false>(group, x, k);                                          \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_LANE_WARPS)                                 \
        gemv_fp8_lanes_silu_gate_t##T(const GemvGroup group, const void* __restrict__ x, int tokens, int k) { \
        gemv_lanes<T, false, ROWS, WEIGHTS_FP8, GEMV_FP8_UNROLL, true>(group, x, k);                                           \
    }
// Rows a warp owns for one token with FP8 weights (the bf16 kernel's 4 unless measured otherwise).
#ifndef GEMV_FP8_ROWS
#define GEMV_FP8_ROWS GEMV_LANE_ROWS
#endif
GEMV_FP8_KERNEL(1, GEMV_FP8_ROWS)
GEMV_FP8_KERNEL(2, GEMV_LANE_ROWS_MULTI)
GEMV_FP8_KERNEL(3, GEMV_LANE_ROWS_MULTI)
GEMV_FP8_KERNEL(4, GEMV_LANE_ROWS_MULTI)

// One FP8 token for launches with few warps an SM (the 27B shape's down and out projections: 5120
// rows, ~10 warps of 4 rows an SM, against the ~20 the registers allow): more sweeps in flight per
// buffer, which the wide launches cannot afford in registers (gemv.rs picks it by the launch's
// warps per SM, `GEMV_FP8_DEEP_BELOW`). A lane takes its vectors in the same order as with one
// sweep a buffer, so each row's sum is gemv_fp8_lanes_t1's bit for bit.
#ifndef GEMV_FP8_DEEP_UNROLL
#define GEMV_FP8_DEEP_UNROLL 2
#endif
extern "C" __global__ void __launch_bounds__(32 * GEMV_LANE_WARPS)
    gemv_fp8_lanes_deep_t1(const GemvGroup group, const void* __restrict__ x, int tokens, int k) {
    gemv_lanes<1, false, GEMV_FP8_ROWS, WEIGHTS_FP8, GEMV_FP8_DEEP_UNROLL, false>(group, x, k);
}
extern "C" __global__ void __launch_bounds__(32 * GEMV_LANE_WARPS)
    gemv_fp8_lanes_deep_silu_gate_t1(const GemvGroup group, const void* __restrict__ x, int tokens, int k) {
    gemv_lanes<1, false, GEMV_FP8_ROWS, WEIGHTS_FP8, GEMV_FP8_DEEP_UNROLL, true>(group, x, k);
}

// One token over a group that mixes formats, in one launch: the FP8 model's GDN input projections
// (FP8 in_proj_qkv/z beside the unquantized in_proj_a/b, whose 96 rows alone would be a
// latency-bound launch of their own). A matrix without a scale grid is bf16; each warp's rows lie
// in one matrix (gemv.rs keeps every matrix boundary a multiple of GEMV_FP8_ROWS, which equals
// GEMV_LANE_ROWS there), so the branch is uniform per warp. Each row's sum is its format's lane
// kernel's bit for bit; the bf16 rows keep one sweep per buffer so the launch needs no more
// registers than the FP8 kernel (at most 5 blocks an SM's registers).
extern "C" __global__ void __launch_bounds__(32 * GEMV_LANE_WARPS, 5)
    gemv_mixed_lanes_t1(const GemvGroup group, const void* __restrict__ x, int tokens, int k) {
    int local = 0;
    const int first = (blockIdx.x * GEMV_LANE_WARPS + (threadIdx.x >> 5)) * GEMV_FP8_ROWS;
    const int m = group_row(group, first, &local);
    if (m >= 0 && group_pick(group.scale, m) == nullptr) {
        gemv_lanes<1, false, GEMV_FP8_ROWS, WEIGHTS_BF16, 1, false>(group, x, k);
    } else {
        gemv_lanes<1, false, GEMV_FP8_ROWS, WEIGHTS_FP8, GEMV_FP8_UNROLL, false>(group, x, k);
    }
}

// Grid: ceil(first_row[count] / 16) blocks of 32 * GEMV_WARPS threads. Requires k % 8 == 0 and
// 16-byte aligned weights and activations (checked by the launcher). One kernel per 8-token tile
// count; only one tile (5-8 rows) is built: from 9 rows on cuBLAS was faster on the H200 (gemv.rs).
#define GEMV_KERNEL(TILES)                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)                                      \
        gemv_bf16_t##TILES(const GemvGroup group, const bf16_bits* __restrict__ xb, int tokens, int k) { \
        AFTER_PREVIOUS_KERNEL();                                                                        \
        gemv_block<TILES>(group, xb, tokens, k);                                                        \
    }
GEMV_KERNEL(1)

// ---- block-FP8 weights for 2-32 tokens: the streamed tensor-core kernel ----
// The FP8 lane kernels spend 16 multiply-adds per code vector and token on the CUDA cores (a
// k=3 verify of 4 tokens took twice a one-token step); here the multiply-adds run on the tensor
// cores (`mma.m16n8k16`, bf16 in, f32 out), token 8t + n being column n of tile t's 8-column
// operand, so eight tokens cost no more instructions than one, and each further tile of eight only
// its activation loads and mma (the codes are widened once for all tiles). A block owns 16 output
// rows (or, PAIRED, 8 gate rows and the 8 up rows of the same indices) and its GEMV_MMA_WARPS warps
// take its 128-column blocks in turn (warp w: blocks w, w + WARPS, ...), streaming them like the
// lane kernels: the loads of the next blocks are in flight while the current ones are multiplied. Per 128 columns
// (one scale block) a warp sums each row from zero (the tensor cores' accumulation is exact enough
// over 128 columns), then adds the piece times the block's scale to its f32 total; the warps'
// totals are added in warp order through shared memory. Nothing in that order depends on the token
// count or the tile count, so a row's result does not depend on what else is batched with it here.
//
// Thread (g = lane / 4, c = lane % 4) loads rows g and g + 8 of the block, 16 codes at columns
// 64 v + 16 c of a 128-column block (v = 0, 1): a quad reads 64 contiguous bytes of a row per
// load. The mma's k index is only a name for a column, the same for weights and activations: the
// codes are widened to bf16 in the pairs (0, 2) and (1, 3) of each 4-code word (fewest integer
// operations) and the activations are paired to match. The f32 activations of token 8t + g are
// rounded to bf16 here (as the cuBLAS path's cast rounds them), so no cast launches before the kernel.
// One token stays on the lane kernel: measured on the H200 (27B shape, one-token decode), this
// kernel at its best shape 83.1 tok/s against 87.0 (docs/fp8.md).
#ifndef GEMV_MMA_WARPS
#define GEMV_MMA_WARPS 4
#endif
// Column blocks per register buffer of a warp (two buffers). Measured on the H200 (27B shape,
// FP8, one-token decode, tok/s in one call): 4 warps x 2 blocks 83.1, 8 x 1 77.4, 4 x 1 77.9,
// 8 x 2 74.1; a ring of 2-4 one-block slots instead of two buffers 56.6-79.2.
#ifndef GEMV_MMA_UNROLL
#define GEMV_MMA_UNROLL 2
#endif
#define GEMV_MMA_TOKENS 32

// Codes 0 and 2 (`even`) or 1 and 3 (`odd`) of a word of e4m3fn codes as a bf16 pair, each the
// code's value times 2^-120 exactly (e4m3_scaled_down's placement at the bf16 width: exponent and
// mantissa bits at the bottom of the bf16's, subnormals onto bf16 subnormals). The first code of the
// pair is the low half. Five integer operations and two shifts for four codes.
__device__ __forceinline__ unsigned int e4m3_pair_odd(unsigned int word) {
    return (word & 0x80008000u) | ((word >> 4) & 0x07f007f0u);
}
__device__ __forceinline__ unsigned int e4m3_pair_even(unsigned int word) {
    return ((word << 8) & 0x80008000u) | ((word << 4) & 0x07f007f0u);
}

// Loads of what the previous kernel wrote, as inline asm. Under
// programmatic dependent launch this kernel may start before that kernel has written them; loads
// from `const __restrict__` pointers compile to the read-only `ld.global.nc`, which ptxas takes to
// be unchanging and may schedule above `griddepcontrol.wait` (it did for the W8A8 activations
// below: `serve` then read the previous group's codes), while a volatile asm load stays after it.
// scripts/pdl_audit.py checks the SASS for such early reads. They are ordinary (weak) loads cached
// in L1 too (`ld.global.ca`), which the memory model orders after the wait like any load, so the
// warps of an SM that read the same activations share them in L1 (H200, 27B FP8, session 14: MTP
// k=3 266.7 tok/s against 249.9 with `ld.global.cg`, L2 only).
#define LOAD_FRESH_OP "ld.global.ca"
__device__ __forceinline__ uint4 load_fresh(const void* p) {
    uint4 v;
    asm volatile(LOAD_FRESH_OP ".v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ float load_fresh(const float* p) {
    float v;
    asm volatile(LOAD_FRESH_OP ".f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

// The FP8 activations of the W8A8 form: e4m3 codes [rows, k] (rows >= 8 * tiles, zero past the tokens)
// and their scales [k / 128, rows] (`quantize_activations_fp8`).
struct Fp8Input {
    const unsigned char* codes;
    const float* scales;
    int rows;
};

// W8A8: the activations come quantized (1 x 128 groups, as for the prefill GEMM) and the codes of
// both multiply on the FP8 tensor cores as they are (`mma.m16n8k32` e4m3): no widening of the
// weights, and each 128-column piece is scaled by its weight block's and its token group's scales.
// One or two tiles of 8 tokens. Thread (g, c)'s 16-code vector of token 8t + g is at the columns of
// its weight vectors, and each 4-code word takes the same k slots as the weights' word it multiplies.
template <bool PAIRED, int TILES, bool W8A8 = false>
__device__ __forceinline__ void gemv_fp8_mma(const GemvGroup& group, const float* __restrict__ x, int tokens, int k,
                                             Fp8Input xq = Fp8Input{}) {
    static_assert(!W8A8 || TILES <= 2, "the W8A8 form takes one or two tiles of 8 tokens");
    constexpr int VALUES = 16;  // codes per 16-byte vector
    constexpr int VECS = 2;     // vectors of a row per lane and column block
    __shared__ float totals[GEMV_MMA_WARPS][TILES * 4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int local[2], mat[2];
    if (PAIRED) {
        local[0] = local[1] = blockIdx.x * 8 + g;
        mat[0] = local[0] < group.first_row[1] ? 0 : -1;
        mat[1] = mat[0] < 0 ? -1 : 1;
    } else {
        mat[0] = group_row(group, blockIdx.x * 16 + g, &local[0]);
        mat[1] = group_row(group, blockIdx.x * 16 + g + 8, &local[1]);
    }
    const int col_blocks = (k + 127) / 128;
    const unsigned char* w[2];
    const float* scale_row[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        w[h] = mat[h] >= 0 ? (const unsigned char*)group_pick(group.w, mat[h]) + (i64)local[h] * k : nullptr;
        scale_row[h] = mat[h] >= 0 ? group_pick(group.scale, mat[h]) + (i64)(local[h] / 128) * col_blocks : nullptr;
    }
    let_next_kernel_start();

    // A warp's i-th column block is warp + i * GEMV_MMA_WARPS; a buffer holds GEMV_MMA_UNROLL
    // consecutive ones of them, and one buffer is in flight while the other is multiplied.
    struct Piece {
        uint4 v[GEMV_MMA_UNROLL][2][VECS];
        float scale[GEMV_MMA_UNROLL][2];
        // W8A8: token 8t + g's codes at the weights' columns, and the scales of tokens 8t + 2c and
        // 8t + 2c + 1.
        uint4 xv[W8A8 ? GEMV_MMA_UNROLL : 1][W8A8 ? TILES : 1][VECS];
        float x_scale[W8A8 ? GEMV_MMA_UNROLL : 1][W8A8 ? TILES : 1][2];
    };
    // The activations are the previous kernel's output: loaded after its wait, unlike the weights.
    auto load_x = [&](Piece& p, int first) {
        if constexpr (W8A8) {
#pragma unroll
            for (int u = 0; u < GEMV_MMA_UNROLL; ++u) {
                const int cb = warp + (first + u) * GEMV_MMA_WARPS;
                const bool in = cb < col_blocks;
#pragma unroll
                for (int t = 0; t < TILES; ++t) {
#pragma unroll
                    for (int v = 0; v < VECS; ++v) {
                        const int col = cb * 128 + VALUES * (4 * v + c);
                        const unsigned char* codes = xq.codes + (i64)(8 * t + g) * k + col;
                        p.xv[u][t][v] = in ? load_fresh(codes) : make_uint4(0u, 0u, 0u, 0u);
                    }
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const float* scale = xq.scales + (i64)cb * xq.rows + 8 * t + 2 * c + j;
                        p.x_scale[u][t][j] = in ? load_fresh(scale) : 0.0f;
                    }
                }
            }
        }
    };
    auto load = [&](Piece& p, int first) {
#pragma unroll
        for (int u = 0; u < GEMV_MMA_UNROLL; ++u) {
            const int cb = warp + (first + u) * GEMV_MMA_WARPS;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int v = 0; v < VECS; ++v) {
                    const int col = cb * 128 + VALUES * (4 * v + c);
                    p.v[u][h][v] = (cb < col_blocks && col < k && w[h])
                                       ? load_streaming((const bf16_bits*)(w[h] + col))
                                       : make_uint4(0u, 0u, 0u, 0u);
                }
                // Rows past the group's end have no scales (and zero weights).
                p.scale[u][h] = (cb < col_blocks && w[h]) ? scale_row[h][cb] : 0.0f;
            }
        }
    };
    // Tile t holds tokens 8t .. 8t + 7: this thread's token of it is 8t + g.
    float total[TILES][4];
    const float* xg[TILES];
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
        total[t][0] = total[t][1] = total[t][2] = total[t][3] = 0.0f;
        xg[t] = !W8A8 && 8 * t + g < tokens ? x + (i64)(8 * t + g) * k : nullptr;
    }
    auto multiply = [&](const Piece& p, int first) {
#pragma unroll
        for (int u = 0; u < GEMV_MMA_UNROLL; ++u) {
            const int cb = warp + (first + u) * GEMV_MMA_WARPS;
            if (cb >= col_blocks) return;
            float piece[TILES][4];
#pragma unroll
            for (int t = 0; t < TILES; ++t) piece[t][0] = piece[t][1] = piece[t][2] = piece[t][3] = 0.0f;
            if constexpr (W8A8) {
#pragma unroll
                for (int t = 0; t < TILES; ++t) {
#pragma unroll
                    for (int v = 0; v < VECS; ++v) {
                        const uint4 lo = p.v[u][0][v], hi = p.v[u][1][v], xv = p.xv[u][t][v];
                        mma_e4m3(piece[t], lo.x, hi.x, lo.y, hi.y, xv.x, xv.y);
                        mma_e4m3(piece[t], lo.z, hi.z, lo.w, hi.w, xv.z, xv.w);
                    }
                    // piece[t]: rows g (0, 1) and g + 8 (2, 3), tokens 8t + 2c and 8t + 2c + 1.
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        total[t][i] = fmaf(piece[t][i], p.scale[u][i / 2] * p.x_scale[u][t][i & 1], total[t][i]);
                }
                continue;
            }
#pragma unroll
            for (int v = 0; v < VECS; ++v) {
                const int col = cb * 128 + VALUES * (4 * v + c);
                // Each tile's activations at these columns, rounded to bf16 in the codes' pairs.
                unsigned int xp[TILES][8];
#pragma unroll
                for (int t = 0; t < TILES; ++t) {
                    float xf[VALUES];
#pragma unroll
                    for (int q = 0; q < VALUES / 4; ++q) {
                        const float4 a = (xg[t] && col < k) ? *(const float4*)(xg[t] + col + 4 * q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                        xf[4 * q] = a.x; xf[4 * q + 1] = a.y; xf[4 * q + 2] = a.z; xf[4 * q + 3] = a.w;
                    }
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        xp[t][2 * j] = pack_bf16(xf[4 * j], xf[4 * j + 2]);
                        xp[t][2 * j + 1] = pack_bf16(xf[4 * j + 1], xf[4 * j + 3]);
                    }
                }
                const unsigned int lo[4] = {p.v[u][0][v].x, p.v[u][0][v].y, p.v[u][0][v].z, p.v[u][0][v].w};
                const unsigned int hi[4] = {p.v[u][1][v].x, p.v[u][1][v].y, p.v[u][1][v].z, p.v[u][1][v].w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    // The codes are widened once and serve every tile.
                    const unsigned int a0 = e4m3_pair_even(lo[j]), a1 = e4m3_pair_even(hi[j]);
                    const unsigned int a2 = e4m3_pair_odd(lo[j]), a3 = e4m3_pair_odd(hi[j]);
#pragma unroll
                    for (int t = 0; t < TILES; ++t) mma_bf16(piece[t], a0, a1, a2, a3, xp[t][2 * j], xp[t][2 * j + 1]);
                }
            }
            // piece[t]: rows g (0, 1) and g + 8 (2, 3), tokens 8t + 2c and 8t + 2c + 1.
#pragma unroll
            for (int t = 0; t < TILES; ++t)
#pragma unroll
                for (int i = 0; i < 4; ++i) total[t][i] = fmaf(piece[t][i] * E4M3_UNSCALE, p.scale[u][i / 2], total[t][i]);
        }
    };

    // The weights do not depend on earlier kernels: the first column blocks' loads are issued before
    // the wait, so they overlap the previous kernel's tail.
    Piece pa, pb;
    load(pa, 0);
    wait_for_previous_kernel();
    load_x(pa, 0);
    const int mine = (col_blocks - warp + GEMV_MMA_WARPS - 1) / GEMV_MMA_WARPS;  // this warp's column blocks
    for (int first = 0; first < mine; first += 2 * GEMV_MMA_UNROLL) {
        load(pb, first + GEMV_MMA_UNROLL);
        load_x(pb, first + GEMV_MMA_UNROLL);
        multiply(pa, first);
        load(pa, first + 2 * GEMV_MMA_UNROLL);
        load_x(pa, first + 2 * GEMV_MMA_UNROLL);
        multiply(pb, first + GEMV_MMA_UNROLL);
    }
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) totals[warp][4 * t + i][lane] = total[t][i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
        float sum[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            sum[i] = 0.0f;
            for (int u = 0; u < GEMV_MMA_WARPS; ++u) sum[i] += totals[u][4 * t + i][lane];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int token = 8 * t + 2 * c + (i & 1), h = i / 2;
            if (token >= tokens || mat[h] < 0) continue;
            if (PAIRED) {
                if (h == 0) group.out[0][(i64)token * group.first_row[1] + local[0]] = silu_f(sum[i]) * sum[i + 2];
            } else {
                group_pick(group.out, mat[h])[(i64)token * group_rows(group, mat[h]) + local[h]] = sum[i];
            }
        }
    }
}

// Grid: ceil(first_row[count] / 16) blocks (PAIRED: ceil(gate rows / 8)) of 32 * GEMV_MMA_WARPS
// threads. x: the f32 activations of `tokens` <= 8 * TILES tokens (one kernel per tile count up to
// GEMV_MMA_TOKENS / 8). Block-FP8 matrices as for the lane kernels (k % 16 == 0, 16-byte aligned
// rows, checked by the launcher).
#define GEMV_FP8_MMA_KERNEL(TILES)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_MMA_WARPS)                                  \
        gemv_fp8_mma_t##TILES(const GemvGroup group, const float* __restrict__ x, int tokens, int k) {  \
        gemv_fp8_mma<false, TILES>(group, x, tokens, k);                                                \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_MMA_WARPS)                                  \
        gemv_fp8_mma_silu_gate_t##TILES(const GemvGroup group, const float* __restrict__ x, int tokens, int k) { \
        gemv_fp8_mma<true, TILES>(group, x, tokens, k);                                                 \
    }
GEMV_FP8_MMA_KERNEL(1)
GEMV_FP8_MMA_KERNEL(2)
GEMV_FP8_MMA_KERNEL(3)
GEMV_FP8_MMA_KERNEL(4)

// W8A8 (Fp8Input above): the same grid and block as gemv_fp8_mma_t1, for 1-8 tokens (t1) or 9-16
// (t2); x: the FP8 activations of `quantize_activations_fp8` (`x_rows` >= 8 * tiles rows, zero
// past `tokens`) and k % 128 == 0 (checked by the launcher); compute capability 8.9 on.
#define GEMV_FP8_W8A8_KERNEL(TILES)                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_MMA_WARPS)                                  \
        gemv_fp8_w8a8_t##TILES(const GemvGroup group, const unsigned char* __restrict__ x_codes,        \
                               const float* __restrict__ x_scales, int x_rows, int tokens, int k) {     \
        gemv_fp8_mma<false, TILES, true>(group, nullptr, tokens, k, Fp8Input{x_codes, x_scales, x_rows}); \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_MMA_WARPS)                                  \
        gemv_fp8_w8a8_silu_gate_t##TILES(const GemvGroup group, const unsigned char* __restrict__ x_codes, \
                                         const float* __restrict__ x_scales, int x_rows, int tokens, int k) { \
        gemv_fp8_mma<true, TILES, true>(group, nullptr, tokens, k, Fp8Input{x_codes, x_scales, x_rows}); \
    }
GEMV_FP8_W8A8_KERNEL(1)
GEMV_FP8_W8A8_KERNEL(2)
