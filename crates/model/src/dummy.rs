//! `DummySource` (`--load-format dummy`): deterministic pseudo-random weights of any requested shape,
//! named like a Qwen3.5 checkpoint (split GDN projections, packed experts), with value ranges that
//! keep activations sane. No files are read; the same name and seed always give the same values.

use crate::error::LoadError;
use crate::source::TensorSource;
use deltaserve_tensor::{DType, GeneratedMatrix, HostTensor};
use rayon::prelude::*;
use std::sync::Arc;

/// Elements generated from one PRNG stream; streams are seeded per (tensor, chunk), so the values do
/// not depend on how many threads run.
const CHUNK_ELEMS: usize = 1 << 16;

/// Sub-names a Qwen3.5 (split projections, packed experts) decoder layer can have, trunk or MTP.
const LAYER_SUFFIXES: &[&str] = &[
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "linear_attn.in_proj_qkv.weight",
    "linear_attn.in_proj_z.weight",
    "linear_attn.in_proj_b.weight",
    "linear_attn.in_proj_a.weight",
    "linear_attn.conv1d.weight",
    "linear_attn.dt_bias",
    "linear_attn.A_log",
    "linear_attn.norm.weight",
    "linear_attn.out_proj.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "mlp.gate.weight",
    "mlp.experts.gate_up_proj",
    "mlp.experts.down_proj",
    "mlp.shared_expert.gate_proj.weight",
    "mlp.shared_expert.up_proj.weight",
    "mlp.shared_expert.down_proj.weight",
    "mlp.shared_expert_gate.weight",
];

const MTP_TOP_LEVEL: &[&str] = &[
    "mtp.fc.weight",
    "mtp.pre_fc_norm_embedding.weight",
    "mtp.pre_fc_norm_hidden.weight",
    "mtp.norm.weight",
];

/// Generated weights for `--load-format dummy`.
pub struct DummySource {
    dtype: DType,
    seed: u64,
    tie_word_embeddings: bool,
}

/// How the values of one tensor are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Init {
    /// uniform(lo, hi)
    Uniform { lo: f32, hi: f32 },
    /// ln(uniform(lo, hi))
    LogUniform { lo: f32, hi: f32 },
}

impl DummySource {
    /// Tensors come out in `config_dtype` (the checkpoint dtype the config names).
    pub fn new(config_dtype: DType, seed: u64) -> Self {
        Self {
            dtype: config_dtype,
            seed,
            tie_word_embeddings: false,
        }
    }

    /// With tied embeddings there is no `lm_head.weight` (default: untied).
    pub fn with_tied_embeddings(mut self, tied: bool) -> Self {
        self.tie_word_embeddings = tied;
        self
    }

    /// True for the canonical names of the Qwen3.5 layout (see `LAYER_SUFFIXES`).
    fn knows(&self, name: &str) -> bool {
        match name {
            "embed_tokens.weight" | "norm.weight" => return true,
            "lm_head.weight" => return !self.tie_word_embeddings,
            _ => {}
        }
        if MTP_TOP_LEVEL.contains(&name) {
            return true;
        }
        let layer_name = name.strip_prefix("mtp.").unwrap_or(name);
        let Some((index, suffix)) = layer_name
            .strip_prefix("layers.")
            .and_then(|rest| rest.split_once('.'))
        else {
            return false;
        };
        !index.is_empty()
            && index.bytes().all(|b| b.is_ascii_digit())
            && LAYER_SUFFIXES.contains(&suffix)
    }
}

/// Value ranges by role: matrices get std 1/sqrt(fan_in) (fan_in = last dim); zero-centred RMSNorm
/// weights (used as 1+w) sit near 0, the GDN output norm (plain w) near 1; `A_log` = ln(U(1,16)) as
/// in the HF init, so decays exp(-exp(A_log)·softplus(..)) stay in a useful range.
fn init_for(name: &str, shape: &[usize]) -> Init {
    if name.ends_with("A_log") {
        Init::LogUniform { lo: 1.0, hi: 16.0 }
    } else if name.ends_with("dt_bias") {
        Init::Uniform { lo: -0.1, hi: 0.1 }
    } else if name.ends_with("linear_attn.norm.weight") {
        Init::Uniform { lo: 0.9, hi: 1.1 }
    } else if name.ends_with("norm.weight") {
        Init::Uniform { lo: -0.1, hi: 0.1 }
    } else if name.ends_with("conv1d.weight") {
        Init::Uniform { lo: -0.5, hi: 0.5 }
    } else if shape.len() >= 2 {
        let fan_in = shape[shape.len() - 1].max(1) as f32;
        // uniform(-a, a) has std a/sqrt(3).
        let a = (3.0 / fan_in).sqrt();
        Init::Uniform { lo: -a, hi: a }
    } else {
        Init::Uniform { lo: -0.1, hi: 0.1 }
    }
}

