// The routed experts of a MoE block without leaving the device and without a launch per expert.
// Every path starts with
//   moe_route         router logits [T, E] -> top-k expert ids and weights per token
// then, for many tokens (tensor cores, grouped by expert):
//   moe_plan          slots (token, rank) grouped by expert into work blocks of <= 8 x TILES slots
//   moe_gate_up_t*    act[slot] = silu(gate_e x) * up_e x, every work block of every expert in one launch
//   moe_down_t*       y[slot]   = down_e act[slot], likewise
//   moe_combine       out[t]    = sum over ranks of weight * y (+ the gated shared expert)
// and for a few tokens (CUDA cores, by slot; see moe_gate_up_slots):
//   moe_gate_up_slots, moe_down_combine_r* (rows a block)
//
// Expert weights are stacked: gate_up [E * 2 * im, h] (expert e's im gate rows, then its im up rows)
// and down [E * h, im], bf16. A work block reads its expert's rows once for up to 8 x TILES slots
// (the tensor-core skinny GEMM of gemv.cu with the activations gathered per column; TILES 1 for a
// decode batch, 4 for a prefill), so a prefill reads each expert about slots / E / 32 times.
//
// Determinism: a slot's products do not depend on which other slots share its work block (each mma
// column is its own dot product, K in a fixed order), activations and outputs are indexed by slot,
// and the combine adds the ranks in rank order; so the order moe_plan puts slots in (set by atomics)
// never reaches the numbers, and a token's result does not depend on what else is batched.

#define MOE_MAX_EXPERTS 512
#define MOE_EXPERTS_PER_LANE (MOE_MAX_EXPERTS / 32)
#define MOE_WARPS 8

// moe_route's ranking key: ordered as the logits are (-0 as +0, so that equal logits tie and go to
// the lower expert as in the comparison of the floats), 0 for NaN, which is never chosen while a
// number is left.
__device__ __forceinline__ unsigned int moe_rank_key(float v) {
    if (v != v) return 0u;
    return order_key(__uint_as_float(v == 0.0f ? 0u : __float_as_uint(v)));
}

// One warp per token. Ranks by probability, highest first, ties to the lower expert index (the
// reference's stable sort); the softmax and the weights in f64 as the reference computes them.
// Ranking compares the f32 logits, which orders them as their f64 probabilities do (exp is
// increasing; the two differ only for logits more than ~745 below the maximum, where f64 rounds
// the probability to 0). The chosen ranks' probabilities are then computed side by side, summed in
// rank order for the renormalisation, and written; renormalised weights skip the softmax's
// denominator (it cancels), which spares the warp an f64 exponential of every expert: this kernel
// runs alone between the router and the experts in every MoE layer of a decode step, so its
// latency is the step's (H200, 35B-A3B: ~5 us of a 3.5 ms step per layer before). Grid:
// ceil(tokens / MOE_ROUTE_WARPS) blocks of 32 * MOE_ROUTE_WARPS threads.
#define MOE_ROUTE_WARPS 4
// The ranking by warp reductions (redux.sync, compute capability 8.0 on) instead of butterfly
// shuffles; the same choices either way (DELTASERVE_CUDA_DEFINES=MOE_ROUTE_REDUX=0 measures the
// shuffles).
#ifndef MOE_ROUTE_REDUX
#define MOE_ROUTE_REDUX 1
#endif
#if MOE_ROUTE_REDUX && __CUDA_ARCH__ >= 800
#define MOE_ROUTE_BY_REDUX 1
#else
#define MOE_ROUTE_BY_REDUX 0
#endif

// PER_LANE: experts a lane holds (expert e in lane e % 32), experts <= 32 * PER_LANE.
template <int PER_LANE>
__device__ __forceinline__ void moe_route_token(const float* __restrict__ row, int experts, int top_k,
                                                int renormalize, int* __restrict__ ids,
                                                float* __restrict__ weights, float* chosen_logit,
                                                double* chosen_p) {
    const int lane = threadIdx.x & 31;
    float v[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) v[i] = lane + 32 * i < experts ? row[lane + 32 * i] : NEG_INF;
#if MOE_ROUTE_BY_REDUX
    unsigned int key[PER_LANE];
    unsigned int lane_top = 0u;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        key[i] = lane + 32 * i < experts ? moe_rank_key(v[i]) : 0u;
        lane_top = max(lane_top, key[i]);
    }
    const unsigned int top_key = __reduce_max_sync(0xffffffffu, lane_top);
    const float row_max = top_key != 0u ? key_value(top_key) : NEG_INF;
#else
    float row_max = NEG_INF;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) row_max = fmaxf(row_max, v[i]);
    for (int o = 16; o > 0; o >>= 1) row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, o));
#endif
    double total = 1.0;
    if (!renormalize) {
        total = 0.0;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            if (lane + 32 * i < experts) total += exp((double)v[i] - (double)row_max);
        for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    }

#if MOE_ROUTE_BY_REDUX
    for (int r = 0; r < top_k; ++r) {
        // The lane's best (ties to its lower index, the lower expert), then the warp's best key and,
        // among the lanes holding it, the lowest expert: two single-instruction reductions a rank.
        unsigned int mine = 0u;
        int mine_i = 0;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            if (key[i] > mine) {
                mine = key[i];
                mine_i = i;
            }
        const unsigned int top = __reduce_max_sync(0xffffffffu, mine);
        const unsigned int candidate = top != 0u && mine == top ? (unsigned int)(lane + 32 * mine_i) : 0xffffffffu;
        int best_e = (int)__reduce_min_sync(0xffffffffu, candidate);
        float best = key_value(top);
        if (top == 0u) {  // NaN logits only: keep the index in range
            best_e = 0;
            best = NEG_INF;
        }
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            if (lane + 32 * i == best_e) key[i] = 0u;
        if (lane == 0) {
            ids[r] = best_e;
            chosen_logit[r] = best;
        }
    }
