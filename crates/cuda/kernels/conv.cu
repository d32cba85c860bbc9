// Depthwise causal conv1d + SiLU over each sequence's new tokens, with the sequence's conv window
// (the last `history` pre-conv inputs, oldest first) as the history. One thread per (sequence,
// channel) walks the sequence's tokens in order, keeping the window in registers; the window is
// written back to the sequence's slot at the end and to a snapshot slot after tokens that have one.
//
// seqs [n_seqs, 4] = (start row, new tokens, state slot, first snapshot index or -1);
// snaps = the snapshot slots of all sequences back to back.

#define MAX_HISTORY 7

// The window and the taps are kept right-aligned in fixed-size register arrays: slot m holds
// window entry m - (MAX_HISTORY - history), the leading slots hold zero taps. Every register index
// is then a compile-time constant (a run-time index would move the arrays to local memory).
extern "C" __global__ void causal_conv1d(const float* x, const float* w, float* conv_state, float* out,
                                         const int* seqs, const int* snaps, int conv_dim, int history) {
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
        const float now = x[row];
        float acc = 0.0f;
#pragma unroll
        for (int m = 0; m < MAX_HISTORY; ++m) acc = fmaf(taps[m], win[m], acc);
        acc = fmaf(taps[MAX_HISTORY], now, acc);
        out[row] = silu_f(acc);
#pragma unroll
        for (int m = 0; m < MAX_HISTORY - 1; ++m) win[m] = win[m + 1];
        win[MAX_HISTORY - 1] = now;
        if (snap >= 0) {
            const i64 dst = (i64)snaps[snap + i] * slot_len;
#pragma unroll
            for (int m = 0; m < MAX_HISTORY; ++m) {
                if (m >= lead) conv_state[dst + (i64)(m - lead) * conv_dim + c] = win[m];
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MAX_HISTORY; ++m) {
        if (m >= lead) conv_state[slot * slot_len + (i64)(m - lead) * conv_dim + c] = win[m];
    }
}
