// Token sampling on the device, one block per requested row of logits [rows, vocab], so logits never
// leave the GPU. The semantics are the engine's host sampler (crates/engine/src/sampler.rs): greedy is
// the argmax with ties to the lower id; otherwise temperature, then top-k, top-p and min-p, each of
// which keeps a prefix of the tokens ordered by logit (descending, ties by lower id), then one draw
// decided by the given uniform number.
//
// The row is never sorted. Logits map to order-preserving integer keys; a radix select (4 passes of 8
// bits) finds the key of the k-th token for top-k. With a top-k, the tokens whose key reaches it (at
// most TOP_K_CAP) are gathered into shared memory and sorted there by (key desc, id asc): the first k
// are the top-k prefix, top-p cuts it where its running mass reaches top-p, and min-p and the draw
// walk the kept ones in id order (sample_from_top_k). Without one (or with more candidates), the
// radix select also finds the key where the mass reaches top-p, a prefix is (key K, ties r): a token
// is kept when its key is above K, or equal to K and it is among the first r such tokens by id, and
// the draw walks the kept tokens of the whole row in id order. Either way the draw is a different map
// from the uniform number to a token than the host's, drawing from the same distribution.
//
// Masses are summed in double, so they agree with the host's f64 sums to ~1e-7 (the f32 exponentials);
// only a top-p boundary that close to a cumulative sum can fall differently.

#define RADIX_BINS 256

// Exclusive prefix sum of `v` over the block (blockDim.x a multiple of 32, at most 1024); `total`
// gets the block's sum. `scratch` holds 33 values. Deterministic: a fixed tree of additions.
template <typename T>
__device__ T block_exclusive_scan(T v, T* scratch, T* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    T inclusive = v;
    for (int o = 1; o < 32; o <<= 1) {
        const T n = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += n;
    }
    __syncthreads();  // a previous scan may still be reading `scratch`
    if (lane == 31) scratch[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        const T own = lane < warps ? scratch[lane] : (T)0;
        T running = own;
        for (int o = 1; o < 32; o <<= 1) {
            const T n = __shfl_up_sync(0xffffffffu, running, o);
            if (lane >= o) running += n;
        }
        if (lane < warps) scratch[lane] = running - own;
        if (lane == 31) scratch[32] = running;
    }
    __syncthreads();
    *total = scratch[32];
    return scratch[warp] + inclusive - v;
}

// Sum over the block in a fixed order; every thread gets it. `scratch` holds 33 values.
__device__ double block_sum_double(double v, double* scratch) {
    double total;
    block_exclusive_scan(v, scratch, &total);
    return total;
}

// A prefix of the order (key desc, id asc) is (key, ties): tokens with a larger key, and the first
// `ties` tokens (by id) with that key; ties < 0 means all of them (the whole vocabulary is (0, -1)).
__device__ __forceinline__ bool below_prefix(unsigned int k, unsigned int key, int ties) {
    return k < key || (k == key && ties >= 0);
}

// The argmax's and the full-row passes' 16-byte loads a thread has in flight.
#define ARGMAX_LOADS 4

// Calls visit(valid, i, logit) for every token i of the row once, reading it in 16-byte loads,
// ARGMAX_LOADS of them in flight a thread (one scalar load at a time left a 248k-token row's pass
// latency-bound in one block). Every lane of a warp makes the same number of calls (valid false for
// padding), so `visit` may use warp-collective instructions.
template <typename Visit>
__device__ __forceinline__ void for_each_logit(const float* x, int vocab, Visit visit) {
    const int lane = threadIdx.x & 31;
    const int head = min(vocab, (int)((16u - ((unsigned int)(size_t)x & 15u)) & 15u) / 4);
    const float4* xv = (const float4*)(x + head);
    const int vectors = (vocab - head) / 4;
    const int tail = head + 4 * vectors;
    if (threadIdx.x < 32) {
        // At most 3 tokens before the first 16-byte boundary and 3 after the last whole vector.
        const int i = lane < head ? lane : tail + lane - head;
        const bool valid = lane < head || (i < vocab && lane - head < 4);
        visit(valid, valid ? i : 0, valid ? x[i] : 0.0f);
    }
    for (int v0 = threadIdx.x - lane; v0 < vectors; v0 += ARGMAX_LOADS * blockDim.x) {
        float4 q[ARGMAX_LOADS];
#pragma unroll
        for (int u = 0; u < ARGMAX_LOADS; ++u) {
            const int v = v0 + lane + u * blockDim.x;
            q[u] = v < vectors ? xv[v] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < ARGMAX_LOADS; ++u) {
            const int v = v0 + lane + u * blockDim.x;
            const bool valid = v < vectors;
            const int i = head + 4 * v;
            visit(valid, i, q[u].x);
            visit(valid, i + 1, q[u].y);
            visit(valid, i + 2, q[u].z);
            visit(valid, i + 3, q[u].w);
        }
    }
}