#else
    unsigned int taken = 0;
    for (int r = 0; r < top_k; ++r) {
        float best = NEG_INF;
        int best_e = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            const int e = lane + 32 * i;
            if (e < experts && !(taken >> i & 1u) && (v[i] > best || (v[i] == best && e < best_e))) {
                best = v[i];
                best_e = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, best, o);
            const int other_e = __shfl_xor_sync(0xffffffffu, best_e, o);
            if (other > best || (other == best && other_e < best_e)) {
                best = other;
                best_e = other_e;
            }
        }
        if (best_e >= experts) best_e = 0;  // NaN logits: keep the index in range
        if ((best_e & 31) == lane) taken |= 1u << (best_e >> 5);
        if (lane == 0) {
            ids[r] = best_e;
            chosen_logit[r] = best;
        }
    }
#endif
    __syncwarp();
    for (int r = lane; r < top_k; r += 32) chosen_p[r] = exp((double)chosen_logit[r] - (double)row_max) / total;
    __syncwarp();
    double chosen_sum = 0.0;
    if (renormalize)
        for (int r = 0; r < top_k; ++r) chosen_sum += chosen_p[r];
    for (int r = lane; r < top_k; r += 32) weights[r] = (float)(renormalize ? chosen_p[r] / chosen_sum : chosen_p[r]);
}

template <int PER_LANE>
__device__ __forceinline__ void moe_route_rows(const float* __restrict__ logits, int tokens, int experts, int top_k,
                                               int renormalize, int* __restrict__ ids,
                                               float* __restrict__ weights) {
    AFTER_PREVIOUS_KERNEL();
    // top_k <= experts <= 32 * PER_LANE (checked by the launcher).
    __shared__ float chosen_logit[MOE_ROUTE_WARPS][32 * PER_LANE];
    __shared__ double chosen_p[MOE_ROUTE_WARPS][32 * PER_LANE];
    const int warp = threadIdx.x >> 5;
    const int token = blockIdx.x * MOE_ROUTE_WARPS + warp;
    if (token >= tokens) return;
    const i64 out = (i64)token * top_k;
    moe_route_token<PER_LANE>(logits + (i64)token * experts, experts, top_k, renormalize, ids + out, weights + out,
                              chosen_logit[warp], chosen_p[warp]);
}

// router logits [T, E] -> ids, weights [T, top_k]: E <= MOE_MAX_EXPERTS, or E <= 256 (moe_route_256,
// half the registers and comparisons a rank).
extern "C" __global__ void moe_route(const float* __restrict__ logits, int tokens, int experts, int top_k,
                                     int renormalize, int* __restrict__ ids, float* __restrict__ weights) {
    moe_route_rows<MOE_EXPERTS_PER_LANE>(logits, tokens, experts, top_k, renormalize, ids, weights);
}

extern "C" __global__ void moe_route_256(const float* __restrict__ logits, int tokens, int experts, int top_k,
                                         int renormalize, int* __restrict__ ids, float* __restrict__ weights) {
    moe_route_rows<8>(logits, tokens, experts, top_k, renormalize, ids, weights);
}

// Exclusive prefix sums of `a` and `b` over the block's threads in thread order (blockDim.x <= 1024);
// every thread gets its own prefixes and the totals.
__device__ __forceinline__ void block_exclusive_scan2(int a, int b, int* a_before, int* b_before, int* a_total,
                                                      int* b_total) {
    __shared__ int warp_a[32], warp_b[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    int ia = a, ib = b;
    for (int o = 1; o < 32; o <<= 1) {
        const int na = __shfl_up_sync(0xffffffffu, ia, o), nb = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) {
            ia += na;
            ib += nb;
        }
    }
    if (lane == 31) {
        warp_a[warp] = ia;
        warp_b[warp] = ib;
    }
    __syncthreads();
    int ba = 0, bb = 0, ta = 0, tb = 0;
    for (int w = 0; w < warps; ++w) {
        if (w < warp) {
            ba += warp_a[w];
            bb += warp_b[w];
        }
        ta += warp_a[w];
        tb += warp_b[w];
    }
    *a_before = ba + ia - a;
    *b_before = bb + ib - b;
    *a_total = ta;
    *b_total = tb;
}

// One block of 1024 threads (>= MOE_MAX_EXPERTS). Groups the `slots` (= tokens * top_k) by expert:
// `sorted` lists every slot once, expert by expert; `blocks[b]` = (expert, first index into sorted,
// count <= block_rows), `*block_count` how many are used (the grids are sized for the most there
// can be).
extern "C" __global__ void moe_plan(const int* __restrict__ ids, int slots, int experts, int block_rows,
                                    int* __restrict__ sorted, int4* __restrict__ blocks,
                                    int* __restrict__ block_count) {
    AFTER_PREVIOUS_KERNEL();
    __shared__ int count[MOE_MAX_EXPERTS], cursor[MOE_MAX_EXPERTS];
    const int e = threadIdx.x;
    if (e < experts) count[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < slots; s += blockDim.x) atomicAdd(&count[ids[s]], 1);
    __syncthreads();
    const int mine = e < experts ? count[e] : 0;
    const int my_blocks = (mine + block_rows - 1) / block_rows;
    int offset, first_block, total_slots, total_blocks;
    block_exclusive_scan2(mine, my_blocks, &offset, &first_block, &total_slots, &total_blocks);
    if (e < experts) cursor[e] = offset;
    if (threadIdx.x == 0) *block_count = total_blocks;
    __syncthreads();
    for (int s = threadIdx.x; s < slots; s += blockDim.x) sorted[atomicAdd(&cursor[ids[s]], 1)] = s;
    for (int b = 0; b < my_blocks; ++b) {
        const int first = b * block_rows;
        blocks[first_block + b] = make_int4(e, offset + first, min(block_rows, mine - first), 0);
    }
}

