// Prefill attention on tensor cores, flash-attention style: a block takes FLASH_ROWS query rows of one
// sequence and one kv head, streams the sequence's visible keys through shared memory FLASH_KEYS at a
// time, and keeps an online softmax per row, so no workspace grows with the context. The pool's
// element type KV is a template parameter (`KvTile` below): a bf16 pool's rows are copied into the
// bf16 tiles as they are, an f32 pool's are rounded to bf16 on the way in (twice the bytes read).
// Rows are (token, q head of the kv head's group) pairs, token major ("packed" rows), so the K/V
// tile a block loads serves every q head that shares it.
//
// Each of the FLASH_WARPS warps owns 16 rows: S = Q K^T and O += P V run as mma.m16n8k16 (bf16 in, f32
// accumulate); P is rounded to bf16 for the second product. Q is scaled by head_dim^-0.5 * log2(e)
// before its rounding, so the softmax runs on exp2. The causal mask is each row's own visible count
// (rows[2t], as the other attention kernels read it); tiles below every row's count skip the mask.
//
// tiles [n, 4] = (first batch row of the sequence, its tokens in this batch, first packed row of the
// tile, unused); the host cuts every long sequence into tiles and leaves other rows to paged_attention.
// Dynamic shared memory: (FLASH_ROWS + 2 * FLASH_KEYS) * (D + 8) bf16 values (Q, K and V tiles, rows
// padded by 16 bytes so that ldmatrix's eight row addresses fall in different banks). 128 rows a
// block: every K/V tile loaded serves twice the rows of a 64-row block (at 32k tokens the K/V reads
// are what bounds this kernel).
#define FLASH_WARPS 8
#define FLASH_ROWS (16 * FLASH_WARPS)
#define FLASH_KEYS 64
// FLASH_KV_PIPELINE (default 1 where a block may have the shared memory, backend.rs; =0 in
// DELTASERVE_CUDA_DEFINES turns it off): with a bf16 pool the
// next K/V tile is copied into a second pair of tiles (cp.async, no registers) while the current one
// is computed, where a block otherwise waits for each tile's loads before its products (the 27B's
// 2048-token prefill ran this kernel at ~105 TFLOP/s, session 19). 2 x 2 x FLASH_KEYS x (D + 8)
// bf16 values for K/V instead of 2 x: 198 KB a block at head dim 256. An f32 pool's rows are
// rounded on the way in, so they keep the loads through registers.
#ifndef FLASH_KV_PIPELINE
#define FLASH_KV_PIPELINE 1
#endif

// 16 bytes from global to shared memory without passing through registers; zeros when !valid (then
// nothing is read from src).
__device__ __forceinline__ void flash_copy16_async(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(unsigned int* r, const bf16_bits* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned int* r, const bf16_bits* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(p)));
}

__device__ __forceinline__ void store_bf16x4(bf16_bits* dst, float4 v, float scale) {
    uint2 packed;
    packed.x = pack_bf16x2(v.x * scale, v.y * scale);
    packed.y = pack_bf16x2(v.z * scale, v.w * scale);
    *reinterpret_cast<uint2*>(dst) = packed;
}

// How K/V rows of a pool of element type KV reach the bf16 tiles: VEC elements per vector load
// (`Chunk`), each stored to shared memory as VEC bf16 values.
template <typename KV>
struct KvTile;

template <>
struct KvTile<float> {
    static constexpr bool ASYNC = false;  // rounded to bf16 on the way in
    static constexpr int VEC = 4;
    typedef float4 Chunk;
    static __device__ __forceinline__ Chunk load(const float* p) { return *reinterpret_cast<const float4*>(p); }
    static __device__ __forceinline__ Chunk zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    static __device__ __forceinline__ void store(bf16_bits* dst, Chunk v) { store_bf16x4(dst, v, 1.0f); }
};

