//! doctor's layer check compares like with like: a correct backend whose products round their
//! inputs to bf16 (as the cuda backend's bf16 GEMMs do, weights of f32 checkpoints included) passes
//! it on every fixture at the cuda tolerance, because every layer runs on the same input in both
//! backends and only its own rounding shows; the deliberately broken attention still fails it.

mod common;

use common::{fixture, load};
use deltaserve_doctor::layers::check_layers;
use deltaserve_doctor::Comparison;
use deltaserve_model::{ForwardInput, Model};
use deltaserve_tensor::diagnostic::BrokenAttention;
use deltaserve_tensor::dtype::{bf16_to_f32, f32_to_bf16};
use deltaserve_tensor::reference::ReferenceBackend;
use deltaserve_tensor::{Backend, BatchLayout, HostTensor, TensorError};

/// doctor's tolerance for the cuda backend's bf16 GEMMs (src/commands/doctor.rs).
const CUDA_TOLERANCE: f32 = 5e-2;

fn round(values: &[f32]) -> Vec<f32> {
    values
        .iter()
        .map(|&v| bf16_to_f32(f32_to_bf16(v)))
        .collect()
}

/// `inner` with every matrix stored as bf16 and every product's input rounded to bf16.
struct Bf16Products<B> {
    inner: B,
}

impl<B: Backend> Backend for Bf16Products<B> {
    type Buf = B::Buf;
    type Mat = B::Mat;

    fn load_mat(&self, t: &HostTensor) -> Result<Self::Mat, TensorError> {
        let rounded =
            HostTensor::from_f32_as_bf16(t.name.clone(), t.shape.clone(), &t.to_f32_vec());
        self.inner.load_mat(&rounded)
    }
    fn matmul(&self, x: &Self::Buf, w: &Self::Mat, out: &mut Self::Buf, tokens: usize) {
        let x = self.inner.upload(&round(&self.inner.to_host(x)));
        self.inner.matmul(&x, w, out, tokens)
    }
    deltaserve_tensor::forward_ops!(inner;
        name, zeros, kv_dtype, scratch, upload, to_host, buf_len, load_vec, mat_shape, mat_bytes,
        embedding, add_rms_norm, rms_norm, gated_rms_norm, add_inplace, silu_mul,
        sigmoid_mul_inplace, rope, concat_cols, gather_rows, scatter_add_rows, sigmoid_scale_rows,
        attention, causal_conv1d, gdn_gates, gated_delta_rule, reset_state_slot, copy_state_slot,
        route_top_k);
}

fn prompt() -> Vec<u32> {
    (0..64u32).map(|i| (i * 97 + 13) % 256).collect()
}

fn logits<B: Backend>(model: &Model<B>, prompt: &[u32]) -> Vec<f32> {
    let mut cache = model.single_sequence_cache(prompt.len());
    let blocks = (0..cache.geometry.num_blocks as u32).collect();
    let batch = BatchLayout::packed(cache.geometry.block_size, [(prompt.len(), 0, blocks, 0)]);
    let rows: Vec<u32> = (0..prompt.len() as u32).collect();
    let out = model.forward(
        &ForwardInput {
            tokens: prompt,
            batch: &batch,
            logit_rows: &rows,
            hidden_rows: &[],
        },
        &mut cache,
    );
    model.backend.to_host(&out.logits)
}

#[test]
fn a_backend_rounding_its_products_to_bf16_passes_the_layer_check() {
    for name in ["qwen35_f32", "qwen35_moe", "qwen3_next"] {
        let dir = fixture(name);
        let reference = load(ReferenceBackend, &dir);
        let rounded = load(
            Bf16Products {
                inner: ReferenceBackend,
            },
            &dir,
        );
        let rows = check_layers(&reference, &rounded, &prompt(), CUDA_TOLERANCE);
        let worst = rows
            .iter()
            .map(|r| r.comparison.relative)
            .fold(0.0f32, f32::max);
        let free_running =
            Comparison::of(&logits(&rounded, &prompt()), &logits(&reference, &prompt()));
        println!(
            "{name}: worst layer-check error {worst:.2e}; free-running logits {:.2e}",
            free_running.relative
        );
        for row in &rows {
            assert!(
                row.passed(),
                "{name}: {} at {} failed: {:?}",
                row.what,
                row.location(),
                row.comparison
            );
        }
        assert!(worst > 0.0, "{name}: the rounding must show somewhere");
    }
}

#[test]
fn the_broken_attention_fails_the_layer_check_at_the_cuda_tolerance_too() {
    let dir = fixture("qwen35_f32");
    let reference = load(ReferenceBackend, &dir);
    let broken = load(
        BrokenAttention {
            inner: Bf16Products {
                inner: ReferenceBackend,
            },
        },
        &dir,
    );
    let rows = check_layers(&reference, &broken, &prompt(), CUDA_TOLERANCE);
    let first = rows
        .iter()
        .find(|r| !r.passed())
        .expect("the broken attention must fail a layer");
    let first_full =
        (0..reference.config.num_hidden_layers).find(|&i| reference.config.is_full_attention(i));
    assert_eq!(first.layer, first_full, "first diverging layer");
}