#define NO_BIN RADIX_BINS

// hist_count[bin] += 1 for each lane's bin (NO_BIN: none), one shared atomic per distinct bin of the
// warp: a row's logits share a few exponents, so the first radix pass puts nearly every token of a
// warp in one bin, and per-lane atomics on it serialised 32 deep. Later passes count few tokens:
// a warp with none skips the match.
__device__ __forceinline__ void count_in_bin(unsigned int bin, unsigned int* hist_count) {
    if (__ballot_sync(0xffffffffu, bin != NO_BIN) == 0u) return;
    const unsigned int peers = __match_any_sync(0xffffffffu, bin);
    if (bin != NO_BIN && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist_count[bin], __popc(peers));
}

// hist_mass[bin] += mass for each lane's bin: the warp sums each distinct bin's masses (a butterfly
// over the lanes in it) and adds that once, for the reason count_in_bin gives.
__device__ __forceinline__ void add_mass_in_bin(unsigned int bin, double mass, double* hist_mass) {
    unsigned int left = __ballot_sync(0xffffffffu, bin != NO_BIN);
    while (left != 0u) {
        const int leader = __ffs(left) - 1;
        const unsigned int b = __shfl_sync(0xffffffffu, bin, leader);
        double sum = bin == b ? mass : 0.0;
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if ((threadIdx.x & 31) == leader) atomicAdd(&hist_mass[b], sum);
        left &= ~__ballot_sync(0xffffffffu, bin == b);
    }
}

// The smallest prefix holding `need` tokens (count select) or reaching probability mass `need_mass`
// (mass select), among the tokens of the prefix (`within_key`, `within_ties`); the result goes to
// `out_key` / `out_ties`. Returns false when rounding left the mass short of `need_mass` (the caller
// then keeps the whole `within` prefix). Every thread of the block must call it.
__device__ bool radix_select(const float* x, int vocab, bool by_mass, int need, double need_mass, float max_x,
                             float inv_t, unsigned int within_key, int within_ties, unsigned int* hist_count,
                             double* hist_mass, unsigned int* out_key, int* out_ties, int* shared_flag) {
    unsigned int prefix = 0, mask = 0;
    const double within_weight = (double)expf((key_value(within_key) - max_x) * inv_t);
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < RADIX_BINS; b += blockDim.x) {
            hist_count[b] = 0;
            hist_mass[b] = 0.0;
        }
        __syncthreads();
        for_each_logit(x, vocab, [&](bool valid, int, float logit) {
            const unsigned int k = order_key(logit);
            // A bounded tie group at the `within` key is added below as exactly `within_ties` tokens.
            const bool counted = valid && (k & mask) == prefix && !below_prefix(k, within_key, within_ties);
            const unsigned int bin = counted ? (k >> shift) & 255u : NO_BIN;
            count_in_bin(bin, hist_count);
            if (by_mass) add_mass_in_bin(bin, counted ? (double)expf((logit - max_x) * inv_t) : 0.0, hist_mass);
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            if (within_ties >= 0 && (within_key & mask) == prefix) {
                const unsigned int d = (within_key >> shift) & 255u;
                hist_count[d] += (unsigned int)within_ties;
                hist_mass[d] += (double)within_ties * within_weight;
            }
            int chosen = -1;
            long long count_before = 0;
            double mass_before = 0.0;
            for (int d = 255; d >= 0; --d) {
                if (hist_count[d] == 0) continue;
                const bool reached = by_mass ? mass_before + hist_mass[d] >= need_mass
                                             : count_before + (long long)hist_count[d] >= need;
                if (reached) {
                    chosen = d;
                    break;
                }
                count_before += hist_count[d];
                mass_before += hist_mass[d];
            }
            shared_flag[0] = chosen;
            if (chosen >= 0) {
                out_key[0] = prefix | ((unsigned int)chosen << shift);
                // What is still needed inside the chosen bin, for the next pass.
                hist_mass[0] = need_mass - mass_before;
                out_ties[0] = need - (int)count_before;
            }
        }
        __syncthreads();
        if (shared_flag[0] < 0) return false;
        prefix = out_key[0];
        mask |= 255u << shift;
        need_mass = hist_mass[0];
        need = out_ties[0];
        __syncthreads();
    }
    // `prefix` is now the whole key: how many of its tied tokens are needed.
    if (threadIdx.x == 0) hist_count[0] = 0;
    __syncthreads();
    unsigned int local = 0;
    for_each_logit(x, vocab, [&](bool valid, int, float logit) { local += valid && order_key(logit) == prefix; });
    if (local) atomicAdd(&hist_count[0], local);
    __syncthreads();
    if (threadIdx.x == 0) {
        int available = (int)hist_count[0];
        if (prefix == within_key && within_ties >= 0 && within_ties < available) available = within_ties;
        int ties = need;
        if (by_mass) {
            const double w = (double)expf((key_value(prefix) - max_x) * inv_t);
            ties = w > 0.0 ? (int)ceil(need_mass / w) : available;
        }
        ties = ties < 1 ? 1 : (ties > available ? available : ties);
        out_key[0] = prefix;
        out_ties[0] = ties;
    }
    __syncthreads();
    return true;
}