// The expert weights' formats: bf16, or block-FP8 codes with their 128 x 128 scale grids, stacked
// alike: gate_up [E * 2 * im, h], down [E * h, im] (one byte a weight), scales [E * 2 * im / 128,
// h / 128] and [E * h / 128, im / 128] (f32). With im and h whole blocks (the launcher's check for
// FP8) every tile lies inside one expert's gate, up or down matrix, so the stacked grids are the
// experts' own grids one after another. Every kernel below takes either: by slot the exact FP8 values
// times the f32 activations on the CUDA cores, a 16-code vector's products summed and then scaled by
// its block (gemv.cu's W8A16 lanes); grouped on the bf16 tensor cores, the codes widened to bf16
// (exact) and each 32-column piece scaled by its block before it joins the warp's sum.

// What moe_tile loads of one row for one piece: 8 bf16 weights, or 8 codes, widened to bf16 only
// when the piece is multiplied (fewer registers for the loads in flight).
template <int FORMAT>
struct MoeTileCodes {
    using type = uint4;
};
template <>
struct MoeTileCodes<WEIGHTS_FP8> {
    using type = uint2;
};
template <int FORMAT>
__device__ __forceinline__ typename MoeTileCodes<FORMAT>::type moe_tile_load(
    const typename WeightElement<FORMAT>::type* row, int col) {
    if constexpr (FORMAT == WEIGHTS_FP8) {
        return row ? load_streaming8(row + col) : make_uint2(0u, 0u);
    } else {
        return row ? load_streaming(reinterpret_cast<const bf16_bits*>(row + col)) : make_uint4(0u, 0u, 0u, 0u);
    }
}
// The piece's bf16 fragment: the 8-weight vector, or its 8 codes (two words, lowest byte first)
// widened.
template <int FORMAT>
__device__ __forceinline__ uint4 moe_tile_widen(typename MoeTileCodes<FORMAT>::type v) {
    if constexpr (FORMAT == WEIGHTS_FP8) {
        const uint2 lo = e4m3x4_to_bf16x4(v.x), hi = e4m3x4_to_bf16x4(v.y);
        return make_uint4(lo.x, lo.y, hi.x, hi.y);
    } else {
        return v;
    }
}

// Warps that share one 16-row tile's K (a divisor of MOE_WARPS; a block has MOE_WARPS /
// MOE_TILE_K_WARPS tiles of consecutive rows). 2: each warp sweeps half of K, so at batch 64 a warp
// of the down projection (K = im, 512 for 35B-A3B) loads 8 pieces, not the 2 of an 8-way split,
// and a block waits at 2 barriers, not 8. Measured on an H100 (35B-A3B, FP8, against 8): batch-64
// step 21.9 -> 20.7 ms, 2048-token prefill 18,100 -> 22,200 tok/s; a batch-8 step 7.3 -> 7.5 ms.
// Every grouped kernel uses the same split, so a slot's sum has one order at any batch size.
// The launcher reads the define for its grid (moe.rs).
#ifndef MOE_TILE_K_WARPS
#define MOE_TILE_K_WARPS 2
#endif
// A warp's 32-column pieces loaded before the first is multiplied, by tiles a block: more bytes in
// flight pay for a decode batch's one-tile blocks (batch 64: 23.2 -> 20.7 ms with 2) but not for a
// prefill's four-tile ones, which have 4 x the activations in flight already (22,200 -> 19,600
// tok/s with 2). The pieces are added in the same order whatever the number.
#ifndef MOE_TILE_K_PIECES_T1
#define MOE_TILE_K_PIECES_T1 2
#endif
#ifndef MOE_TILE_K_PIECES_T4
#define MOE_TILE_K_PIECES_T4 1
#endif

// One work block of one expert against 16 of its output rows per tile (GATE_UP: 16 gate rows and
// the 16 up rows that pair with them), for up to 8 * TILES slots. A tile's MOE_TILE_K_WARPS warps
// split K in interleaved 32-column pieces as gemv.cu's tensor-core kernel does; their totals are
// added in warp order (the tile's first warp's, then the second's added to it, ...) through shared
// memory. Column g of token tile t is slot sorted[first + 8t + g]; its activations are row `slot /
// row_divisor` of `x` (the token for the gate/up projection, the slot itself for down). Tiles past
// the block's slots are skipped, so a slot's result is the same whatever TILES the launch uses.
// FP8: a thread's 8 codes of each of its two rows are widened to bf16 for the mma, and each piece
// (inside one 128-column block; the tile's 16 rows inside one 128-row block) is scaled by its block
// before it joins the accumulator.
template <bool GATE_UP, int TILES, int PIECES, int FORMAT>
__device__ __forceinline__ void moe_tile(const void* __restrict__ w, const float* __restrict__ scales, int out_rows,
                                         int k, const bf16_bits* __restrict__ x, int row_divisor,
                                         const int* __restrict__ sorted, const int* __restrict__ block_count,
                                         const int4* __restrict__ blocks, bf16_bits* __restrict__ act,
                                         float* __restrict__ y) {
    constexpr int SETS = GATE_UP ? 2 : 1;
    using W = typename WeightElement<FORMAT>::type;
    constexpr int K_WARPS = MOE_TILE_K_WARPS, BLOCK_TILES = MOE_WARPS / K_WARPS;
    static_assert(MOE_WARPS % K_WARPS == 0, "a block holds whole tiles");
    __shared__ float totals[BLOCK_TILES][SETS * TILES * 4][32];
    if ((int)blockIdx.y >= *block_count) return;
    const int4 work = blocks[blockIdx.y];
    const int expert = work.x, first = work.y, rows = work.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    // The warp's tile and its place among the tile's warps (one tile: stated, as the compiler
    // cannot know warp < MOE_WARPS).
    const int tile = BLOCK_TILES == 1 ? 0 : warp / K_WARPS, k_warp = BLOCK_TILES == 1 ? warp : warp % K_WARPS;
    const int tile_row0 = (blockIdx.x * BLOCK_TILES + tile) * 16;
    const int row_lo = tile_row0 + g, row_hi = row_lo + 8;
    // Expert e's matrix: GATE_UP rows [e * 2 * out_rows, (e + 1) * 2 * out_rows), down [e * out_rows, ...).
    const W* base = static_cast<const W*>(w) + (i64)expert * SETS * out_rows * k;
    const W* wr[SETS][2];
    const float* scale_row[SETS];
#pragma unroll
    for (int s = 0; s < SETS; ++s) {
        wr[s][0] = row_lo < out_rows ? base + ((i64)s * out_rows + row_lo) * k : nullptr;
        wr[s][1] = row_hi < out_rows ? base + ((i64)s * out_rows + row_hi) * k : nullptr;
        // FP8 rows are whole 128-row blocks and a block's tiles span at most 128 rows, so no FP8
        // tile lies past the matrix (a bf16 one may, and reads no scales).
        scale_row[s] = FORMAT == WEIGHTS_FP8
                           ? scales + ((i64)(expert * SETS + s) * (out_rows / 128) + (blockIdx.x * BLOCK_TILES + tile) * 16 / 128) * (k / 128)
                           : nullptr;
    }
    const bf16_bits* xr[TILES];
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
        const int j = 8 * t + g;
        xr[t] = j < rows ? x + (i64)(sorted[first + j] / row_divisor) * k : nullptr;
    }

    float acc[SETS][TILES][4];
