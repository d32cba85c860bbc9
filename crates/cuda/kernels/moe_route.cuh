// Ranking a token's experts from its router logits (moe.cu's moe_route, and the router GEMV that
// ranks in its last block, gemv.cu's gemv_router_route_*): prepended to both files by kernels.rs.

#define MOE_MAX_EXPERTS 512
#define MOE_EXPERTS_PER_LANE (MOE_MAX_EXPERTS / 32)

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
// v: the lane's logits, expert lane + 32 i in v[i] (NEG_INF past `experts`).
template <int PER_LANE>
__device__ __forceinline__ void moe_route_values(const float (&v)[PER_LANE], int experts, int top_k,
                                                 int renormalize, int* __restrict__ ids,
                                                 float* __restrict__ weights, float* chosen_logit,
                                                 double* chosen_p) {
    const int lane = threadIdx.x & 31;
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
__device__ __forceinline__ void moe_route_token(const float* __restrict__ row, int experts, int top_k,
                                                int renormalize, int* __restrict__ ids,
                                                float* __restrict__ weights, float* chosen_logit,
                                                double* chosen_p) {
    const int lane = threadIdx.x & 31;
    float v[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) v[i] = lane + 32 * i < experts ? row[lane + 32 * i] : NEG_INF;
    moe_route_values<PER_LANE>(v, experts, top_k, renormalize, ids, weights, chosen_logit, chosen_p);
}