template <>
struct KvTile<bf16_bits> {
    static constexpr bool ASYNC = true;  // copied as it is
    static constexpr int VEC = 8;
    typedef uint4 Chunk;
    static __device__ __forceinline__ Chunk load(const bf16_bits* p) { return *reinterpret_cast<const uint4*>(p); }
    static __device__ __forceinline__ Chunk zero() { return make_uint4(0u, 0u, 0u, 0u); }
    static __device__ __forceinline__ void store(bf16_bits* dst, Chunk v) { *reinterpret_cast<uint4*>(dst) = v; }
};

template <int D, typename KV>
__device__ void flash_prefill(const float* q, const KV* k_pool, const KV* v_pool, float* out, const int* tiles,
                              const int* rows, const unsigned int* blocks, int q_heads, int kv_heads, int block_size,
                              float scale_log2) {
    constexpr int STRIDE = D + 8;
    constexpr int NT = FLASH_KEYS / 8;  // 8-key tiles of S
    constexpr int DT = D / 8;           // 8-column tiles of O
    constexpr int THREADS = FLASH_WARPS * 32;
    extern __shared__ __align__(16) unsigned char flash_smem[];
    typedef KvTile<KV> Tile;
    constexpr bool PIPELINED = FLASH_KV_PIPELINE && Tile::ASYNC;
    constexpr int BUFFERS = PIPELINED ? 2 : 1;
    bf16_bits* Qs = reinterpret_cast<bf16_bits*>(flash_smem);
    // K/V tile pair b (0, and 1 when pipelined): K then V, FLASH_KEYS rows each.
    bf16_bits* const kv_tiles = Qs + FLASH_ROWS * STRIDE;
    const int group = q_heads / kv_heads;
    const int kvh = blockIdx.y;
    const int* tile = tiles + 4 * blockIdx.x;
    const int seq_start = tile[0], first = tile[2];
    const int packed = tile[1] * group;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const unsigned int* table = blocks + rows[2 * seq_start + 1];
    const i64 kv_row = (i64)kv_heads * D;

    for (int i = tid; i < FLASH_ROWS * (D / 4); i += THREADS) {
        const int r = i / (D / 4), c = (i % (D / 4)) * 4;
        const int p = first + r;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (p < packed) {
            const i64 t = seq_start + p / group;
            const int h = kvh * group + p % group;
            v = *reinterpret_cast<const float4*>(q + (t * q_heads + h) * D + c);
        }
        store_bf16x4(Qs + r * STRIDE + c, v, scale_log2);
    }
    int visible[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int p = first + warp * 16 + g + 8 * j;
        visible[j] = p < packed ? rows[2 * (seq_start + p / group)] : 0;
    }
    const int last = min(first + FLASH_ROWS, packed) - 1;
    const int kv_end = rows[2 * (seq_start + last / group)];
    const int kv_unmasked = rows[2 * (seq_start + first / group)];

    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float row_max[2] = {NEG_INF, NEG_INF}, row_sum[2] = {0.0f, 0.0f};

    // Per tile: where each key's K/V row starts in the pool (-1 past the visible keys), so that the
    // loads below depend on nothing but shared memory and can all be in flight at once.
    __shared__ i64 key_rows[BUFFERS][FLASH_KEYS];
    constexpr int VEC = Tile::VEC;
    constexpr int PER_THREAD = FLASH_KEYS * (D / VEC) / THREADS;  // chunks of K (and of V) per thread
    constexpr int BATCH = PER_THREAD < 8 ? PER_THREAD : 8;
    // Key rows of the tile at k0 into key_rows[b] (its first FLASH_KEYS threads).
    auto find_key_rows = [&](int k0, int b) {
        if (tid < FLASH_KEYS) {
            const int pos = k0 + tid;
            key_rows[b][tid] = pos < kv_end ? ((i64)table[pos / block_size] * block_size + pos % block_size) * kv_row + (i64)kvh * D : -1;
        }
    };
    // The pipelined copies of the tile whose rows are in key_rows[b] into tile pair b, committed as
    // one group.
    auto copy_tile_async = [&](int b) {
        bf16_bits* Kb = kv_tiles + 2 * b * FLASH_KEYS * STRIDE;
        bf16_bits* Vb = Kb + FLASH_KEYS * STRIDE;
        for (int i = tid; i < FLASH_KEYS * (D / 8); i += THREADS) {
            const int j = i / (D / 8), c = (i % (D / 8)) * 8;
            const i64 at = key_rows[b][j];
            flash_copy16_async(Kb + j * STRIDE + c, at >= 0 ? (const void*)(k_pool + at + c) : (const void*)k_pool, at >= 0);
            flash_copy16_async(Vb + j * STRIDE + c, at >= 0 ? (const void*)(v_pool + at + c) : (const void*)v_pool, at >= 0);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    if (PIPELINED && kv_end > 0) {
        find_key_rows(0, 0);
        __syncthreads();
        copy_tile_async(0);
    }
    int buf = 0;
    for (int k0 = 0; k0 < kv_end; k0 += FLASH_KEYS) {
        if (PIPELINED) {
            // Tile pair buf ^ 1 and key_rows[buf ^ 1] were last read before the barrier after the
            // previous tile's key rows, which every warp passed after its products.
            if (k0 + FLASH_KEYS < kv_end) {
                find_key_rows(k0 + FLASH_KEYS, buf ^ 1);
                __syncthreads();
                copy_tile_async(buf ^ 1);
                asm volatile("cp.async.wait_group 1;" ::: "memory");  // this tile's copies
            } else {
                asm volatile("cp.async.wait_group 0;" ::: "memory");
            }
            __syncthreads();
        } else {
            __syncthreads();  // the previous tile is consumed (and, the first time, Q is stored)
            find_key_rows(k0, 0);
            __syncthreads();
            bf16_bits* Ks = kv_tiles;
            bf16_bits* Vs = Ks + FLASH_KEYS * STRIDE;
#pragma unroll 1
            for (int b0 = 0; b0 < PER_THREAD; b0 += BATCH) {
                typename Tile::Chunk kr[BATCH], vr[BATCH];
#pragma unroll
                for (int u = 0; u < BATCH; ++u) {
                    const int i = tid + (b0 + u) * THREADS;
                    const int j = i / (D / VEC), c = (i % (D / VEC)) * VEC;
                    const i64 at = key_rows[0][j];
                    kr[u] = at >= 0 ? Tile::load(k_pool + at + c) : Tile::zero();
                    vr[u] = at >= 0 ? Tile::load(v_pool + at + c) : Tile::zero();
                }
#pragma unroll
                for (int u = 0; u < BATCH; ++u) {
                    const int i = tid + (b0 + u) * THREADS;
                    const int j = i / (D / VEC), c = (i % (D / VEC)) * VEC;
                    Tile::store(Ks + j * STRIDE + c, kr[u]);
                    Tile::store(Vs + j * STRIDE + c, vr[u]);
                }
            }
            __syncthreads();
        }
        const bf16_bits* Ks = kv_tiles + 2 * buf * FLASH_KEYS * STRIDE;
        const bf16_bits* Vs = Ks + FLASH_KEYS * STRIDE;
        buf ^= PIPELINED ? 1 : 0;

        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D; kk += 16) {
            unsigned int a[4];
            ldmatrix_x4(a, Qs + (warp * 16 + (lane & 15)) * STRIDE + kk + (lane >> 4) * 8);
#pragma unroll
            for (int n = 0; n < NT; n += 2) {
                unsigned int b[4];
                ldmatrix_x4(b, Ks + (n * 8 + (lane & 7) + ((lane >> 4) << 3)) * STRIDE + kk + ((lane >> 3) & 1) * 8);
                mma_bf16(s[n], a[0], a[1], a[2], a[3], b[0], b[1]);
                mma_bf16(s[n + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
            }
        }

        const bool unmasked = k0 + FLASH_KEYS <= kv_unmasked;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            if (!unmasked) {
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    const int key = k0 + n * 8 + 2 * tig;
                    if (key >= visible[j]) s[n][2 * j] = NEG_INF;
                    if (key + 1 >= visible[j]) s[n][2 * j + 1] = NEG_INF;
                }
            }
            float tile_max = NEG_INF;
#pragma unroll
            for (int n = 0; n < NT; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * j], s[n][2 * j + 1]));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
            const float new_max = fmaxf(row_max[j], tile_max);
            const float base = new_max == NEG_INF ? 0.0f : new_max;  // a row with nothing visible yet
            const float rescale = exp2f(row_max[j] - base);
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                s[n][2 * j] = exp2f(s[n][2 * j] - base);
                s[n][2 * j + 1] = exp2f(s[n][2 * j + 1] - base);
                sum += s[n][2 * j] + s[n][2 * j + 1];
            }
            row_sum[j] = row_sum[j] * rescale + sum;
            row_max[j] = new_max;
#pragma unroll
            for (int d = 0; d < DT; ++d) {
                o[d][2 * j] *= rescale;
                o[d][2 * j + 1] *= rescale;
            }
        }

