//! What a backend needs to pick a token from one row of logits on its own device (a grammar's token
//! mask, temperature, top-k, top-p, min-p and one uniform draw), so that logits need not be copied
//! to the host. The engine's host sampler defines the semantics; a device sampler must draw from the
//! same distribution.

/// One row of a `[rows, vocab]` logits buffer to sample from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowSampling<'a> {
    /// Row index into the logits buffer.
    pub row: u32,
    /// 0 = greedy (argmax, ties to the lower id); the filters below are then ignored.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: u32,
    /// Then keep the smallest most-likely prefix whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Then keep tokens at least `min_p` times as likely as the most likely one (0 = all).
    pub min_p: f32,
    /// A uniform number in [0, 1) that decides the draw.
    pub uniform: f64,
    /// The tokens a grammar allows (bit `id % 32` of word `id / 32`; ids past the words are not
    /// allowed), sampled as if every other token's logit were negative infinity; `None`: every
    /// token. The caller makes sure at least one token of the row is allowed.
    pub allowed: Option<&'a [u32]>,
}

impl RowSampling<'_> {
    pub fn greedy(row: u32) -> Self {
        Self {
            row,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            uniform: 0.0,
            allowed: None,
        }
    }
}