// The weight of a token walked in id order if the final prefix (key, ties; `tie_rank` counts the tied
// tokens seen so far) and min-p keep it, else 0 (a kept token's weight underflowing to 0 cannot be
// drawn either way).
__device__ __forceinline__ float kept_weight(float logit, unsigned int keep_key, int keep_ties, int* tie_rank,
                                             float max_x, float inv_t, float min_p) {
    const unsigned int k = order_key(logit);
    bool kept = k > keep_key;
    if (k == keep_key) kept = keep_ties < 0 || (*tie_rank)++ < keep_ties;
    if (!kept) return 0.0f;
    const float w = expf((logit - max_x) * inv_t);
    return (min_p > 0.0f && w < min_p) ? 0.0f : w;
}

__device__ __forceinline__ void consider_for_argmax(unsigned int k, int i, unsigned int* best_key, int* best_id) {
    if (k > *best_key || (k == *best_key && i < *best_id)) {
        *best_key = k;
        *best_id = i;
    }
}

// The most tokens sample_from_top_k holds in shared memory: candidates (key >= the top-k key) past it
// take the whole-row path.
#define TOP_K_CAP 2048

// Sorts keys[0, n) ascending, n a power of two <= 2 * blockDim.x (bitonic; every thread must call it).
__device__ void block_sort_u64(unsigned long long* keys, int n) {
    for (int k = 2; k <= n; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int partner = i ^ j;
                if (partner > i) {
                    const unsigned long long a = keys[i], b = keys[partner];
                    if ((a > b) == ((i & k) == 0)) {
                        keys[i] = b;
                        keys[partner] = a;
                    }
                }
            }
            __syncthreads();
        }
}

__device__ __forceinline__ int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

// Exclusive and inclusive running sums of values[0, n) (n <= 2 * blockDim.x) in index order, two
// consecutive values a thread; `total` gets the sum. Every thread must call it.
__device__ void block_running_sums2(const double* values, int n, double* before, double* through,
                                    double* scratch, double* total) {
    const int i = 2 * threadIdx.x;
    const double a = i < n ? values[i] : 0.0, b = i + 1 < n ? values[i + 1] : 0.0;
    const double base = block_exclusive_scan(a + b, scratch, total);
    before[0] = base;
    through[0] = base + a;
    before[1] = base + a;
    through[1] = base + a + b;
}

