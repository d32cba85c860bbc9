//! doctor on the golden fixtures: the cpu backend passes every row; the diagnostic broken-attention
//! backend fails, and the first failing op row is the attention op of a full-attention layer, and the
//! first failing layer is the first full-attention layer.

mod common;

use common::{fixture, load};
use deltaserve_doctor::layers::check_layers;
use deltaserve_doctor::ops::check_ops;
use deltaserve_tensor::cpu::{CpuBackend, IsaLevel};
use deltaserve_tensor::diagnostic::BrokenAttention;
use deltaserve_tensor::reference::ReferenceBackend;

const TOLERANCE: f32 = 2e-3;

const PROMPT: [u32; 80] = {
    let mut p = [0u32; 80];
    let mut i = 0;
    while i < 80 {
        p[i] = (i as u32 * 97 + 13) % 256;
        i += 1;
    }
    p
};

#[test]
fn cpu_backend_passes_every_check_on_every_fixture() {
    for name in [
        "qwen35_f32",
        "qwen35_bf16",
        "qwen35_text_tied",
        "qwen35_moe",
        "qwen3_next",
        "qwen3_next_packed",
    ] {
        let dir = fixture(name);
        let reference = load(ReferenceBackend, &dir);
        for level in IsaLevel::available() {
            let cpu = load(CpuBackend::with_isa(0, level).unwrap(), &dir);
            let mut rows = check_ops(&reference, &cpu, TOLERANCE);
            rows.extend(check_layers(&reference, &cpu, &PROMPT, TOLERANCE));
            assert!(rows.len() > 30, "{name}: only {} checks ran", rows.len());
            for row in &rows {
                assert!(
                    row.passed(),
                    "{name}, {level} kernels: {} at {} failed: {:?}",
                    row.what,
                    row.location(),
                    row.comparison
                );
            }
        }
    }
}

#[test]
fn broken_attention_is_named_by_op_and_by_layer() {
    let dir = fixture("qwen35_f32");
    let reference = load(ReferenceBackend, &dir);
    let broken = load(
        BrokenAttention {
            inner: CpuBackend::new(0),
        },
        &dir,
    );
    let ops = check_ops(&reference, &broken, TOLERANCE);
    let first = ops
        .iter()
        .find(|r| !r.passed())
        .expect("the broken attention must fail an op check");
    assert!(
        first.what.starts_with("attention"),
        "first failing op is {}",
        first.what
    );
    assert_eq!(first.layer_kind, "full_attention");
    assert!(
        ops.iter()
            .filter(|r| !r.passed())
            .all(|r| r.what.starts_with("attention")),
        "only attention may fail"
    );
    let layers = check_layers(&reference, &broken, &PROMPT, TOLERANCE);
    let first_layer = layers
        .iter()
        .find(|r| !r.passed())
        .expect("a layer must diverge");
    let first_full =
        (0..reference.config.num_hidden_layers).find(|&i| reference.config.is_full_attention(i));
    assert_eq!(first_layer.layer, first_full, "first diverging layer");
}