#pragma unroll
    for (int s = 0; s < SETS; ++s)
#pragma unroll
        for (int t = 0; t < TILES; ++t) acc[s][t][0] = acc[s][t][1] = acc[s][t][2] = acc[s][t][3] = 0.0f;

    // A warp's pieces are col0 = k_warp * 32 + n * K_WARPS * 32, n = 0, 1, ...: 32 columns, lane
    // c's 8 at col0 + 8c. PIECES of them are loaded before the first is multiplied, then added in
    // order, so the number changes no result.
    constexpr int STRIDE = K_WARPS * 32;
    using Codes = typename MoeTileCodes<FORMAT>::type;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (int col0 = k_warp * 32; col0 < k; col0 += STRIDE * PIECES) {
        Codes wv[PIECES][SETS][2];
        uint4 xv[PIECES][TILES];
        float scale[PIECES][SETS];
#pragma unroll
        for (int p = 0; p < PIECES; ++p) {
            const int piece0 = col0 + p * STRIDE, col = piece0 + 8 * c;
            const bool in = col < k;
#pragma unroll
            for (int s = 0; s < SETS; ++s) {
#pragma unroll
                for (int half = 0; half < 2; ++half)
                    wv[p][s][half] = moe_tile_load<FORMAT>(in ? wr[s][half] : nullptr, col);
                scale[p][s] = FORMAT == WEIGHTS_FP8 && (p == 0 || piece0 < k)
                                  ? __ldg(scale_row[s] + piece0 / 128)
                                  : 1.0f;
            }
#pragma unroll
            for (int t = 0; t < TILES; ++t) xv[p][t] = (in && xr[t]) ? *(const uint4*)(xr[t] + col) : zero;
        }
#pragma unroll
        for (int p = 0; p < PIECES; ++p) {
            if (p > 0 && col0 + p * STRIDE >= k) break;
#pragma unroll
            for (int s = 0; s < SETS; ++s) {
                const uint4 w0 = moe_tile_widen<FORMAT>(wv[p][s][0]), w1 = moe_tile_widen<FORMAT>(wv[p][s][1]);
#pragma unroll
                for (int t = 0; t < TILES; ++t) {
                    if (8 * t >= rows) continue;  // the whole tile is past the block's slots
                    float piece[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_bf16(piece, w0.x, w1.x, w0.y, w1.y, xv[p][t].x, xv[p][t].y);
                    mma_bf16(piece, w0.z, w1.z, w0.w, w1.w, xv[p][t].z, xv[p][t].w);
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        acc[s][t][i] = FORMAT == WEIGHTS_FP8 ? fmaf(piece[i], scale[p][s], acc[s][t][i])
                                                             : acc[s][t][i] + piece[i];
                }
            }
        }
    }
    for (int v = 0; v < K_WARPS; ++v) {
        if (k_warp == v) {
#pragma unroll
            for (int s = 0; s < SETS; ++s)
#pragma unroll
                for (int t = 0; t < TILES; ++t)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        float& total = totals[tile][(s * TILES + t) * 4 + i][lane];
                        total = v == 0 ? acc[s][t][i] : total + acc[s][t][i];
                    }
        }
        __syncthreads();
    }
    if (k_warp != 0) return;
    // totals[(s, t, i)]: row g (i < 2) or g + 8, column 8t + 2c + (i & 1).
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int j = 8 * t + 2 * c + (i & 1);
            const int row = i < 2 ? row_lo : row_hi;
            if (j >= rows || row >= out_rows) continue;
            const int slot = sorted[first + j];
            const float first_sum = totals[tile][t * 4 + i][lane];
            if (GATE_UP) {
                const float up = totals[tile][(TILES + t) * 4 + i][lane];
                act[(i64)slot * out_rows + row] = f32_to_bf16(silu_f(first_sum) * up);
            } else {
                y[(i64)slot * out_rows + row] = first_sum;
            }
        }
    }
}

// Blocks an SM the one-tile (decode batch) gate/up kernels are compiled to fit, which caps their
// registers (0: no cap, the compiler's choice). Opt-in, not yet measured: at batch 64 the FP8 one
// takes 71 registers, so three 8-warp blocks share an SM (22.7 warps/SM under Nsight Compute,
// 70-72 % of DRAM peak, session 34); 4 holds it to 64 registers for four (ptxas, sm_90: 36 bytes
// spilled). The down kernels take 48 (FP8) and 40 registers, five or six blocks, as they are.
#ifndef MOE_GATE_UP_T1_MIN_BLOCKS
#define MOE_GATE_UP_T1_MIN_BLOCKS 0
#endif
#if MOE_GATE_UP_T1_MIN_BLOCKS > 0
#define MOE_GATE_UP_BOUNDS_1 __launch_bounds__(32 * MOE_WARPS, MOE_GATE_UP_T1_MIN_BLOCKS)
#else
#define MOE_GATE_UP_BOUNDS_1 __launch_bounds__(32 * MOE_WARPS)
#endif
#define MOE_GATE_UP_BOUNDS_4 __launch_bounds__(32 * MOE_WARPS)