// Top-k sampling with the kept tokens in shared memory: every token whose key reaches `keep_key`
// (the k-th token's, from the radix select) is gathered in one pass over the row (n of them, n >= k;
// false when n > TOP_K_CAP, for the caller's whole-row path) and sorted by (key desc, id asc), the
// order whose first k tokens are the top-k prefix; top-p cuts that prefix where its running mass
// reaches top_p of the whole; min-p and the draw then walk the kept tokens in id order as the
// whole-row path does. `*pick` gets the token. Every thread must call it.
__device__ bool sample_from_top_k(const float* x, int vocab, unsigned int keep_key, int top_k, float max_x,
                                  float inv_t, float top_p, float min_p, double uniform, unsigned long long* keys,
                                  double* weights, int* count, int* cut, double* scratch, int* pick) {
    const int lane = threadIdx.x & 31;
    if (threadIdx.x == 0) *count = 0;
    __syncthreads();
    for_each_logit(x, vocab, [&](bool valid, int i, float logit) {
        const unsigned int k = order_key(logit);
        const bool take = valid && k >= keep_key;
        const unsigned int takers = __ballot_sync(0xffffffffu, take);
        if (takers == 0u) return;
        int base = 0;
        if (lane == 0) base = atomicAdd(count, __popc(takers));
        base = __shfl_sync(0xffffffffu, base, 0);
        const int slot = base + __popc(takers & ((1u << lane) - 1u));
        if (take && slot < TOP_K_CAP) keys[slot] = ((unsigned long long)~k << 32) | (unsigned int)i;
    });
    __syncthreads();
    const int n = *count;
    if (n > TOP_K_CAP || n < top_k) return false;
    int sorted = pow2_at_least(n);
    for (int i = n + threadIdx.x; i < sorted; i += blockDim.x) keys[i] = ~0ull;
    __syncthreads();
    block_sort_u64(keys, sorted);

    int kept = top_k;
    if (top_p < 1.0f) {
        for (int j = threadIdx.x; j < kept; j += blockDim.x)
            weights[j] = (double)expf((key_value(~(unsigned int)(keys[j] >> 32)) - max_x) * inv_t);
        if (threadIdx.x == 0) *cut = kept - 1;
        __syncthreads();
        double before[2], through[2], total;
        block_running_sums2(weights, kept, before, through, scratch, &total);
        const double need = (double)top_p * total;
        for (int q = 0; q < 2; ++q) {
            const int j = 2 * threadIdx.x + q;
            if (j < kept && through[q] >= need && before[q] < need) atomicMin(cut, j);
        }
        if (threadIdx.x == 0 && need <= 0.0) *cut = 0;
        __syncthreads();
        kept = *cut + 1;
    }

    // The kept tokens by id, for the draw.
    sorted = pow2_at_least(kept);
    for (int j = threadIdx.x; j < sorted; j += blockDim.x) {
        keys[j] = j < kept ? ((unsigned long long)(unsigned int)keys[j] << 32) | ~(unsigned int)(keys[j] >> 32)
                           : ~0ull;
    }
    __syncthreads();
    block_sort_u64(keys, sorted);
    for (int j = threadIdx.x; j < kept; j += blockDim.x) {
        const float w = expf((key_value((unsigned int)keys[j]) - max_x) * inv_t);
        weights[j] = (min_p > 0.0f && w < min_p) ? 0.0 : (double)w;
    }
    if (threadIdx.x == 0) {
        *pick = vocab;
        *cut = -1;
    }
    __syncthreads();
    double before[2], through[2], total;
    block_running_sums2(weights, kept, before, through, scratch, &total);
    const double target = uniform * total;
    for (int q = 0; q < 2; ++q) {
        const int j = 2 * threadIdx.x + q;
        if (j >= kept || weights[j] == 0.0) continue;
        atomicMax(cut, j);  // rounding can leave the target past the last boundary: the last kept takes it
        if (target >= before[q] && target < through[q]) atomicMin(pick, j);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const int j = *pick < vocab ? *pick : max(*cut, 0);
        *pick = (int)(keys[j] >> 32);
    }
    __syncthreads();
    return true;
}

// One row's settings (DeviceRowSampling in src/sampling.rs).
struct RowParams {
    double uniform;
    float temperature, top_p, min_p;
    int row, top_k, pad;
};

