//! `--load-format dummy` on the GPU: matrices generated on the device equal, bit for bit, the host
//! generator's values uploaded, for bf16 and f32 checkpoints under both GEMM precisions, across
//! several PRNG chunks and an odd element count. Read back through a product with the identity
//! (exact in either precision). Skipped without a GPU.

mod common;

use common::cuda;
use deltaserve_cuda::GemmPrecision;
use deltaserve_model::dummy::DummySource;
use deltaserve_model::source::TensorSource;
use deltaserve_tensor::{Backend, DType};

#[test]
fn device_generated_dummy_matrices_equal_host_generated() {
    for precision in [GemmPrecision::Bf16, GemmPrecision::F32] {
        let Some(be) = cuda(
            precision,
            "device_generated_dummy_matrices_equal_host_generated",
        ) else {
            return;
        };
        for dtype in [DType::BF16, DType::F32] {
            let source = DummySource::new(dtype, 7);
            for (name, rows, cols) in [
                ("layers.0.mlp.gate_proj.weight", 2049, 63),
                ("layers.3.linear_attn.out_proj.weight", 64, 5),
            ] {
                let spec = source
                    .generated_matrix(name, [rows, cols])
                    .expect("dummy matrices can be generated on a device");
                let on_device = be
                    .generate_mat(&spec)
                    .expect("the cuda backend generates")
                    .expect("generation succeeds");
                let uploaded = be
                    .load_mat(&source.get(name, &[rows, cols]).expect("host generation"))
                    .expect("upload");
                let mut identity = vec![0.0f32; cols * cols];
                for i in 0..cols {
                    identity[i * cols + i] = 1.0;
                }
                let x = be.upload(&identity);
                let (mut a, mut b) = (be.zeros(cols * rows), be.zeros(cols * rows));
                be.matmul(&x, &on_device, &mut a, cols);
                be.matmul(&x, &uploaded, &mut b, cols);
                let (a, b) = (be.to_host(&a), be.to_host(&b));
                let differing = a
                    .iter()
                    .zip(&b)
                    .filter(|(x, y)| x.to_bits() != y.to_bits())
                    .count();
                assert_eq!(
                    differing,
                    0,
                    "{name} {dtype} under {precision:?}: {differing} of {} values differ",
                    a.len()
                );
            }
        }
    }
}