// moe_gate_up_t{TILES}: act [slots, im] (bf16) from xb [tokens, h] (bf16); moe_down_t{TILES}: y
// [slots, h] (f32) from act; moe_gate_up_fp8_t{TILES}, moe_down_fp8_t{TILES}: the same with FP8
// weights (their scales the second parameter). Work blocks of up to 8 * TILES slots (moe_plan's
// block_rows). Grid: (ceil(rows / 16), most work blocks) blocks of 32 * MOE_WARPS threads; h and im
// % 8 == 0 and 16-byte aligned rows (FP8: % 128; checked by the launcher).
#define MOE_GROUPED_KERNELS(TILES, PIECES, FORMAT, SUFFIX)                                                              \
    extern "C" __global__ void MOE_GATE_UP_BOUNDS_##TILES moe_gate_up##SUFFIX##_t##TILES(                       \
        MOE_WEIGHT_PARAMS(gate_up, FORMAT), int im, int h, const bf16_bits* __restrict__ xb, int top_k,         \
        const int* __restrict__ sorted, const int* __restrict__ block_count, const int4* __restrict__ blocks,   \
        bf16_bits* __restrict__ act) {                                                                          \
        AFTER_PREVIOUS_KERNEL();                                                                                \
        moe_tile<true, TILES, PIECES, FORMAT>(gate_up, MOE_SCALES_ARG(gate_up, FORMAT), im, h, xb, top_k, sorted, block_count, blocks,   \
                                      act, nullptr);                                                           \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS) moe_down##SUFFIX##_t##TILES(                   \
        MOE_WEIGHT_PARAMS(down, FORMAT), int h, int im, const bf16_bits* __restrict__ act,                      \
        const int* __restrict__ sorted, const int* __restrict__ block_count, const int4* __restrict__ blocks,   \
        float* __restrict__ y) {                                                                                \
        AFTER_PREVIOUS_KERNEL();                                                                                \
        moe_tile<false, TILES, PIECES, FORMAT>(down, MOE_SCALES_ARG(down, FORMAT), h, im, act, 1, sorted, block_count, blocks, nullptr, \
                                       y);                                                                     \
    }
// A kernel's weight parameters: `NAME` (bf16), or `NAME` codes and `NAME##_scales` (FP8); and
// the scales to hand on (null for bf16).
#define MOE_WEIGHT_PARAMS(NAME, FORMAT) MOE_WEIGHT_PARAMS_##FORMAT(NAME)
#define MOE_WEIGHT_PARAMS_WEIGHTS_BF16(NAME) const bf16_bits* __restrict__ NAME
#define MOE_WEIGHT_PARAMS_WEIGHTS_FP8(NAME) \
    const unsigned char* __restrict__ NAME, const float* __restrict__ NAME##_scales
#define MOE_SCALES_ARG(NAME, FORMAT) MOE_SCALES_ARG_##FORMAT(NAME)
#define MOE_SCALES_ARG_WEIGHTS_BF16(NAME) nullptr
#define MOE_SCALES_ARG_WEIGHTS_FP8(NAME) NAME##_scales
MOE_GROUPED_KERNELS(1, MOE_TILE_K_PIECES_T1, WEIGHTS_BF16, )
MOE_GROUPED_KERNELS(4, MOE_TILE_K_PIECES_T4, WEIGHTS_BF16, )
MOE_GROUPED_KERNELS(1, MOE_TILE_K_PIECES_T1, WEIGHTS_FP8, _fp8)
MOE_GROUPED_KERNELS(4, MOE_TILE_K_PIECES_T4, WEIGHTS_FP8, _fp8)

// Decode (a few tokens) on the CUDA cores, organised by slot rather than by expert, so no plan is
// needed: moe_gate_up_slots gives each slot (token, rank) its own blocks, and moe_down_combine_r*
// gives each token its own blocks that run all of its ranks' down rows and add them up in rank
// order with the shared expert (the combine of the tensor-core path, fused). With few tokens an
// expert is read about once per step (a repeat within the batch comes from L2). Gate/up rows are
// read the way gemv.cu's lane kernel reads them: each warp owns MOE_LANE_ROWS output rows in
// 512-byte sweeps, several sweeps in flight, many small blocks so that every SM has warps enough to
// keep the memory system busy. Each lane sums its vectors in order and the warp reduces by
// butterfly, the same for every slot whatever else is batched.
// moe_gate_up_slots: warps per block, (gate, up) row pairs per warp, 512-byte sweeps in flight per
// row (8: a whole 2048-wide row in one round trip).
// Each can be set through DELTASERVE_CUDA_DEFINES to measure variants (moe.rs reads the ones that
// shape the grid back from the same defines).
#ifndef MOE_LANE_WARPS
#define MOE_LANE_WARPS 4
#endif
#ifndef MOE_LANE_ROWS
#define MOE_LANE_ROWS 1
#endif
#ifndef MOE_LANE_UNROLL
#define MOE_LANE_UNROLL 8
#endif
// MOE_DIAG=1: moe_gate_up_slots multiplies on the tensor cores as gemv.cu's GEMV_BF16_DIAG lanes
// do (opt-in; a different summation order than dot8's, the same for every slot).
#ifndef MOE_DIAG
#define MOE_DIAG 0
#endif
// moe_gate_up_slots' block order: rank-major (1) or token-major (0).
#ifndef MOE_SLOTS_RANK_MAJOR
#define MOE_SLOTS_RANK_MAJOR 1
#endif

// Sweeps in flight per row with FP8 weights (16 codes a vector). H100, 35B-A3B FP8, session 29
// (three rounds each): one gave decode 345.9-349.2 tok/s against 326.8-327.6 with two and 329.3
// with four (MTP k=3 577.8-600.1, 574.0-587.0, 557.1): with a 2048-wide row of 128 vectors a lane
// has four sweeps of its own either way, and fewer registers leave more warps resident.
#ifndef MOE_FP8_LANE_UNROLL
#define MOE_FP8_LANE_UNROLL 1
#endif