/// SplitMix64 step: a fast, well-mixed 64-bit generator, also used to derive stream seeds.
#[inline]
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of the name, so each tensor gets its own stream.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

fn stream_seed(seed: u64, name: &str, chunk: usize) -> u64 {
    let mut s = seed ^ name_hash(name);
    let a = splitmix64(&mut s);
    let mut s = a ^ (chunk as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    splitmix64(&mut s)
}

/// Fills `out` with `out.len() / dtype.size_bytes()` little-endian values drawn from `init`.
fn fill_chunk(out: &mut [u8], dtype: DType, init: Init, state: u64) {
    match dtype {
        DType::F32 => fill_init(out, init, state, |x| x.to_le_bytes()),
        DType::BF16 => fill_init(out, init, state, |x| bf16_bits(x).to_le_bytes()),
        DType::F16 => fill_init(out, init, state, |x| {
            half::f16::from_f32(x).to_bits().to_le_bytes()
        }),
    }
}

/// Round-to-nearest-even f32 -> bf16 for the finite values generated here (no NaN handling needed);
/// written out because `half`'s checked conversion is slow in the opt-level-1 dev profile.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let round = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// Separate loops per `Init` kind: with a run-time flag the optimiser may compute `ln` for every
/// element and select afterwards, which made generation about ten times slower.
#[inline(always)]
fn fill_init<const N: usize>(
    out: &mut [u8],
    init: Init,
    state: u64,
    encode: impl Fn(f32) -> [u8; N],
) {
    match init {
        Init::Uniform { lo, hi } => fill_uniform(out, lo, hi, state, encode),
        Init::LogUniform { lo, hi } => fill_uniform(out, lo, hi, state, |x| encode(x.ln())),
    }
}

/// Writes `encode(uniform(lo, hi))` into each `N`-byte element of `out`.
#[inline(always)]
fn fill_uniform<const N: usize>(
    out: &mut [u8],
    lo: f32,
    hi: f32,
    mut state: u64,
    encode: impl Fn(f32) -> [u8; N],
) {
    let scale = (hi - lo) / (1u32 << 24) as f32;
    let value = |bits: u32| lo + bits as f32 * scale;
    // Two 24-bit uniforms per 64-bit draw.
    let mut pairs = out.chunks_exact_mut(2 * N);
    for pair in &mut pairs {
        let r = splitmix64(&mut state);
        let (first, second) = pair.split_at_mut(N);
        first.copy_from_slice(&encode(value((r >> 40) as u32)));
        second.copy_from_slice(&encode(value((r >> 16) as u32 & 0x00FF_FFFF)));
    }
    let rest = pairs.into_remainder();
    if !rest.is_empty() {
        let r = splitmix64(&mut state);
        rest.copy_from_slice(&encode(value((r >> 40) as u32)));
    }
}

impl TensorSource for DummySource {
    fn generated_matrix(&self, name: &str, shape: [usize; 2]) -> Option<GeneratedMatrix> {
        let Init::Uniform { lo, hi } = init_for(name, &shape) else {
            return None;
        };
        if !self.knows(name) || !matches!(self.dtype, DType::BF16 | DType::F32) {
            return None;
        }
        let chunks = (shape[0] * shape[1]).div_ceil(CHUNK_ELEMS);
        Some(GeneratedMatrix {
            name: name.to_string(),
            dtype: self.dtype,
            rows: shape[0],
            cols: shape[1],
            lo,
            hi,
            chunk_elems: CHUNK_ELEMS,
            chunk_seeds: (0..chunks)
                .map(|c| stream_seed(self.seed, name, c))
                .collect(),
            block_fp8: None,
        })
    }

    fn get(&self, name: &str, shape: &[usize]) -> Result<HostTensor, LoadError> {
        if !self.knows(name) {
            return Err(LoadError::MissingTensor {
                name: name.to_string(),
                looked_in: self.describe(),
                tried: vec![name.to_string()],
            });
        }
        let numel: usize = shape.iter().product();
        let size = self.dtype.size_bytes();
        let init = init_for(name, shape);
        let mut bytes = vec![0u8; numel * size];
        bytes
            .par_chunks_mut(CHUNK_ELEMS * size)
            .enumerate()
            .for_each(|(chunk, out)| {
                fill_chunk(out, self.dtype, init, stream_seed(self.seed, name, chunk))
            });
        let len = bytes.len();
        Ok(HostTensor::from_owner(
            name,
            self.dtype,
            shape.to_vec(),
            Arc::new(bytes),
            0,
            len,
        )?)
    }

    fn contains(&self, name: &str) -> bool {
        self.knows(name)
    }

    fn describe(&self) -> String {
        format!("dummy weights (seed {}, {})", self.seed, self.dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(v: &[f32]) -> (f32, f32, f32, f32) {
        let n = v.len() as f32;
        let mean = v.iter().sum::<f32>() / n;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n;
        let min = v.iter().copied().fold(f32::INFINITY, f32::min);
        let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        (mean, var.sqrt(), min, max)
    }

    #[test]
    fn deterministic_per_name_and_seed() {
        let a = DummySource::new(DType::BF16, 7);
        let b = DummySource::new(DType::BF16, 7);
        let c = DummySource::new(DType::BF16, 8);
        let name = "layers.0.mlp.up_proj.weight";
        // More than one chunk, so the per-chunk streams are exercised.
        let shape = [300, 500];
        let x = a.get(name, &shape).unwrap();
        assert_eq!(x.shape, shape);
        assert_eq!(x.dtype, DType::BF16);
        assert_eq!(x.name, name);
        assert_eq!(x.bytes(), b.get(name, &shape).unwrap().bytes());
        assert_ne!(x.bytes(), c.get(name, &shape).unwrap().bytes());
        assert_ne!(
            x.bytes(),
            a.get("layers.1.mlp.up_proj.weight", &shape)
                .unwrap()
                .bytes()
        );
        // Chunks differ from each other (no repeated stream).
        let v = x.to_f32_vec();
        assert_ne!(
            &v[..CHUNK_ELEMS / 2],
            &v[CHUNK_ELEMS..CHUNK_ELEMS + CHUNK_ELEMS / 2]
        );
    }

    #[test]
    fn value_ranges_by_role() {
        let src = DummySource::new(DType::F32, 1);
        let w = src
            .get("layers.0.linear_attn.in_proj_qkv.weight", &[64, 1024])
            .unwrap();
        let (mean, std, min, max) = stats(&w.to_f32_vec());
        let target = 1.0 / 1024f32.sqrt();
        assert!(mean.abs() < 0.05 * target, "mean {mean}");
        assert!((std / target - 1.0).abs() < 0.02, "std {std} vs {target}");
        assert!(min >= -(3f32 / 1024.0).sqrt() && max <= (3f32 / 1024.0).sqrt());

        let experts = src
            .get("layers.0.mlp.experts.down_proj", &[4, 32, 256])
            .unwrap();
        let (_, std, _, _) = stats(&experts.to_f32_vec());
        assert!(
            (std * 16.0 - 1.0).abs() < 0.05,
            "fan-in is the last dim: std {std}"
        );

        let a_log = src
            .get("layers.0.linear_attn.A_log", &[4096])
            .unwrap()
            .to_f32_vec();
        let (_, _, min, max) = stats(&a_log);
        assert!(
            min >= 0.0 && max <= 16f32.ln() && max > 2.5,
            "A_log in [0, ln 16]: {min}..{max}"
        );

        let gdn_norm = src
            .get("layers.0.linear_attn.norm.weight", &[128])
            .unwrap()
            .to_f32_vec();
        assert!(gdn_norm.iter().all(|&x| (0.9..=1.1).contains(&x)));
        for name in [
            "layers.0.input_layernorm.weight",
            "norm.weight",
            "layers.3.self_attn.q_norm.weight",
            "mtp.pre_fc_norm_hidden.weight",
        ] {
            let v = src.get(name, &[256]).unwrap().to_f32_vec();
            assert!(v.iter().all(|&x| x.abs() <= 0.1), "{name}");
        }
        let conv = src
            .get("layers.0.linear_attn.conv1d.weight", &[64, 1, 4])
            .unwrap()
            .to_f32_vec();
        let (_, _, min, max) = stats(&conv);
        assert!(min >= -0.5 && max <= 0.5 && max - min > 0.8);
        let dt = src
            .get("layers.0.linear_attn.dt_bias", &[32])
            .unwrap()
            .to_f32_vec();
        assert!(dt.iter().all(|&x| x.abs() <= 0.1));
    }

    #[test]
    fn bf16_rounding_matches_half() {
        let mut state = 5u64;
        for _ in 0..100_000 {
            let x = f32::from_bits(splitmix64(&mut state) as u32);
            if x.is_finite() && half::bf16::from_f32(x).is_finite() {
                assert_eq!(bf16_bits(x), half::bf16::from_f32(x).to_bits(), "{x:e}");
            }
        }
        // Ties go to even.
        assert_eq!(
            bf16_bits(1.0 + 1.0 / 256.0),
            half::bf16::from_f32(1.0).to_bits()
        );
    }

    #[test]
    fn dtypes() {
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let t = DummySource::new(dtype, 3)
                .get("embed_tokens.weight", &[10, 16])
                .unwrap();
            assert_eq!(t.dtype, dtype);
            assert_eq!(t.bytes().len(), 160 * dtype.size_bytes());
            let v = t.to_f32_vec();
            assert!(v
                .iter()
                .all(|x| x.is_finite() && x.abs() <= (3f32 / 16.0).sqrt() + 1e-3));
        }
        // The same underlying draws: bf16 is the f32 value rounded.
        let f = DummySource::new(DType::F32, 3)
            .get("norm.weight", &[8])
            .unwrap()
            .to_f32_vec();
        let b = DummySource::new(DType::BF16, 3)
            .get("norm.weight", &[8])
            .unwrap()
            .to_f32_vec();
        for (x, y) in f.iter().zip(&b) {
            assert!((x - y).abs() <= x.abs() / 128.0);
        }
    }

    #[test]
    fn contains_describes_the_qwen35_layout() {
        let src = DummySource::new(DType::BF16, 0);
        for name in [
            "embed_tokens.weight",
            "norm.weight",
            "lm_head.weight",
            "layers.0.linear_attn.in_proj_qkv.weight",
            "layers.0.linear_attn.in_proj_z.weight",
            "layers.12.linear_attn.A_log",
            "layers.3.self_attn.q_proj.weight",
            "layers.5.mlp.experts.gate_up_proj",
            "layers.5.mlp.shared_expert_gate.weight",
            "mtp.fc.weight",
            "mtp.norm.weight",
            "mtp.layers.0.mlp.gate_proj.weight",
            "mtp.layers.0.self_attn.k_norm.weight",
        ] {
            assert!(src.contains(name), "{name}");
        }
        for name in [
            "layers.0.linear_attn.in_proj_qkvz.weight",
            "layers.0.linear_attn.in_proj_ba.weight",
            "layers.5.mlp.experts.0.gate_proj.weight",
            "layers.x.mlp.up_proj.weight",
            "layers.0.self_attn.q_proj.bias",
            "model.layers.0.mlp.up_proj.weight",
            "visual.blocks.0.attn.qkv.weight",
        ] {
            assert!(!src.contains(name), "{name}");
            let err = src.get(name, &[2]).unwrap_err();
            assert!(
                matches!(err, LoadError::MissingTensor { .. }),
                "{name}: {err}"
            );
        }
        let tied = DummySource::new(DType::BF16, 0).with_tied_embeddings(true);
        assert!(!tied.contains("lm_head.weight"));
        assert!(tied.contains("embed_tokens.weight"));
        assert!(src.describe().contains("dummy"));
    }
}
