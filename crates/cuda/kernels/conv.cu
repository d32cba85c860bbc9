// Depthwise causal conv1d + SiLU over each sequence's new tokens, with the sequence's conv window
// (the last `history` pre-conv inputs, oldest first) as the history. One thread per (sequence,
// channel) walks the sequence's tokens in order, keeping the window in registers; the window is
// written back to the sequence's slot at the end and to a snapshot slot after tokens that have one.
//
// seqs [n_seqs, 4] = (start row, new tokens, state slot, first snapshot index or -1);
// snaps = the snapshot slots of all sequences back to back.

#define MAX_HISTORY 7

// One token: the conv output for input `now` after the window `win`, then the window moved on by
// one (oldest entry out, `now` in). The taps and the window are right-aligned (below).
__device__ __forceinline__ float conv_step(const float* taps, float* win, float now) {
    float acc = 0.0f;
#pragma unroll
    for (int m = 0; m < MAX_HISTORY; ++m) acc = fmaf(taps[m], win[m], acc);
    acc = fmaf(taps[MAX_HISTORY], now, acc);
#pragma unroll
    for (int m = 0; m < MAX_HISTORY - 1; ++m) win[m] = win[m + 1];
    win[MAX_HISTORY - 1] = now;
    return silu_f(acc);
}

// The window's `history` live entries into the slot at `dst`.
__device__ __forceinline__ void store_window(float* dst, const float* win, int lead, int conv_dim, int c) {
#pragma unroll
    for (int m = 0; m < MAX_HISTORY; ++m) {
        if (m >= lead) dst[(i64)(m - lead) * conv_dim + c] = win[m];
    }
}

// The window and the taps are kept right-aligned in fixed-size register arrays: slot m holds
// window entry m - (MAX_HISTORY - history), the leading slots hold zero taps. Every register index
// is then a compile-time constant (a run-time index would move the arrays to local memory).
extern "C" __global__ void causal_conv1d(const float* x, const float* w, float* conv_state, float* out,
                                         const int* seqs, const int* snaps, int conv_dim, int history) {
    AFTER_PREVIOUS_KERNEL();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= conv_dim) return;
    const int* seq = seqs + 4 * blockIdx.y;
    const int start = seq[0], len = seq[1], slot = seq[2], snap = seq[3];
    const int kernel = history + 1;
    const int lead = MAX_HISTORY - history;
    const i64 slot_len = (i64)history * conv_dim;
    float win[MAX_HISTORY];
    float taps[MAX_HISTORY + 1];
#pragma unroll
    for (int m = 0; m < MAX_HISTORY; ++m) {
        win[m] = m >= lead ? conv_state[slot * slot_len + (i64)(m - lead) * conv_dim + c] : 0.0f;
    }
#pragma unroll
    for (int m = 0; m <= MAX_HISTORY; ++m) taps[m] = m >= lead ? w[(i64)c * kernel + (m - lead)] : 0.0f;
    for (int i = 0; i < len; ++i) {
        const i64 row = (i64)(start + i) * conv_dim + c;
        out[row] = conv_step(taps, win, x[row]);
        if (snap >= 0) store_window(conv_state + (i64)snaps[snap + i] * slot_len, win, lead, conv_dim, c);
    }
    store_window(conv_state + slot * slot_len, win, lead, conv_dim, c);
}

// The same conv for long sequences (prefill), parallel over tokens: a thread walks CONV_SEGMENT
// consecutive rows of one channel with the window in registers as above, taking it from x, or from
// the old window for positions before a sequence's new tokens, where the segment starts or a new
// sequence begins; it writes the window after a token to the token's snapshot slot, if any. Same
// taps in the same order as above, so results are bitwise those of the loop above. The new windows
// are written afterwards by `conv_window_update`, once every row has read the old ones.
// row_seqs[T] = index of each row's sequence in `seqs`. Grid (channel blocks, segments; a block row
// strides over the segments by gridDim.y).
#define CONV_SEGMENT 16
// CONV_PRELOAD=0 (DELTASERVE_CUDA_DEFINES) loads each input when its step needs it, to measure.
// (Loading the rows before the segment with them as well measured no faster: 27B prefill of 2048,
// H100, 9,472-9,484 against 9,478-9,531 tok/s, session 20.)
#ifndef CONV_PRELOAD
#define CONV_PRELOAD 1
#endif