__device__ __forceinline__ float dot8(const uint4 w, const float* x, float acc) {
    float wf[8];
    bf16x8_to_f32(w, wf);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = fmaf(wf[e], x[e], acc);
    return acc;
}

// The products of 16 codes (a 16-byte vector, inside one 128-column block) with 16 f32 activations,
// summed in order, then scaled by the block's scale into acc: gemv.cu's W8A16 step.
__device__ __forceinline__ float dot16_fp8(const uint4 codes, const float* x, float scale, float acc) {
    float wf[16];
    e4m3x4_to_f32(codes.x, &wf[0]);
    e4m3x4_to_f32(codes.y, &wf[4]);
    e4m3x4_to_f32(codes.z, &wf[8]);
    e4m3x4_to_f32(codes.w, &wf[12]);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) s = fmaf(wf[j], x[j], s);
    return fmaf(s * FP8_VALUE_UNSCALE, scale, acc);
}

__device__ __forceinline__ float warp_sum(float a) {
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    return a;
}

// The slot path's view of one rank of one token: its gate and up rows (stride h), its down rows
// (stride `rows`), their scale grids (FP8) and how many rows the gate/up projection has. Ranks 0 ..
// top_k - 1 are the routed experts (from ids); rank top_k, when `ranks` is top_k + 1, is the shared
// expert.
struct MoeSlotWeights {
    const char* gate;
    const char* up;
    const char* down;
    const float* gate_scales;  // [rows / 128, h / 128] (FP8)
    const float* up_scales;
    const float* down_scales;  // [h / 128, rows / 128] (FP8)
    int rows;
};

// The shared expert, in the routed experts' format (scales null for bf16).
struct MoeShared {
    const void* gate;  // [ims, h]
    const void* up;    // [ims, h]
    const void* down;  // [h, ims]
    const float* gate_scales;
    const float* up_scales;
    const float* down_scales;
    const float* gate_logits;  // [T]
    int ims;
};

template <int FORMAT>
__device__ __forceinline__ MoeSlotWeights moe_slot_weights(const void* gate_up, const float* gate_up_scales,
                                                           const void* down, const float* down_scales, int im, int h,
                                                           const int* ids, int top_k, const MoeShared& shared, int t,
                                                           int r) {
    constexpr int BYTES = weight_bytes<FORMAT>();
    MoeSlotWeights w;
    if (r < top_k) {
        const i64 e = ids[(i64)t * top_k + r];
        const i64 grid = (i64)(im / 128) * (h / 128);  // one matrix's scale blocks (FP8)
        w.gate = static_cast<const char*>(gate_up) + e * 2 * im * h * BYTES;
        w.up = w.gate + (i64)im * h * BYTES;
        w.down = static_cast<const char*>(down) + e * h * im * BYTES;
        w.gate_scales = FORMAT == WEIGHTS_FP8 ? gate_up_scales + e * 2 * grid : nullptr;
        w.up_scales = FORMAT == WEIGHTS_FP8 ? w.gate_scales + grid : nullptr;
        w.down_scales = FORMAT == WEIGHTS_FP8 ? down_scales + e * grid : nullptr;
        w.rows = im;
    } else {
        w.gate = static_cast<const char*>(shared.gate);
        w.up = static_cast<const char*>(shared.up);
        w.down = static_cast<const char*>(shared.down);
        w.gate_scales = shared.gate_scales;
        w.up_scales = shared.up_scales;
        w.down_scales = shared.down_scales;
        w.rows = shared.ims;
    }
    return w;
}

