//! Deterministic pseudo-random inputs for op checks (the same on every run and machine).

/// `n` values uniform in [-scale, scale).
pub fn uniform(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Token ids spread over the vocabulary.
pub fn token_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    uniform(n, seed, 1.0)
        .iter()
        .map(|x| ((x + 1.0) * 0.5 * vocab as f32) as u32 % vocab as u32)
        .collect()
}