__device__ __forceinline__ float conv_input(const float* x, const float* conv_state, i64 slot_len, int slot, int start,
                                            int rel, int conv_dim, int history, int c) {
    return rel >= 0 ? x[(i64)(start + rel) * conv_dim + c]
                    : conv_state[slot * slot_len + (i64)(history + rel) * conv_dim + c];
}

// Snapshot slots are other slots of the same pool, so `conv_state` is both read (the sequence's
// own slot) and written (its snapshot slots).
extern "C" __global__ void causal_conv1d_tokens(const float* x, const float* w, float* conv_state, float* out, const int* seqs, const int* snaps, const int* row_seqs,
                                                i64 tokens, int conv_dim, int history) {
    AFTER_PREVIOUS_KERNEL();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= conv_dim) return;
    const int lead = MAX_HISTORY - history;
    const i64 slot_len = (i64)history * conv_dim;
    float taps[MAX_HISTORY + 1];
#pragma unroll
    for (int m = 0; m <= MAX_HISTORY; ++m) taps[m] = m >= lead ? w[(i64)c * (history + 1) + (m - lead)] : 0.0f;
    for (i64 first = (i64)blockIdx.y * CONV_SEGMENT; first < tokens; first += (i64)gridDim.y * CONV_SEGMENT) {
        const int count = first + CONV_SEGMENT < tokens ? CONV_SEGMENT : (int)(tokens - first);
        // The segment's inputs all in flight at once: one dependent load per token kept a thread at
        // one load in flight (Nsight Compute on the H200, 27B prefill of 2048: 1.48 TB/s).
        float now[CONV_SEGMENT];
        int row_seq[CONV_SEGMENT];
#pragma unroll
        for (int k = 0; k < CONV_SEGMENT; ++k) {
            now[k] = CONV_PRELOAD && k < count ? x[(first + k) * conv_dim + c] : 0.0f;
            row_seq[k] = k < count ? row_seqs[first + k] : -1;
        }
        float win[MAX_HISTORY];
        int current = -1;
#pragma unroll
        for (int k = 0; k < CONV_SEGMENT; ++k) {
            if (k >= count) break;
            const i64 t = first + k;
            const int s = row_seq[k];
            const int* seq = seqs + 4 * s;
            const int start = seq[0], slot = seq[2], snap = seq[3];
            const int i = (int)(t - start);
            if (s != current) {
#pragma unroll
                for (int m = 0; m < MAX_HISTORY; ++m)
                    win[m] = m >= lead ? conv_input(x, conv_state, slot_len, slot, start, i - history + (m - lead), conv_dim, history, c)
                                       : 0.0f;
                current = s;
            }
            out[t * conv_dim + c] = conv_step(taps, win, CONV_PRELOAD ? now[k] : x[t * conv_dim + c]);
            if (snap >= 0) store_window(conv_state + (i64)snaps[snap + i] * slot_len, win, lead, conv_dim, c);
        }
    }
}

// The window after each sequence's last new token, written into its slot: one thread per (channel,
// sequence), reading the old window before overwriting it.
extern "C" __global__ void conv_window_update(const float* x, float* conv_state, const int* seqs, int conv_dim,
                                              int history) {
    AFTER_PREVIOUS_KERNEL();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= conv_dim) return;
    const int* seq = seqs + 4 * blockIdx.y;
    const int start = seq[0], len = seq[1], slot = seq[2];
    const i64 slot_len = (i64)history * conv_dim;
    float win[MAX_HISTORY];
#pragma unroll
    for (int e = 0; e < MAX_HISTORY; ++e) {
        if (e < history) win[e] = conv_input(x, conv_state, slot_len, slot, start, len - history + e, conv_dim, history, c);
    }
#pragma unroll
    for (int e = 0; e < MAX_HISTORY; ++e) {
        if (e < history) conv_state[slot * slot_len + (i64)e * conv_dim + c] = win[e];
    }
}