// act [T * ranks, act_stride] (bf16): for slot s = t * ranks + r, silu(gate x_t) * up x_t with rank
// r's weights; x in f32 (rounded to bf16 on load for bf16 weights, as it is for FP8). A lane reads
// 16-byte vectors of its rows (8 bf16 weights or 16 codes). Grid: (ceil(max rows / (MOE_LANE_WARPS *
// MOE_LANE_ROWS)), T * ranks) blocks of 32 * MOE_LANE_WARPS threads; h % 8 == 0 (FP8: % 128).
template <int FORMAT>
__device__ __forceinline__ void moe_gate_up_by_slot(const void* __restrict__ gate_up,
                                                    const float* __restrict__ gate_up_scales, int im, int h,
                                                    const float* __restrict__ x, int top_k, int ranks,
                                                    const int* __restrict__ ids, const MoeShared& shared,
                                                    bf16_bits* __restrict__ act, int act_stride) {
    constexpr bool FP8 = FORMAT == WEIGHTS_FP8;
    constexpr int VALUES = weights_per_vector<FORMAT>();
    constexpr int UNROLL = FP8 ? MOE_FP8_LANE_UNROLL : MOE_LANE_UNROLL;
    constexpr bool DIAG = MOE_DIAG && !FP8;
    const int lane = threadIdx.x & 31;
#if MOE_SLOTS_RANK_MAJOR
    // Blocks go out rank by rank, so the tokens' blocks of one rank run side by side: the shared
    // expert's rows (the last rank, the same for every token) come from DRAM once and from L2 for
    // the other tokens, where token-major order read them once a token.
    const int tokens = gridDim.y / ranks;
    const int t = blockIdx.y % tokens, rank = blockIdx.y / tokens;
#else
    const int t = blockIdx.y / ranks, rank = blockIdx.y % ranks;
#endif
    const int slot = t * ranks + rank;
    const MoeSlotWeights sw =
        moe_slot_weights<FORMAT>(gate_up, gate_up_scales, nullptr, nullptr, im, h, ids, top_k, shared, t, rank);
    const int row0 = (blockIdx.x * MOE_LANE_WARPS + (threadIdx.x >> 5)) * MOE_LANE_ROWS;
    if (row0 >= sw.rows) return;
    const float* xr = x + (i64)t * h;
    const char* wr[2][MOE_LANE_ROWS];
    const float* scale_row[2][MOE_LANE_ROWS];
#pragma unroll
    for (int r = 0; r < MOE_LANE_ROWS; ++r) {
        const int row = row0 + r;
        const bool in = row < sw.rows;
        wr[0][r] = in ? sw.gate + (i64)row * h * weight_bytes<FORMAT>() : nullptr;
        wr[1][r] = in ? sw.up + (i64)row * h * weight_bytes<FORMAT>() : nullptr;
        scale_row[0][r] = FP8 ? sw.gate_scales + (i64)(row / 128) * (h / 128) : nullptr;
        scale_row[1][r] = FP8 ? sw.up_scales + (i64)(row / 128) * (h / 128) : nullptr;
    }
    float acc[2][MOE_LANE_ROWS] = {};
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    const int vecs = h / VALUES;
    // The diagonal row-pair mma (common.cuh) on the (gate, up) row pair, as gemv.cu's
    // GEMV_BF16_DIAG lanes: every lane runs every sweep.
    const bool owner = diag_owner(lane);
    for (int v0 = lane; (DIAG ? v0 - lane : v0) < vecs; v0 += 32 * UNROLL) {
        uint4 wv[2][MOE_LANE_ROWS][UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int v = v0 + 32 * u;
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int r = 0; r < MOE_LANE_ROWS; ++r)
                    wv[s][r][u] = (v < vecs && wr[s][r]) ? load_streaming((const bf16_bits*)(wr[s][r] + 16 * (i64)v))
                                                         : zero;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int v = v0 + 32 * u;
            if (DIAG) {
                unsigned int xw[4];
                load_bf16_pairs8(xr + 8 * v, v < vecs, xw);
#pragma unroll
                for (int r = 0; r < MOE_LANE_ROWS; ++r) {
                    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_bf16_row_pair(d, wv[0][r][u], wv[1][r][u], xw);
                    if (owner) {
                        acc[0][r] += diag_piece(d, lane, false);
                        acc[1][r] += diag_piece(d, lane, true);
                    }
                }
                continue;
            }
            if (v >= vecs) continue;
            float xf[VALUES];
            if constexpr (FP8) {
#pragma unroll
                for (int q = 0; q < VALUES / 4; ++q) {
                    const float4 a = *(const float4*)(xr + VALUES * v + 4 * q);
                    xf[4 * q] = a.x;
                    xf[4 * q + 1] = a.y;
                    xf[4 * q + 2] = a.z;
                    xf[4 * q + 3] = a.w;
                }
            } else {
                load_rounded8(xr + 8 * v, xf);
            }
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int r = 0; r < MOE_LANE_ROWS; ++r) {
                    if constexpr (FP8) {
                        // Rows past the expert's end have no scales (and zero weights).
                        const float scale = wr[s][r] ? __ldg(scale_row[s][r] + v / 8) : 0.0f;
                        acc[s][r] = dot16_fp8(wv[s][r][u], xf, scale, acc[s][r]);
                    } else {
                        acc[s][r] = dot8(wv[s][r][u], xf, acc[s][r]);
                    }
                }
        }
    }
#pragma unroll
    for (int r = 0; r < MOE_LANE_ROWS; ++r) {
        const float g = warp_sum(acc[0][r]), u = warp_sum(acc[1][r]);
        if (lane == 0 && row0 + r < sw.rows) act[(i64)slot * act_stride + row0 + r] = f32_to_bf16(silu_f(g) * u);
    }
}

extern "C" __global__ void __launch_bounds__(32 * MOE_LANE_WARPS)
    moe_gate_up_slots(const bf16_bits* __restrict__ gate_up, int im, int h, const float* __restrict__ x, int top_k,
                      int ranks, const int* __restrict__ ids, const MoeShared shared, bf16_bits* __restrict__ act,
                      int act_stride) {
    AFTER_PREVIOUS_KERNEL();
    moe_gate_up_by_slot<WEIGHTS_BF16>(gate_up, nullptr, im, h, x, top_k, ranks, ids, shared, act, act_stride);
}

extern "C" __global__ void __launch_bounds__(32 * MOE_LANE_WARPS)
    moe_gate_up_slots_fp8(const unsigned char* __restrict__ gate_up, const float* __restrict__ gate_up_scales,
                          int im, int h, const float* __restrict__ x, int top_k, int ranks,
                          const int* __restrict__ ids, const MoeShared shared, bf16_bits* __restrict__ act,
                          int act_stride) {
    AFTER_PREVIOUS_KERNEL();
    moe_gate_up_by_slot<WEIGHTS_FP8>(gate_up, gate_up_scales, im, h, x, top_k, ranks, ids, shared, act, act_stride);
}