// params[n] -> out[n] token ids. One block per row, a multiple of 32 threads (at most 1024).
extern "C" __global__ void sample_rows(const float* logits, int vocab, const RowParams* params, int* out) {
    AFTER_PREVIOUS_KERNEL();
    __shared__ unsigned int hist_count[RADIX_BINS];
    __shared__ double hist_mass[RADIX_BINS];
    __shared__ double scan_double[33];
    __shared__ int scan_int[33];
    __shared__ unsigned int best_keys[32];
    __shared__ int best_ids[32];
    __shared__ unsigned int sel_key;
    __shared__ int sel_ties;
    __shared__ int flag;
    __shared__ int chosen;
    __shared__ unsigned long long top_keys[TOP_K_CAP];
    __shared__ double top_weights[TOP_K_CAP];
    __shared__ int top_count, top_cut;

    const int r = blockIdx.x;
    const RowParams p = params[r];
    const float* x = logits + (i64)p.row * vocab;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;

    // Argmax: the largest key, ties to the lower id. That is a maximum over (key, id) pairs, so the
    // order a thread sees them in does not change the token: the row is read in 16-byte loads,
    // ARGMAX_LOADS of them in flight a thread (one scalar load a thread at a time kept a 248k-token
    // row at ~100 us in one block on the H200).
    unsigned int best_key = 0;
    int best_id = vocab;
    const int head = min(vocab, (int)((16u - ((unsigned int)(size_t)x & 15u)) & 15u) / 4);
    for (int i = tid; i < head; i += blockDim.x) consider_for_argmax(order_key(x[i]), i, &best_key, &best_id);
    const float4* xv = (const float4*)(x + head);
    const int vectors = (vocab - head) / 4;
    for (int v0 = tid; v0 < vectors; v0 += ARGMAX_LOADS * blockDim.x) {
        float4 q[ARGMAX_LOADS];
#pragma unroll
        for (int u = 0; u < ARGMAX_LOADS; ++u) {
            const int v = v0 + u * blockDim.x;
            q[u] = v < vectors ? xv[v] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < ARGMAX_LOADS; ++u) {
            const int v = v0 + u * blockDim.x;
            if (v >= vectors) break;
            const int i = head + 4 * v;
            consider_for_argmax(order_key(q[u].x), i, &best_key, &best_id);
            consider_for_argmax(order_key(q[u].y), i + 1, &best_key, &best_id);
            consider_for_argmax(order_key(q[u].z), i + 2, &best_key, &best_id);
            consider_for_argmax(order_key(q[u].w), i + 3, &best_key, &best_id);
        }
    }
    for (int i = head + 4 * vectors + tid; i < vocab; i += blockDim.x)
        consider_for_argmax(order_key(x[i]), i, &best_key, &best_id);
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned int k = __shfl_xor_sync(0xffffffffu, best_key, o);
        const int id = __shfl_xor_sync(0xffffffffu, best_id, o);
        if (k > best_key || (k == best_key && id < best_id)) {
            best_key = k;
            best_id = id;
        }
    }
    if (lane == 0) {
        best_keys[warp] = best_key;
        best_ids[warp] = best_id;
    }
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < warps; ++w) {
            if (best_keys[w] > best_keys[0] || (best_keys[w] == best_keys[0] && best_ids[w] < best_ids[0])) {
                best_keys[0] = best_keys[w];
                best_ids[0] = best_ids[w];
            }
        }
    }
    __syncthreads();
    const int argmax = best_ids[0];
    const float max_x = key_value(best_keys[0]);
    const float temperature = p.temperature, top_p = p.top_p, min_p = p.min_p;
    const float inv_t = temperature > 0.0f ? 1.0f / temperature : 0.0f;
    // Greedy; a temperature so small that 1/T overflows is greedy too; min-p above 1 keeps only the
    // most likely token (the host keeps at least one).
    if (!(temperature > 0.0f) || !(inv_t < 1e30f) || min_p > 1.0f) {
        if (tid == 0) out[r] = argmax;
        return;
    }

    // Top-k: the prefix of k tokens. The whole vocabulary is the prefix (key 0, vocab ties).
    unsigned int keep_key = 0;
    int keep_ties = -1;
    const int top_k = p.top_k;
    if (top_k > 0 && top_k < vocab) {
        radix_select(x, vocab, false, top_k, 0.0, max_x, inv_t, 0u, -1, hist_count, hist_mass, &sel_key,
                     &sel_ties, &flag);
        keep_key = sel_key;
        keep_ties = sel_ties;
        if (top_k <= TOP_K_CAP && 2 * (int)blockDim.x >= TOP_K_CAP &&
            sample_from_top_k(x, vocab, keep_key, top_k, max_x, inv_t, top_p, min_p, p.uniform, top_keys,
                              top_weights, &top_count, &top_cut, scan_double, &chosen)) {
            if (tid == 0) out[r] = chosen;
            return;
        }
    }

    // Top-p over the top-k prefix: the smallest prefix holding top_p of its mass.
    if (top_p < 1.0f) {
        double mass = 0.0;
        for_each_logit(x, vocab, [&](bool valid, int, float logit) {
            if (valid && !below_prefix(order_key(logit), keep_key, keep_ties))
                mass += (double)expf((logit - max_x) * inv_t);
        });
        double total = block_sum_double(mass, scan_double);
        if (keep_ties >= 0) total += (double)keep_ties * (double)expf((key_value(keep_key) - max_x) * inv_t);
        const bool found = radix_select(x, vocab, true, 0, (double)top_p * total, max_x, inv_t, keep_key,
                                        keep_ties, hist_count, hist_mass, &sel_key, &sel_ties, &flag);
        if (found) {
            keep_key = sel_key;
            keep_ties = sel_ties;
        }
    }

    // The draw: contiguous id ranges per thread, so "the first r tied tokens" and the cumulative
    // mass both follow id order through block scans.
    const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    const int lo = min(tid * chunk, vocab), hi = min(lo + chunk, vocab);
    int ties_here = 0;
    for (int i = lo; i < hi; ++i) ties_here += order_key(x[i]) == keep_key ? 1 : 0;
    int ties_total;
    const int tie_base = block_exclusive_scan(ties_here, scan_int, &ties_total);
    double mass_here = 0.0;
    int last_kept = -1;
    {
        int tie_rank = tie_base;
        for (int i = lo; i < hi; ++i) {
            const float w = kept_weight(x[i], keep_key, keep_ties, &tie_rank, max_x, inv_t, min_p);
            if (w == 0.0f) continue;
            mass_here += (double)w;
            last_kept = i;
        }
    }
    double mass_total;
    const double mass_base = block_exclusive_scan(mass_here, scan_double, &mass_total);
    if (tid == 0) chosen = vocab;
    __syncthreads();
    const double target = p.uniform * mass_total;
    if (mass_here > 0.0 && target >= mass_base && target < mass_base + mass_here) {
        double cumulative = mass_base;
        int tie_rank = tie_base;
        int pick = last_kept;
        for (int i = lo; i < hi; ++i) {
            const float w = kept_weight(x[i], keep_key, keep_ties, &tie_rank, max_x, inv_t, min_p);
            if (w == 0.0f) continue;
            cumulative += (double)w;
            if (target < cumulative) {
                pick = i;
                break;
            }
        }
        atomicMin(&chosen, pick);
    }
    // Rounding can leave the target at or past the last boundary: the last kept token takes it.
    int last = last_kept;
    for (int o = 16; o > 0; o >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
    if (lane == 0) best_ids[warp] = last;
    __syncthreads();
    if (tid == 0) {
        int result = chosen;
        if (result >= vocab) {
            result = argmax;
            int fallback = -1;
            for (int w = 0; w < warps; ++w) fallback = max(fallback, best_ids[w]);
            if (fallback >= 0) result = fallback;
        }
        out[r] = result;
    }
}

// out[n] = the logits row src_rows[n], every token its mask forbids at -infinity: bit id % 32 of
// words[word_offsets[n] + id / 32] (a grammar's token mask); word_offsets[n] < 0 copies the row
// whole. Grid (ceil(vocab / blockDim.x), rows); one thread per token.
extern "C" __global__ void mask_rows(const float* logits, int vocab, const int* src_rows, const int* word_offsets,
                                     const unsigned int* words, float* out) {
    AFTER_PREVIOUS_KERNEL();
    const int n = blockIdx.y, id = blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= vocab) return;
    const int offset = word_offsets[n];
    const bool allowed = offset < 0 || ((words[offset + id / 32] >> (id % 32)) & 1u);
    out[(i64)n * vocab + id] = allowed ? logits[(i64)src_rows[n] * vocab + id] : NEG_INF;
}