#pragma unroll
        for (int ks = 0; ks < FLASH_KEYS / 16; ++ks) {
            const unsigned int a0 = pack_bf16x2(s[2 * ks][0], s[2 * ks][1]);
            const unsigned int a1 = pack_bf16x2(s[2 * ks][2], s[2 * ks][3]);
            const unsigned int a2 = pack_bf16x2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
            const unsigned int a3 = pack_bf16x2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
#pragma unroll
            for (int d = 0; d < DT; d += 2) {
                unsigned int b[4];
                ldmatrix_x4_trans(b, Vs + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + d * 8 + (lane >> 4) * 8);
                mma_bf16(o[d], a0, a1, a2, a3, b[0], b[1]);
                mma_bf16(o[d + 1], a0, a1, a2, a3, b[2], b[3]);
            }
        }
    }

#pragma unroll
    for (int j = 0; j < 2; ++j) {
        float total = row_sum[j];
        total += __shfl_xor_sync(0xffffffffu, total, 1);
        total += __shfl_xor_sync(0xffffffffu, total, 2);
        const int p = first + warp * 16 + g + 8 * j;
        if (p >= packed) continue;
        const i64 t = seq_start + p / group;
        const int h = kvh * group + p % group;
        float* orow = out + (t * q_heads + h) * D;
        const float inv = 1.0f / total;
#pragma unroll
        for (int d = 0; d < DT; ++d) {
            *reinterpret_cast<float2*>(orow + d * 8 + 2 * tig) = make_float2(o[d][2 * j] * inv, o[d][2 * j + 1] * inv);
        }
    }
}

// One kernel per (head dim, pool element type): `flash_prefill_d<D>_f32` and `flash_prefill_d<D>_bf16`.
#define FLASH_PREFILL(D, NAME, KV)                                                                             \
    extern "C" __global__ void __launch_bounds__(FLASH_WARPS * 32)                                             \
        flash_prefill_d##D##_##NAME(const float* q, const KV* k_pool, const KV* v_pool, float* out,            \
                                    const int* tiles, const int* rows, const unsigned int* blocks, int q_heads, \
                                    int kv_heads, int block_size, float scale_log2) {                          \
        AFTER_PREVIOUS_KERNEL();                                                                               \
        flash_prefill<D, KV>(q, k_pool, v_pool, out, tiles, rows, blocks, q_heads, kv_heads, block_size,       \
                             scale_log2);                                                                      \
    }
#define FLASH_PREFILL_ALL_D(NAME, KV) \
    FLASH_PREFILL(32, NAME, KV)       \
    FLASH_PREFILL(64, NAME, KV)       \
    FLASH_PREFILL(128, NAME, KV)      \
    FLASH_PREFILL(256, NAME, KV)
FLASH_PREFILL_ALL_D(f32, float)
FLASH_PREFILL_ALL_D(bf16, bf16_bits)