// out [T, h]: for token t = blockIdx.y and row d, the sum over routed ranks r in order of
// weights[t, r] * (down_e act[t * ranks + r])[d], then, when ranks is top_k + 1, plus
// sigmoid(gate_logits[t]) * (shared down act[t * ranks + top_k])[d]: moe_down + moe_combine for few
// tokens, in the combine's order. A block owns ROWS consecutive output rows and has one warp a rank
// (up to 16; more ranks loop): a warp loads its slot's activations once and has all ROWS of its
// expert's rows (contiguous in memory) in flight at once, each lane summing its vectors in order and
// the warp reducing by butterfly; the products meet in shared memory, where one thread per row adds
// them up in rank order. So a row's value does not depend on ROWS, and the launcher picks ROWS by
// the number of tokens (moe.rs: fewer rows a block for one token, whose grid is otherwise too small
// to keep the memory system busy). A lane takes two 8-weight vectors at a time (bf16) or one of 16
// codes (FP8: a rank's 512 columns in one sweep of the warp). Grid: (ceil(h / ROWS), T) blocks of
// 32 x warps threads; im and ims % 8 == 0 (FP8: % 128).
template <int ROWS, int FORMAT>
__device__ __forceinline__ void moe_down_by_rank(const void* __restrict__ down, const float* __restrict__ down_scales,
                                                 int h, int im, const bf16_bits* __restrict__ act, int act_stride,
                                                 int top_k, int ranks, const int* __restrict__ ids,
                                                 const float* __restrict__ weights, const MoeShared& shared,
                                                 float* __restrict__ out) {
    constexpr bool FP8 = FORMAT == WEIGHTS_FP8;
    constexpr int VALUES = weights_per_vector<FORMAT>();
    constexpr int UNROLL = FP8 ? 1 : 2;
    using W = typename WeightElement<FORMAT>::type;
    static_assert(!FP8 || 128 % ROWS == 0, "a block's rows share one row of FP8 scales");
    __shared__ float products[ROWS][MOE_MAX_EXPERTS + 1];
    const int t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int row0 = blockIdx.x * ROWS;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (int rank = warp; rank < ranks; rank += warps) {
        const MoeSlotWeights sw =
            moe_slot_weights<FORMAT>(nullptr, nullptr, down, down_scales, im, h, ids, top_k, shared, t, rank);
        const bf16_bits* a = act + ((i64)t * ranks + rank) * act_stride;
        const int cols = sw.rows;
        float acc[ROWS] = {};
        for (int v0 = lane; VALUES * v0 < act_stride; v0 += 32 * UNROLL) {
            uint4 av[UNROLL][VALUES / 8], wv[ROWS][UNROLL];
            float scale[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int v = v0 + 32 * u;
                const bool in_cols = VALUES * v < cols;
#pragma unroll
                for (int q = 0; q < VALUES / 8; ++q) av[u][q] = in_cols ? *(const uint4*)(a + VALUES * v + 8 * q) : zero;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    const bool in = in_cols && row0 + r < h;
                    const W* row = reinterpret_cast<const W*>(sw.down) + (i64)(row0 + r) * cols;
                    wv[r][u] = in ? load_streaming((const bf16_bits*)(row + VALUES * v)) : zero;
                }
                // A block's rows lie in one 128-row block of scales (ROWS divides 128, row0 is a
                // multiple of ROWS), so one scale serves them all; columns past the matrix have none
                // (and zero weights).
                scale[u] = FP8 && in_cols && row0 < h ? __ldg(sw.down_scales + (i64)(row0 / 128) * (cols / 128) + v / 8)
                                                      : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                float af[VALUES];
#pragma unroll
                for (int q = 0; q < VALUES / 8; ++q) bf16x8_to_f32(av[u][q], af + 8 * q);
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    if constexpr (FP8)
                        acc[r] = dot16_fp8(wv[r][u], af, scale[u], acc[r]);
                    else
                        acc[r] = dot8(wv[r][u], af, acc[r]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float y = warp_sum(acc[r]);
            if (lane == 0 && row0 + r < h) products[r][rank] = y;
        }
    }
    __syncthreads();
    for (int r = threadIdx.x; r < ROWS && row0 + r < h; r += blockDim.x) {
        float total = 0.0f;
        for (int rank = 0; rank < ranks; ++rank) {
            const float wq = rank < top_k ? weights[(i64)t * top_k + rank] : sigmoid_f(shared.gate_logits[t]);
            total += wq * products[r][rank];
        }
        out[(i64)t * h + row0 + r] = total;
    }
}

// moe_down_combine_r{ROWS} (bf16) and moe_down_combine_fp8_r{ROWS} (FP8: the scales after the codes).
// The FP8 kernels stop at 8 rows a block: with 16 a lane would hold 16 code vectors and their 256
// widened values, more than a 512-thread block's 128 registers a thread (ptxas spills).
#define MOE_DOWN_COMBINE_KERNEL(ROWS, FORMAT, SUFFIX)                                                          \
    extern "C" __global__ void __launch_bounds__(512) moe_down_combine##SUFFIX##_r##ROWS(                     \
        MOE_WEIGHT_PARAMS(down, FORMAT), int h, int im, const bf16_bits* __restrict__ act, int act_stride,     \
        int top_k, int ranks, const int* __restrict__ ids, const float* __restrict__ weights,                 \
        const MoeShared shared, float* __restrict__ out) {                                                     \
        AFTER_PREVIOUS_KERNEL();                                                                               \
        moe_down_by_rank<ROWS, FORMAT>(down, MOE_SCALES_ARG(down, FORMAT), h, im, act, act_stride, top_k,     \
                                       ranks, ids, weights, shared, out);                                     \
    }
MOE_DOWN_COMBINE_KERNEL(2, WEIGHTS_BF16, )
MOE_DOWN_COMBINE_KERNEL(4, WEIGHTS_BF16, )
MOE_DOWN_COMBINE_KERNEL(8, WEIGHTS_BF16, )
MOE_DOWN_COMBINE_KERNEL(16, WEIGHTS_BF16, )
MOE_DOWN_COMBINE_KERNEL(2, WEIGHTS_FP8, _fp8)
MOE_DOWN_COMBINE_KERNEL(4, WEIGHTS_FP8, _fp8)
MOE_DOWN_COMBINE_KERNEL(8, WEIGHTS_FP8, _fp8)

// out [tokens, h] = sum over ranks r of weights[t, r] * y[t * top_k + r] (rank order), plus
// sigmoid(shared_gate[t]) * shared[t] when `shared` is given.
extern "C" __global__ void moe_combine(const float* __restrict__ y, const float* __restrict__ weights, int tokens,
                                       int top_k, int h, const float* __restrict__ shared,
                                       const float* __restrict__ shared_gate, float* __restrict__ out) {
    AFTER_PREVIOUS_KERNEL();
    FOR_EACH(i, (i64)tokens * h) {
        const i64 t = i / h, d = i % h;
        float sum = 0.0f;
        for (int r = 0; r < top_k; ++r) sum += weights[t * top_k + r] * y[(t * top_k + r) * h + d];
        if (shared) sum += sigmoid_f(shared_gate[t]) * shared[i];
        out[i] = sum;
    }
}
