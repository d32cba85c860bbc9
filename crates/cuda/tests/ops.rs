//! Every op of `CudaBackend` against `ReferenceBackend` on random inputs, with shapes that hit the
//! edges: GQA and value/key head ratio 3, sequence lengths 1/63/64/65/150 around the 64-token GDN
//! chunk and 16-token KV blocks, several sequences in one ragged batch with interleaved block
//! tables, snapshot slots, and norms over dims that are not a multiple of the block size.
//! Skipped (with a printed reason) where no CUDA device can be used.
//!
//! Tolerances (relative to max(1, max |want|)); the reference accumulates in f64, the kernels in f32:
//! - `TOL_MATMUL`: f32 GEMM with K up to 1000 errs by ~sqrt(K) * 2^-24 of the largest output.
//! - `TOL_DENSE`: norms (f32 block sums over up to 5120), elementwise ops with `expf`, RoPE.
//! - `TOL_ATTENTION`: softmax over up to 215 positions with f32 `expf` and sums. A bf16 KV pool
//!   changes nothing here: the reference attends over K/V rounded to bf16 as the pool stores them
//!   (nearest even), the kernels widen them exactly, so the only difference left is the same f32
//!   against f64 arithmetic; and the pool itself must equal the rounded values bit for bit.
//! - `TOL_GDN`: the recurrent rule in f32 over up to 215 tokens from a non-zero state, against the
//!   reference's f64 chunked form for prefill.
//!
//! Each is 20-50x the worst error measured when the kernels ran under a CPU emulation of the GPU
//! (threads and barriers) against independent f64 references; measured values print with
//! `--nocapture`. Not yet run on an H200 (see the crate README).

mod common;

use common::{
    check, cuda, cuda_bf16_cores, cuda_bf16_cores_wide, cuda_bf16_diag, cuda_bf16_diag_wide,
    cuda_bf16_sets, cuda_bf16_sets_wide, cuda_chunked_gdn, cuda_chunked_gdn_sequential,
    cuda_prefill_without_shortcuts, cuda_wide_lanes, cuda_without_gemv_twins, group_products, Rng,
};
use deltaserve_cuda::{CudaBackend, CudaBuf, CudaOptions, GemmPrecision};
use deltaserve_tensor::op_check::{self, AttentionPools, Operands, StatePools};
use deltaserve_tensor::reference::ReferenceBackend;
use deltaserve_tensor::{
    AttnShape, Backend, BatchLayout, GdnGateInputs, GdnShape, HostTensor, KvDtype, SeqLayout,
    StateLayerPool,
};

const TOL_MATMUL: f32 = 1e-5;
const TOL_DENSE: f32 = 5e-6;
const TOL_ATTENTION: f32 = 1e-5;
/// bf16 probabilities (relative rounding 2^-9) and the bf16 rounding of the scaled q.
const TOL_FLASH: f32 = 1e-2;
const TOL_GDN: f32 = 5e-5;
/// The chunked form on the tensor cores rounds every matrix operand to TF32 (2^-11 relative) and
/// carries the state from chunk to chunk through those products: worst 2.1e-4 (a state after 70
/// tokens) on the H200, 5x that allowed.
const TOL_GDN_CHUNKED: f32 = 1e-3;

#[test]
fn start_up_errors_are_values_not_panics() {
    // Ordinal 99 does not exist anywhere: without CUDA the library check fails, with a GPU the
    // device count does. Either way an error comes back.
    match CudaBackend::new(99) {
        Ok(b) => panic!("a backend on GPU 99 ({}) should not exist", b.device_name()),
        Err(e) => println!("CudaBackend::new(99): {e}"),
    }
}

#[test]
fn matmul_f32_matches_reference() {
    let Some(be) = cuda(GemmPrecision::F32, "matmul_f32_matches_reference") else {
        return;
    };
    let mut rng = Rng(1);
    for (n, k) in [(1, 1), (7, 15), (33, 17), (64, 64), (300, 1000)] {
        let values = rng.vec(n * k, 1.0);
        for bf16 in [false, true] {
            let t = if bf16 {
                HostTensor::from_f32_as_bf16("w", vec![n, k], &values)
            } else {
                HostTensor::from_f32("w", vec![n, k], &values)
            };
            let w = be.load_mat(&t).unwrap();
            assert_eq!(be.mat_shape(&w), (n, k));
            let w_ref = ReferenceBackend.load_mat(&t).unwrap();
            for tokens in [1, 2, 3, 8, 65, 130] {
                let x = rng.vec(tokens * k, 1.0);
                let (got, want) = op_check::matmul(be, &w, &w_ref, &x, tokens, Operands::Exact);
                check(
                    &format!("matmul f32 bf16-weights={bf16} [{tokens}x{k}] @ [{n}x{k}]^T"),
                    &got,
                    &want,
                    TOL_MATMUL,
                );
            }
        }
    }
}

#[test]
fn matmul_bf16_is_the_exact_product_of_bf16_rounded_inputs() {
    let Some(be) = cuda(
        GemmPrecision::Bf16,
        "matmul_bf16_is_the_exact_product_of_bf16_rounded_inputs",
    ) else {
        return;
    };
    let mut rng = Rng(2);
    let mut worst_vs_unrounded = 0.0f32;
    for (n, k) in [
        (1, 1),
        (7, 15),
        (33, 17),
        (64, 64),
        (300, 1000),
        (512, 2048),
    ] {
        let values = rng.vec(n * k, 1.0);
        // An f32 checkpoint is rounded to bf16 at load under GemmPrecision::Bf16.
        for bf16 in [true, false] {
            let t = if bf16 {
                HostTensor::from_f32_as_bf16("w", vec![n, k], &values)
            } else {
                HostTensor::from_f32("w", vec![n, k], &values)
            };
            let w = be.load_mat(&t).unwrap();
            let w_ref = ReferenceBackend
                .load_mat(&HostTensor::from_f32_as_bf16("w", vec![n, k], &values))
                .unwrap();
            for tokens in [1, 3, 8, 65, 130] {
                let x = rng.vec(tokens * k, 1.0);
                let (got, want) = op_check::matmul(be, &w, &w_ref, &x, tokens, Operands::Bf16);
                let label =
                    format!("matmul bf16 checkpoint-bf16={bf16} [{tokens}x{k}] @ [{n}x{k}]^T");
                check(&label, &got, &want, TOL_MATMUL);
                let mut exact = vec![0.0; tokens * n];
                ReferenceBackend.matmul(&x, &w_ref, &mut exact, tokens);
                let scale = exact.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                let e = got
                    .iter()
                    .zip(&exact)
                    .map(|(a, b)| (a - b).abs() / scale)
                    .fold(0.0, f32::max);
                worst_vs_unrounded = worst_vs_unrounded.max(e);
            }
        }
    }
    // What rounding the activations costs, for the docs (bounded by 2^-9 of sum |x w|).
    println!(
        "matmul bf16 against unrounded activations: max relative error {worst_vs_unrounded:.2e}"
    );
    assert!(
        worst_vs_unrounded < 1e-2,
        "bf16 activation rounding cost {worst_vs_unrounded}"
    );
}

/// Random bf16 matrices `[rows[i], k]` as host tensors, loaded on `be` and on the reference.
fn random_bf16_group(
    be: &CudaBackend,
    rng: &mut Rng,
    rows: &[usize],
    k: usize,
) -> (
    Vec<HostTensor>,
    Vec<deltaserve_cuda::CudaMat>,
    Vec<<ReferenceBackend as Backend>::Mat>,
) {
    let host: Vec<HostTensor> = rows
        .iter()
        .map(|&n| HostTensor::from_f32_as_bf16("w", vec![n, k], &rng.vec(n * k, 1.0)))
        .collect();
    let ws = host.iter().map(|t| be.load_mat(t).unwrap()).collect();
    let w_refs = host
        .iter()
        .map(|t| ReferenceBackend.load_mat(t).unwrap())
        .collect();
    (host, ws, w_refs)
}

/// The grouped matmul (the GEMV kernel for up to 8 rows, cuBLAS beyond) equals the reference on
/// bf16-rounded inputs for every matrix of the group: 5 matrices (more than one launch holds),
/// row counts that are not multiples of a warp's 16 rows, every token count from 1 to 9 and the
/// edges of the kernel's 8-token tiles and its 32-token limit (cuBLAS past it),
/// and outputs poisoned with NaN first so an unwritten element fails.
#[test]
fn matmul_group_equals_the_reference_for_each_matrix() {
    let Some(be) = cuda(
        GemmPrecision::Bf16,
        "matmul_group_equals_the_reference_for_each_matrix",
    ) else {
        return;
    };
    let mut rng = Rng(21);
    for k in [8, 1000, 5120] {
        let rows = [37, 1, 300, 8, 129];
        let (_, ws, w_refs) = random_bf16_group(be, &mut rng, &rows, k);
        let w_list: Vec<_> = ws.iter().collect();
        let w_ref_list: Vec<_> = w_refs.iter().collect();
        for tokens in (1..=9).chain([16, 17, 32, 33, 48, 64, 65]) {
            let x = rng.vec(tokens * k, 1.0);
            let outputs =
                op_check::matmul_group(be, &w_list, &w_ref_list, &x, tokens, Operands::Bf16);
            for (m, (&n, (got, want))) in rows.iter().zip(&outputs).enumerate() {
                check(
                    &format!("matmul_group matrix {m} [{tokens}x{k}] @ [{n}x{k}]^T"),
                    got,
                    want,
                    TOL_MATMUL,
                );
            }
        }
    }
}

/// A row's product does not depend on how many rows share the launch within each GEMV kernel: the
/// lane kernels (1-4 rows: decode and a k=3 verify) and the tensor-core kernel (5-8 rows) each
/// sum a row in one fixed order whatever the row count. Across the two the order differs, within
/// the bf16 GEMM tolerance.
#[test]
fn gemv_rows_are_batch_invariant_bitwise() {
    let Some(be) = cuda(GemmPrecision::Bf16, "gemv_rows_are_batch_invariant_bitwise") else {
        return;
    };
    let mut rng = Rng(22);
    let (n, k) = (257, 4096);
    let w = be
        .load_mat(&HostTensor::from_f32_as_bf16(
            "w",
            vec![n, k],
            &rng.vec(n * k, 1.0),
        ))
        .unwrap();
    let x = rng.vec(32 * k, 1.0);
    let product = |tokens: usize| {
        let mut out = be.zeros(tokens * n);
        be.matmul(&be.upload(&x[..tokens * k]), &w, &mut out, tokens);
        be.to_host(&out)
    };
    for (kernel, widest) in [(1..=4, 4), (5..=8, 8)] {
        let all = product(widest);
        for tokens in kernel {
            assert_eq!(
                product(tokens),
                all[..tokens * n],
                "GEMV rows differ between a batch of {tokens} and a batch of {widest}"
            );
        }
    }
    let (lanes, mma) = (product(4), product(5));
    check(
        "GEMV 4-row kernel vs 5-row kernel",
        &lanes,
        &mma[..4 * n],
        TOL_MATMUL,
    );
}

/// Launches too small to give every SM a block take one row a warp (`gemv_bf16_lanes_narrow_t*`):
/// bit for bit the rows of the usual lane kernels, for 1-4 tokens, on the GDN gate projections of
/// an FP8 model (2 x 48 rows of 5120) and on a group whose matrices end inside the usual kernels'
/// warps (37, 1 and 6 rows).
#[test]
fn narrow_lane_kernels_equal_the_lane_kernels_bitwise() {
    let test = "narrow_lane_kernels_equal_the_lane_kernels_bitwise";
    let (Some(narrow), Some(wide)) = (cuda(GemmPrecision::Bf16, test), cuda_wide_lanes(test))
    else {
        return;
    };
    let mut rng = Rng(23);
    for (rows, k) in [(vec![48, 48], 5120), (vec![37, 1, 6], 1000)] {
        let host: Vec<HostTensor> = rows
            .iter()
            .map(|&n| HostTensor::from_f32_as_bf16("w", vec![n, k], &rng.vec(n * k, 1.0)))
            .collect();
        for tokens in 1..=4 {
            let x = rng.vec(tokens * k, 1.0);
            let run = |be| group_products(be, &host, &x, tokens);
            assert_eq!(run(narrow), run(wide), "{rows:?} x {k}, {tokens} tokens");
        }
    }
}

/// The bf16 lane kernels on the tensor cores (`GEMV_BF16_DIAG=1`): every matrix of a group against
/// the reference on bf16-rounded inputs for 1-4 tokens (widths of one 16-byte vector, of vectors
/// that end inside a quad, and the 27B shape's); a row's product the same bits for 1-4 tokens, in
/// the narrow (one row a warp) and the usual kernels alike; the fused silu gate its two ops.
#[test]
fn bf16_lane_kernels_on_the_tensor_cores_match_reference_and_each_other() {
    let test = "bf16_lane_kernels_on_the_tensor_cores_match_reference_and_each_other";
    let (Some(be), Some(wide)) = (cuda_bf16_diag(test), cuda_bf16_diag_wide(test)) else {
        return;
    };
    check_bf16_lanes(be, wide, "diagonal tensor-core");
}

/// The same for the CUDA-core form (`GEMV_BF16_SETS=0`), the default before session 28.
#[test]
fn bf16_lane_kernels_on_the_cuda_cores_match_reference_and_each_other() {
    let test = "bf16_lane_kernels_on_the_cuda_cores_match_reference_and_each_other";
    let (Some(be), Some(wide)) = (cuda_bf16_cores(test), cuda_bf16_cores_wide(test)) else {
        return;
    };
    check_bf16_lanes(be, wide, "CUDA-core");
}

/// The same for the form whose mma serve up to four tokens (`GEMV_BF16_SETS`, the diagonal form
/// for one token), and its products bit for bit the diagonal form's for every token count.
#[test]
fn bf16_lane_kernels_four_tokens_an_mma_match_reference_and_each_other() {
    let test = "bf16_lane_kernels_four_tokens_an_mma_match_reference_and_each_other";
    let (Some(be), Some(wide)) = (cuda_bf16_sets(test), cuda_bf16_sets_wide(test)) else {
        return;
    };
    let Some(diagonal) = cuda_bf16_diag(test) else {
        return;
    };
    check_bf16_lanes(be, wide, "four-tokens-an-mma tensor-core");
    let mut rng = Rng(26);
    for k in [8, 1000, 5120] {
        let (host, _, _) = random_bf16_group(be, &mut rng, &[37, 1, 300, 8], k);
        let x = rng.vec(4 * k, 1.0);
        for tokens in 1..=4 {
            let run = |be| group_products(be, &host, &x[..tokens * k], tokens);
            assert_eq!(
                run(be),
                run(diagonal),
                "sets against the diagonal form, {tokens} tokens, k {k}"
            );
        }
    }
}

/// Each of 1-4 tokens against the reference and bit for bit the 4-token launch's rows, the narrow
/// kernels (`be`) bit for bit the usual ones (`wide`), and the paired gate/up form bit for bit its
/// two ops, over row counts that leave blocks partly past a matrix's end.
fn check_bf16_lanes(be: &CudaBackend, wide: &CudaBackend, form: &str) {
    let mut rng = Rng(25);
    for k in [8, 1000, 5120] {
        let rows = [37, 1, 300, 8];
        let (host, ws, w_refs) = random_bf16_group(be, &mut rng, &rows, k);
        let x = rng.vec(4 * k, 1.0);
        let widest = group_products(be, &host, &x, 4);
        for tokens in 1..=4 {
            let w_list: Vec<_> = ws.iter().collect();
            let w_ref_list: Vec<_> = w_refs.iter().collect();
            let outputs = op_check::matmul_group(
                be,
                &w_list,
                &w_ref_list,
                &x[..tokens * k],
                tokens,
                Operands::Bf16,
            );
            for (m, (&n, (got, want))) in rows.iter().zip(&outputs).enumerate() {
                check(
                    &format!("{form} lanes matrix {m} [{tokens}x{k}] @ [{n}x{k}]^T"),
                    got,
                    want,
                    TOL_MATMUL,
                );
                assert_eq!(
                    got[..],
                    widest[m][..tokens * n],
                    "{form} lanes matrix {m} [{n}x{k}]: {tokens} tokens against 4"
                );
            }
            let run = |be| group_products(be, &host, &x[..tokens * k], tokens);
            assert_eq!(
                run(be),
                run(wide),
                "{form}: narrow against usual, {tokens} tokens, k {k}"
            );
        }
    }
    for (rows, k) in [(1, 8), (37, 1000), (300, 5120)] {
        let mut load = || {
            let values = rng.vec(rows * k, 1.0);
            be.load_mat(&HostTensor::from_f32_as_bf16("w", vec![rows, k], &values))
                .unwrap()
        };
        let (gate, up) = (load(), load());
        let label = format!("bf16 {form} lanes");
        common::assert_silu_gate_is_the_two_ops(be, &gate, &up, &mut rng, &label);
    }
}

/// The gated MLP's fused first half is bit for bit its two ops, for row counts that leave a
/// paired warp's or block's rows partly past the end (1, 37, 300) and widths up to the 27B shape's.
#[test]
fn matmul_silu_gate_equals_group_then_silu_mul_bitwise() {
    let Some(be) = cuda(
        GemmPrecision::Bf16,
        "matmul_silu_gate_equals_group_then_silu_mul_bitwise",
    ) else {
        return;
    };
    let mut rng = Rng(24);
    for (rows, k) in [(1, 8), (37, 1000), (300, 5120), (64, 17408)] {
        let mut load = || {
            let values = rng.vec(rows * k, 1.0);
            be.load_mat(&HostTensor::from_f32_as_bf16("w", vec![rows, k], &values))
                .unwrap()
        };
        let (gate, up) = (load(), load());
        common::assert_silu_gate_is_the_two_ops(be, &gate, &up, &mut rng, "bf16");
    }
}

/// With f32 gate and up products (`MLP_BF16_GATE_UP=0`; the default rounds them, see the next
/// test) the whole gated MLP is bit for bit its first half then the down projection, on either side
/// of the GEMV kernels' row counts (past them the activation reaches the down GEMM as bf16 written
/// by `silu_mul_bf16`, the form the GEMM's own cast gave it), with and without that path
/// (`MLP_BF16_ACT=0` on the second backend).
#[test]
fn dense_mlp_equals_silu_gate_then_down_bitwise() {
    let test = "dense_mlp_equals_silu_gate_then_down_bitwise";
    let Some(be) = cuda_prefill_without_shortcuts(test) else {
        return;
    };
    let Some(by_f32) = common::cuda_mlp_f32_act(test) else {
        return;
    };
    let mut rng = Rng(25);
    for (h, im) in [(64, 200), (1024, 3072)] {
        let load = |b: &CudaBackend, values: &[f32], rows: usize, cols: usize| {
            b.load_mat(&HostTensor::from_f32_as_bf16("w", vec![rows, cols], values))
                .unwrap()
        };
        let (g, u, d) = (
            rng.vec(im * h, 0.5),
            rng.vec(im * h, 0.5),
            rng.vec(h * im, 0.5),
        );
        for b in [be, by_f32] {
            let (gate, up, down) = (load(b, &g, im, h), load(b, &u, im, h), load(b, &d, h, im));
            for tokens in [1, 4, 9, 33, 300] {
                let x = b.upload(&rng.vec(tokens * h, 1.0));
                let mut whole = b.upload(&vec![f32::NAN; tokens * h]);
                b.dense_mlp(&x, [&gate, &up, &down], &mut whole, tokens);
                let mut act = b.zeros(tokens * im);
                b.matmul_silu_gate(&x, &gate, &up, &mut act, tokens);
                let mut parts = b.zeros(tokens * h);
                b.matmul_group(&act, &[&down], &mut [&mut parts], tokens);
                assert_eq!(
                    b.to_host(&whole),
                    b.to_host(&parts),
                    "dense_mlp [{h} -> {im} -> {h}], {tokens} tokens: differs from its parts"
                );
            }
        }
    }
}

/// With bf16 gate and up products (the default; `MLP_BF16_GATE_UP=0` keeps them f32) a prefill's
/// dense MLP rounds each product to bf16 before the activation (relative 2^-9 each, so ~2^-8 on an
/// activation whose silu is about linear there) and otherwise computes what the f32 path computes:
/// within 1e-2 of its largest output, where a wrong kernel (gate and up swapped, a product
/// unwritten) is off by O(1). Row counts within the GEMV kernels take the same path on both.
#[test]
fn dense_mlp_with_bf16_gate_up_products_stays_within_their_rounding() {
    let test = "dense_mlp_with_bf16_gate_up_products_stays_within_their_rounding";
    let (Some(be), Some(f32_products)) = (
        cuda(GemmPrecision::Bf16, test),
        cuda_prefill_without_shortcuts(test),
    ) else {
        return;
    };
    let mut rng = Rng(26);
    for (h, im) in [(64, 200), (1024, 3072)] {
        let (g, u, d) = (
            rng.vec(im * h, 0.5),
            rng.vec(im * h, 0.5),
            rng.vec(h * im, 0.5),
        );
        // The two products run as one batched GEMM in the weights' address order: loading up
        // before gate (usually the lower address) takes the other order.
        let mlp = |b: &CudaBackend, x: &[f32], tokens: usize, up_first: bool| {
            let load = |values: &[f32], rows: usize, cols: usize| {
                b.load_mat(&HostTensor::from_f32_as_bf16("w", vec![rows, cols], values))
                    .unwrap()
            };
            let (gate, up) = if up_first {
                let up = load(&u, im, h);
                (load(&g, im, h), up)
            } else {
                (load(&g, im, h), load(&u, im, h))
            };
            let down = load(&d, h, im);
            let mut out = b.upload(&vec![f32::NAN; tokens * h]);
            b.dense_mlp(&b.upload(x), [&gate, &up, &down], &mut out, tokens);
            b.to_host(&out)
        };
        for (tokens, up_first) in [4, 9, 33, 300]
            .into_iter()
            .flat_map(|tokens| [(tokens, false), (tokens, true)])
        {
            let x = rng.vec(tokens * h, 1.0);
            check(
                &format!(
                    "dense_mlp bf16 gate/up [{h} -> {im} -> {h}], {tokens} tokens, up loaded first: {up_first}"
                ),
                &mlp(be, &x, tokens, up_first),
                &mlp(f32_products, &x, tokens, false),
                1e-2,
            );
        }
    }
}

/// The fused residual add + RMSNorm is bit for bit the two ops one after the other.
#[test]
fn add_rms_norm_equals_add_then_norm_bitwise() {
    let Some(be) = cuda(
        GemmPrecision::Bf16,
        "add_rms_norm_equals_add_then_norm_bitwise",
    ) else {
        return;
    };
    let mut rng = Rng(23);
    // By quads in registers, by quads in a loop (beyond 8 values a thread of 1024), one value at a
    // time in registers and in a loop.
    for (rows, dim) in [
        (1, 5120),
        (3, 1000),
        (7, 64),
        (3, 128),
        (2, 9000),
        (2, 33),
        (2, 8195),
    ] {
        let (h, x, w) = (
            rng.vec(rows * dim, 2.0),
            rng.vec(rows * dim, 2.0),
            rng.vec(dim, 0.5),
        );
        let w = be.upload(&w);
        let mut acc_fused = be.upload(&h);
        let mut out_fused = be.upload(&vec![f32::NAN; rows * dim]);
        be.add_rms_norm(
            &mut acc_fused,
            &be.upload(&x),
            &w,
            1e-6,
            dim,
            &mut out_fused,
        );
        let mut acc = be.upload(&h);
        be.add_inplace(&mut acc, &be.upload(&x));
        let mut out = be.zeros(rows * dim);
        be.rms_norm(&acc, &w, 1e-6, dim, &mut out);
        assert_eq!(
            be.to_host(&acc_fused),
            be.to_host(&acc),
            "residual [{rows}x{dim}]"
        );
        assert_eq!(
            be.to_host(&out_fused),
            be.to_host(&out),
            "norm [{rows}x{dim}]"
        );
        let (_, (got, want)) = op_check::add_rms_norm(be, &w, &be.to_host(&w), &h, &x, 1e-6);
        check(
            &format!("add_rms_norm [{rows}x{dim}]"),
            &got,
            &want,
            TOL_DENSE,
        );
    }
}

/// A norm's bf16 twin, which the bf16 GEMM or GEMV then reads in place of its own cast, is that
/// cast bit for bit: the product of the norm's output equals the product of a copy of it (no twin),
/// with rows past the GEMV kernels (twin written) and within them (written by default, read by
/// the 2-4 row lane kernels and the 5-8 row tensor-core one; none with `GEMV_TWIN=0`, the second
/// backend).
#[test]
fn bf16_twins_of_norm_outputs_equal_the_gemm_cast_bitwise() {
    let test = "bf16_twins_of_norm_outputs_equal_the_gemm_cast_bitwise";
    let (Some(default), Some(gemm_twins_only)) = (
        cuda(GemmPrecision::Bf16, test),
        cuda_without_gemv_twins(test),
    ) else {
        return;
    };
    for be in [default, gemm_twins_only] {
        norm_twins_equal_the_cast(be);
    }
}

fn norm_twins_equal_the_cast(be: &CudaBackend) {
    let mut rng = Rng(29);
    let (dim, n) = (1024, 96);
    let w = be
        .load_mat(&HostTensor::from_f32_as_bf16(
            "w",
            vec![n, dim],
            &rng.vec(n * dim, 0.1),
        ))
        .unwrap();
    let product = |x: &_, tokens: usize| {
        let mut out = be.zeros(tokens * n);
        be.matmul(x, &w, &mut out, tokens);
        be.to_host(&out)
    };
    for tokens in [2, 3, 4, 6, 200] {
        let len = tokens * dim;
        let scale = be.upload(&rng.vec(dim, 0.5));
        let mut acc = be.upload(&rng.vec(len, 2.0));
        let mut normed = be.zeros(len);
        be.add_rms_norm(
            &mut acc,
            &be.upload(&rng.vec(len, 2.0)),
            &scale,
            1e-6,
            dim,
            &mut normed,
        );
        assert_eq!(
            product(&normed, tokens),
            product(&be.copy_buf(&normed), tokens),
            "add_rms_norm, {tokens} rows"
        );
        // The GDN output norm: heads of 128 values, `dim / 128` a token.
        let head_scale = be.upload(&rng.vec(128, 0.5));
        let mut gated = be.zeros(len);
        be.gated_rms_norm(
            &be.upload(&rng.vec(len, 2.0)),
            &be.upload(&rng.vec(len, 2.0)),
            &head_scale,
            1e-6,
            128,
            &mut gated,
        );
        assert_eq!(
            product(&gated, tokens),
            product(&be.copy_buf(&gated), tokens),
            "gated_rms_norm, {tokens} rows"
        );
        // A write after the norm drops the twin: the product sees the new values.
        be.add_inplace(&mut normed, &gated);
        assert_eq!(
            product(&normed, tokens),
            product(&be.copy_buf(&normed), tokens),
            "add_rms_norm then add_inplace, {tokens} rows"
        );
    }
}

#[test]
fn embedding_gathers_rows_exactly() {
    for precision in [GemmPrecision::F32, GemmPrecision::Bf16] {
        let Some(be) = cuda(precision, "embedding_gathers_rows_exactly") else {
            return;
        };
        let mut rng = Rng(3);
        let (vocab, hidden) = (300, 72);
        let values = rng.vec(vocab * hidden, 2.0);
        for bf16 in [true, false] {
            let t = if bf16 {
                HostTensor::from_f32_as_bf16("e", vec![vocab, hidden], &values)
            } else {
                HostTensor::from_f32("e", vec![vocab, hidden], &values)
            };
            // Under Bf16 an f32 table is stored rounded.
            let expect_table = if bf16 || precision == GemmPrecision::Bf16 {
                HostTensor::from_f32_as_bf16("e", vec![vocab, hidden], &values)
            } else {
                t.clone()
            };
            let ids = [0u32, 299, 5, 5, 17, 123, 0];
            let (got, want) = op_check::embedding(
                be,
                &be.load_mat(&t).unwrap(),
                &ReferenceBackend.load_mat(&expect_table).unwrap(),
                &ids,
            );
            check(
                &format!("embedding {precision:?} checkpoint-bf16={bf16}"),
                &got,
                &want,
                0.0,
            );
        }
    }
}

#[test]
fn norms_and_elementwise_ops_match_reference() {
    let Some(be) = cuda(
        GemmPrecision::F32,
        "norms_and_elementwise_ops_match_reference",
    ) else {
        return;
    };
    let mut rng = Rng(4);
    for (rows, dim) in [
        (1, 1),
        (3, 31),
        (5, 32),
        (130, 64),
        (2, 257),
        (4, 1000),
        (3, 1024),
        (2, 5120),
    ] {
        let x = rng.vec(rows * dim, 3.0);
        let z = rng.vec(rows * dim, 3.0);
        let w = rng.vec(dim, 0.5);
        let (got, want) = op_check::rms_norm(be, &be.upload(&w), &w, &x, 1e-6);
        check(&format!("rms_norm [{rows}x{dim}]"), &got, &want, TOL_DENSE);
        let (got, want) = op_check::gated_rms_norm(be, &be.upload(&w), &w, &x, &z, 1e-6);
        check(
            &format!("gated_rms_norm [{rows}x{dim}]"),
            &got,
            &want,
            TOL_DENSE,
        );
    }

    let n = 100_003;
    let (a, b) = (rng.vec(n, 4.0), rng.vec(n, 4.0));
    let (got, want) = op_check::add_inplace(be, &a, &b);
    check("add_inplace", &got, &want, TOL_DENSE);
    let (got, want) = op_check::silu_mul(be, &a, &b);
    check("silu_mul", &got, &want, TOL_DENSE);
    let (got, want) = op_check::sigmoid_mul_inplace(be, &a, &b);
    check("sigmoid_mul_inplace", &got, &want, TOL_DENSE);

    for (rows, dim) in [(1, 64), (77, 96)] {
        let x = rng.vec(rows * dim, 2.0);
        let gate = rng.vec(rows, 3.0);
        let (got, want) = op_check::sigmoid_scale_rows(be, &x, &gate, dim);
        check(
            &format!("sigmoid_scale_rows [{rows}x{dim}]"),
            &got,
            &want,
            TOL_DENSE,
        );

        let y = rng.vec(rows * 40, 1.0);
        let (got, want) = op_check::concat_cols(be, &x, &y, dim, 40);
        check(&format!("concat_cols [{rows}x{dim}+40]"), &got, &want, 0.0);
    }

    let (rows, dim) = (37, 65);
    let src = rng.vec(rows * dim, 1.0);
    let pick = [36u32, 0, 5, 5, 20];
    let (got, want) = op_check::gather_rows(be, &src, dim, &pick);
    check("gather_rows", &got, &want, 0.0);
    let (got, want) = op_check::gather_rows(be, &src, dim, &[]);
    check("gather_rows (none)", &got, &want, 0.0);

    // Repeated destination rows: added in list order.
    let updates = rng.vec(pick.len() * dim, 1.0);
    let weights = [0.25f32, -1.5, 0.75, 0.5, 2.0];
    let (got, want) = op_check::scatter_add_rows(be, &src, &updates, dim, &pick, &weights);
    check("scatter_add_rows", &got, &want, TOL_DENSE);

    let logits = rng.vec(9 * 8, 3.0);
    let mut tied = logits.clone();
    tied[8..16].fill(0.5);
    for (input, label) in [(&logits, "random"), (&tied, "tied")] {
        for (k, renorm) in [(2, true), (3, false)] {
            let (got, want) = op_check::route_top_k(be, input, 8, k, renorm);
            assert_eq!(got, want, "route_top_k {label} k={k}");
        }
    }
}

#[test]
fn rope_matches_reference() {
    let Some(be) = cuda(GemmPrecision::F32, "rope_matches_reference") else {
        return;
    };
    let mut rng = Rng(5);
    for (heads, head_dim, rotary_dim, theta) in [
        (4, 32, 8, 1e4f32),
        (2, 256, 64, 1e7),
        (3, 32, 32, 1e6),
        (1, 16, 2, 1e4),
    ] {
        let positions = [0u32, 1, 2, 63, 64, 65, 1000, 100_000, 262_143];
        let x = rng.vec(positions.len() * heads * head_dim, 2.0);
        let (got, want) = op_check::rope(be, &x, &positions, heads, head_dim, rotary_dim, theta);
        check(
            &format!("rope heads={heads} head_dim={head_dim} rotary={rotary_dim} theta={theta}"),
            &got,
            &want,
            TOL_DENSE,
        );
    }
}

/// The attention's fused q/k norms and RoPE are bit for bit the four ops (two norms, two
/// rotations), for the 27B shape (24 q heads, 4 kv heads of 256, 64 rotated dims), a head dim that
/// is no multiple of a warp, and one or several tokens.
#[test]
fn qk_norm_rope_equals_norms_then_ropes_bitwise() {
    let Some(be) = cuda(
        GemmPrecision::Bf16,
        "qk_norm_rope_equals_norms_then_ropes_bitwise",
    ) else {
        return;
    };
    let mut rng = Rng(25);
    for (q_heads, kv_heads, head_dim, rotary_dim, positions) in [
        (24, 4, 256, 64, vec![543u32]),
        (6, 2, 48, 16, vec![0, 1, 64, 262_143]),
        (2, 2, 256, 256, vec![7, 8, 9]),
    ] {
        let shape = AttnShape {
            q_heads,
            kv_heads,
            head_dim,
        };
        let t = positions.len();
        let q_raw = be.upload(&rng.vec(t * q_heads * head_dim, 2.0));
        let k_raw = be.upload(&rng.vec(t * kv_heads * head_dim, 2.0));
        let norms = [
            be.upload(&rng.vec(head_dim, 0.5)),
            be.upload(&rng.vec(head_dim, 0.5)),
        ];
        let poisoned = |n: usize| be.upload(&vec![f32::NAN; n]);
        let (mut q, mut k) = (
            poisoned(t * q_heads * head_dim),
            poisoned(t * kv_heads * head_dim),
        );
        let rope = (rotary_dim, 1e7f32);
        be.qk_norm_rope(
            &q_raw,
            &k_raw,
            [&norms[0], &norms[1]],
            1e-6,
            &positions,
            shape,
            rope,
            &mut q,
            &mut k,
        );
        let (mut q_ref, mut k_ref) = (
            be.zeros(t * q_heads * head_dim),
            be.zeros(t * kv_heads * head_dim),
        );
        be.rms_norm(&q_raw, &norms[0], 1e-6, head_dim, &mut q_ref);
        be.rms_norm(&k_raw, &norms[1], 1e-6, head_dim, &mut k_ref);
        be.rope(&mut q_ref, &positions, q_heads, head_dim, rotary_dim, 1e7);
        be.rope(&mut k_ref, &positions, kv_heads, head_dim, rotary_dim, 1e7);
        assert_eq!(
            be.to_host(&q),
            be.to_host(&q_ref),
            "q {shape:?} at {positions:?}"
        );
        assert_eq!(
            be.to_host(&k),
            be.to_host(&k_ref),
            "k {shape:?} at {positions:?}"
        );
    }
}

/// Blocks of sequence `s` out of `seqs`, interleaved so that no block table is contiguous.
fn blocks_of(s: usize, per_seq: usize, seqs: usize) -> Vec<u32> {
    (0..per_seq).map(|i| (i * seqs + s) as u32).collect()
}

/// (q heads, kv heads, head_dim, per sequence (new tokens, cached tokens)).
type AttentionCase = (usize, usize, usize, &'static [(usize, usize)]);

/// Inputs of one attention case: pools on both backends whose blocks hold random cached K/V (the
/// cuda pool stored as `dtype`; with `bf16_reference` the reference sees every input rounded to
/// bf16, the flash kernel's view), a packed batch whose block tables are interleaved, and the new
/// rows' q, k, v.
struct AttentionInputs {
    shape: AttnShape,
    pools: AttentionPools<CudaBackend>,
    batch: BatchLayout,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

fn attention_inputs(
    be: &CudaBackend,
    rng: &mut Rng,
    (q_heads, kv_heads, head_dim, seqs): AttentionCase,
    dtype: KvDtype,
    bf16_reference: bool,
) -> AttentionInputs {
    let block_size = 16;
    let per_seq = seqs
        .iter()
        .map(|&(n, p)| (n + p).div_ceil(block_size))
        .max()
        .unwrap();
    let num_blocks = per_seq * seqs.len() + 3;
    let operands = if bf16_reference {
        Operands::Bf16
    } else {
        Operands::Exact
    };
    let mut pools = AttentionPools::new(be, num_blocks, block_size, kv_heads, head_dim, dtype)
        .seen_as(operands);
    // Cached context: random K/V already in the pool at the first `pos` positions.
    let kv_len = pools.ours.elements();
    let cached_k = rng.vec(kv_len, 1.0);
    let cached_v = rng.vec(kv_len, 1.0);
    pools.hold(be, &cached_k, &cached_v);
    let batch = BatchLayout::packed(
        block_size,
        seqs.iter()
            .enumerate()
            .map(|(s, &(n, p))| (n, p, blocks_of(s, per_seq, seqs.len()), s)),
    );
    let t = batch.total_tokens();
    let q = rng.vec(t * q_heads * head_dim, 1.5);
    let mut k = rng.vec(t * kv_heads * head_dim, 1.5);
    let v = rng.vec(t * kv_heads * head_dim, 1.0);
    // Values halfway between two bf16 values, so that the pool checks see ties go to the even one.
    let ties = [
        1.0 + 2f32.powi(-8),
        -(1.0 + 3.0 * 2f32.powi(-8)),
        0.5 + 2f32.powi(-9),
    ];
    for (x, tie) in k.iter_mut().zip(ties) {
        *x = tie;
    }
    AttentionInputs {
        shape: AttnShape {
            q_heads,
            kv_heads,
            head_dim,
        },
        pools,
        batch,
        q,
        k,
        v,
    }
}

impl AttentionInputs {
    /// Attention of the new rows on the cuda backend and on the reference: `(got, want)`.
    fn attend(&mut self, be: &CudaBackend) -> (Vec<f32>, Vec<f32>) {
        self.pools
            .attend(be, &self.q, &self.k, &self.v, &self.batch, self.shape)
    }
}

#[test]
fn paged_attention_matches_reference() {
    let Some(be) = cuda(GemmPrecision::F32, "paged_attention_matches_reference") else {
        return;
    };
    // Head dims 32, 64, 128 and 256 run the warp-per-position kernels (contexts over 64 positions
    // are split and combined); 16 the general one. The last case is a long prefill chunk whose
    // split partials would exceed the workspace cap: its blocks take several chunks each.
    let cases: [AttentionCase; 7] = [
        (4, 2, 32, &[(150, 0)]),
        (4, 2, 128, &[(1, 300), (40, 0), (1, 0)]),
        (6, 2, 32, &[(1, 0), (63, 0), (64, 0), (65, 0)]),
        (8, 1, 64, &[(65, 150), (1, 63), (1, 64), (2, 150)]),
        (2, 2, 256, &[(64, 1), (1, 200)]),
        (4, 4, 16, &[(5, 0), (1, 5), (150, 65)]),
        (16, 2, 64, &[(1024, 7700)]),
    ];
    for dtype in [KvDtype::F32, KvDtype::Bf16] {
        let mut rng = Rng(6);
        for (q_heads, kv_heads, head_dim, seqs) in cases {
            let mut case = attention_inputs(
                be,
                &mut rng,
                (q_heads, kv_heads, head_dim, seqs),
                dtype,
                false,
            );
            let (got, want) = case.attend(be);
            let label = format!(
                "attention, {} pool, q{q_heads}/kv{kv_heads} d{head_dim} seqs {seqs:?}",
                dtype.name()
            );
            check(&label, &got, &want, TOL_ATTENTION);
            let ((k_pool, k_ref), (v_pool, v_ref)) = case.pools.contents(be);
            check(&format!("{label} k pool"), &k_pool, &k_ref, 0.0);
            check(&format!("{label} v pool"), &v_pool, &v_ref, 0.0);
        }
    }
}

/// Decode attention that takes a kv head's query heads in one block (batches of 8+ rows; groups of
/// 2, 4, 6 and 8 at head dims 128 and 256: the 27B's 24/4 at 256, the 9B's 16/4, Qwen3-Next's 16/2
/// at 256) equals the reference and, bit for bit, the same attention one head a block
/// (`ATTENTION_GQA=0`), on both pool dtypes, with decode rows, short verifies and contexts that are
/// split and combined.
#[test]
fn grouped_decode_attention_equals_one_head_a_block_bitwise() {
    let test = "grouped_decode_attention_equals_one_head_a_block_bitwise";
    // At least GROUPED_ATTENTION_MIN_ROWS (8) rows each: fewer take one head a block either way.
    let cases: [AttentionCase; 4] = [
        (24, 4, 256, &[(1, 543), (1, 2047), (4, 100), (1, 0), (1, 7)]),
        (16, 4, 128, &[(1, 63), (2, 64), (1, 300), (4, 1)]),
        (16, 2, 256, &[(1, 1000), (3, 5), (4, 9)]),
        (4, 2, 128, &[(1, 129), (8, 0)]),
    ];
    for dtype in [KvDtype::F32, KvDtype::Bf16] {
        let Some(grouped) = common::cuda_kv(GemmPrecision::Bf16, dtype, test) else {
            return;
        };
        let options = CudaOptions {
            gemm_precision: GemmPrecision::Bf16,
            kv_dtype: Some(dtype),
            defines: vec![("ATTENTION_GQA".to_string(), "0".to_string())],
            ..CudaOptions::default()
        };
        let one_head = CudaBackend::with_options(0, options).expect("a second backend on GPU 0");
        for (seed, case) in cases.into_iter().enumerate() {
            let inputs = |be: &CudaBackend| {
                attention_inputs(be, &mut Rng(40 + seed as u64), case, dtype, false)
            };
            let (got, want) = inputs(grouped).attend(grouped);
            let (single, _) = inputs(&one_head).attend(&one_head);
            let label = format!("grouped attention, {} pool, {case:?}", dtype.name());
            check(&label, &got, &want, TOL_ATTENTION);
            assert_eq!(got, single, "{label}: differs from one head a block");
        }
    }
}

/// Prefill chunks of 64 tokens or more take the tensor-core flash kernel on a bf16 backend (the f32
/// one above never does): q, k, v and the probabilities are rounded to bf16 there, so the reference
/// sees q, k and v rounded the same way and the tolerance covers the probabilities' rounding. The
/// batches mix flash rows with decode rows (paged kernels), GQA groups of 1 to 6 q heads, tiles that
/// end inside a token's heads, and cached context before the chunk. Both pool dtypes: an f32 pool's
/// K/V are rounded to bf16 as the kernel loads them, a bf16 pool holds them rounded the same way
/// (nearest even), so the flash rows must come out bit for bit the same from either pool. Without
/// the two defaults (`FLASH_HEAVY_FIRST=0`: tiles launched in plan order, not heaviest first;
/// `FLASH_KV_PIPELINE=0`: a bf16 pool's tiles single-buffered) every output is bit for bit the same.
#[test]
fn flash_prefill_attention_matches_reference() {
    let test = "flash_prefill_attention_matches_reference";
    let Some(be) = cuda(GemmPrecision::Bf16, test) else {
        return;
    };
    let plain = common::cuda_flash_plain(test);
    let mut rng = Rng(16);
    let cases: [AttentionCase; 5] = [
        (24, 4, 256, &[(200, 0), (1, 300), (100, 37)]),
        (16, 2, 128, &[(64, 0), (129, 500), (2, 9)]),
        (4, 2, 32, &[(70, 10), (3, 0)]),
        (8, 8, 64, &[(300, 0)]),
        (6, 1, 256, &[(1000, 1100)]),
    ];
    for (q_heads, kv_heads, head_dim, seqs) in cases {
        let shape = (q_heads, kv_heads, head_dim, seqs);
        let draws = rng.0;
        let mut outputs = Vec::new();
        for dtype in [KvDtype::F32, KvDtype::Bf16] {
            // The same inputs for both pools.
            rng.0 = draws;
            let (got, want) = attention_inputs(be, &mut rng, shape, dtype, true).attend(be);
            let label = format!(
                "flash attention, {} pool, q{q_heads}/kv{kv_heads} d{head_dim} seqs {seqs:?}",
                dtype.name()
            );
            check(&label, &got, &want, TOL_FLASH);
            if let Some(plain) = plain {
                rng.0 = draws;
                let (without, _) =
                    attention_inputs(plain, &mut rng, shape, dtype, true).attend(plain);
                assert!(
                    without == got,
                    "{label}: FLASH_HEAVY_FIRST=0 FLASH_KV_PIPELINE=0 change the output"
                );
            }
            outputs.push(got);
        }
        let row = q_heads * head_dim;
        let mut start = 0;
        for &(new, _) in seqs {
            if new >= deltaserve_cuda::FLASH_MIN_TOKENS {
                let flash_rows = start * row..(start + new) * row;
                assert!(
                    outputs[0][flash_rows.clone()] == outputs[1][flash_rows],
                    "flash attention q{q_heads}/kv{kv_heads} d{head_dim} seqs {seqs:?}: the flash rows \
                     of the sequence at row {start} differ between the f32 and the bf16 pool"
                );
            }
            start += new;
        }
    }
}

/// State pools on both backends holding random conv windows and states.
fn state_pools(
    be: &CudaBackend,
    rng: &mut Rng,
    slots: usize,
    conv_dim: usize,
    shape: GdnShape,
) -> StatePools<CudaBackend> {
    let mut pools = StatePools::new(
        be,
        slots,
        conv_dim,
        4,
        shape.value_heads,
        shape.key_dim,
        shape.value_dim,
    );
    let conv = rng.vec(pools.reference.conv.len(), 1.0);
    let ssm = rng.vec(pools.reference.ssm.len(), 0.5);
    pools.hold(be, &conv, &ssm);
    pools
}

/// A ragged batch: a long prefill, a prefill shorter than the conv window, a continued prefill, a
/// decode, and a 4-token verify with snapshot slots; slots are not in row order.
fn gdn_batch(lens: &[(usize, bool)]) -> (BatchLayout, usize) {
    let mut seqs = Vec::new();
    let mut start = 0;
    let mut next_snapshot = lens.len() + 1;
    for (i, &(len, snapshots)) in lens.iter().enumerate() {
        let snapshot_slots = if snapshots {
            let s: Vec<usize> = (next_snapshot..next_snapshot + len).collect();
            next_snapshot += len;
            s
        } else {
            Vec::new()
        };
        seqs.push(SeqLayout {
            start,
            len,
            pos: 7,
            blocks: Vec::new(),
            slot: lens.len() - i,
            snapshot_slots,
        });
        start += len;
    }
    (
        BatchLayout {
            seqs,
            block_size: 16,
        },
        next_snapshot,
    )
}

/// Key dims 16, 32 and 128 run the register-resident kernel; 24 the general one. Batches with a
/// sequence of 16+ new tokens run the conv parallel over tokens; the fifth only short ones. Batches
/// with a sequence of 32+ tokens and no snapshots run the chunked delta rule (the last two: partial
/// column slices and partial chunks).
fn gdn_shapes() -> [(GdnShape, &'static [(usize, bool)]); 8] {
    [
        (
            GdnShape {
                key_heads: 2,
                value_heads: 6,
                key_dim: 16,
                value_dim: 16,
            },
            &[(150, false), (2, false), (65, false), (1, false), (4, true)],
        ),
        (
            GdnShape {
                key_heads: 2,
                value_heads: 4,
                key_dim: 32,
                value_dim: 24,
            },
            &[(1, false), (63, false), (64, false), (3, true)],
        ),
        (
            GdnShape {
                key_heads: 1,
                value_heads: 2,
                key_dim: 128,
                value_dim: 128,
            },
            &[(65, false), (1, false), (2, true)],
        ),
        (
            GdnShape {
                key_heads: 2,
                value_heads: 2,
                key_dim: 24,
                value_dim: 40,
            },
            &[(33, false), (1, false), (3, true)],
        ),
        (
            GdnShape {
                key_heads: 2,
                value_heads: 4,
                key_dim: 32,
                value_dim: 32,
            },
            &[(1, false), (4, true), (2, false)],
        ),
        (
            GdnShape {
                key_heads: 1,
                value_heads: 2,
                key_dim: 128,
                value_dim: 128,
            },
            &[(100, false), (1, false), (17, false)],
        ),
        (
            GdnShape {
                key_heads: 2,
                value_heads: 4,
                key_dim: 32,
                value_dim: 24,
            },
            &[(70, false), (16, false), (33, false), (2, false)],
        ),
        // Longer than the chunked form's 2048-row window: the first sequence continues in the
        // next window from the state the first one left.
        (
            GdnShape {
                key_heads: 1,
                value_heads: 2,
                key_dim: 32,
                value_dim: 32,
            },
            &[(2100, false), (40, false)],
        ),
    ]
}

#[test]
fn causal_conv1d_matches_reference_with_snapshots() {
    let Some(be) = cuda(
        GemmPrecision::F32,
        "causal_conv1d_matches_reference_with_snapshots",
    ) else {
        return;
    };
    let mut rng = Rng(7);
    for (shape, lens) in gdn_shapes() {
        let conv_dim = shape.conv_dim();
        let (batch, slots) = gdn_batch(lens);
        let mut pools = state_pools(be, &mut rng, slots, conv_dim, shape);
        let t = batch.total_tokens();
        let x = rng.vec(t * conv_dim, 2.0);
        let w = rng.vec(conv_dim * 4, 0.5);
        let (got, want) = pools.causal_conv1d(be, &x, &be.upload(&w), &w, &batch);
        let label = format!("causal_conv1d conv_dim {conv_dim} lens {lens:?}");
        check(&label, &got, &want, TOL_DENSE);
        let ((windows, windows_ref), _) = pools.contents(be);
        check(&format!("{label} windows"), &windows, &windows_ref, 0.0);
    }
}

#[test]
fn gdn_gates_match_reference() {
    let Some(be) = cuda(GemmPrecision::F32, "gdn_gates_match_reference") else {
        return;
    };
    let mut rng = Rng(8);
    let (t, heads) = (67, 6);
    let a = rng.vec(t * heads, 25.0); // crosses softplus's threshold of 20
    let b = rng.vec(t * heads, 6.0);
    let a_log = rng.vec(heads, 1.0);
    let dt_bias = rng.vec(heads, 1.0);
    let ((g, g_ref), (beta, beta_ref)) = op_check::gdn_gates(
        be,
        &a,
        &b,
        &be.upload(&a_log),
        &a_log,
        &be.upload(&dt_bias),
        &dt_bias,
    );
    check("gdn_gates g", &g, &g_ref, TOL_DENSE);
    check("gdn_gates beta", &beta, &beta_ref, TOL_DENSE);
}

#[test]
fn gated_delta_rule_matches_reference_with_snapshots() {
    let test = "gated_delta_rule_matches_reference_with_snapshots";
    let (Some(recurrent), Some(chunked)) = (cuda(GemmPrecision::F32, test), cuda_chunked_gdn(test))
    else {
        return;
    };
    check_gated_delta_rule(recurrent, "recurrent prefill", TOL_GDN);
    check_gated_delta_rule(chunked, "chunked prefill", TOL_GDN_CHUNKED);
}

fn check_gated_delta_rule(be: &CudaBackend, prefill: &str, tol: f32) {
    let mut rng = Rng(9);
    for (shape, lens) in gdn_shapes() {
        let conv_dim = shape.conv_dim();
        let (batch, slots) = gdn_batch(lens);
        let mut pools = state_pools(be, &mut rng, slots, conv_dim, shape);
        let t = batch.total_tokens();
        let hv = shape.value_heads;
        let mixed = rng.vec(t * conv_dim, 1.0);
        let g: Vec<f32> = rng
            .vec(t * hv, 1.0)
            .iter()
            .map(|x| -0.3 * (x + 1.0))
            .collect();
        let beta: Vec<f32> = rng.vec(t * hv, 1.0).iter().map(|x| 0.5 + 0.5 * x).collect();
        let (got, want) = pools.gated_delta_rule(be, &mixed, &g, &beta, &batch, shape);
        let label = format!("gated_delta_rule ({prefill}) {shape:?} lens {lens:?}");
        check(&label, &got, &want, tol);
        let (_, (states, states_ref)) = pools.contents(be);
        check(
            &format!("{label} states (snapshots included)"),
            &states,
            &states_ref,
            tol,
        );
    }
}

/// The pipelined scan (the default; `GDN_SCAN_PIPELINE=0` turns it off: the next chunk's operands
/// load while a chunk computes) runs the same products in the same order as the sequential one: bit for bit the same
/// outputs and states on every shape and batch of `gdn_shapes`, sequences of 1 to 33 chunks and one
/// that crosses a 2048-row window among them.
#[test]
fn pipelined_chunk_scan_equals_the_sequential_one_bitwise() {
    let test = "pipelined_chunk_scan_equals_the_sequential_one_bitwise";
    let (Some(sequential), Some(pipelined)) =
        (cuda_chunked_gdn_sequential(test), cuda_chunked_gdn(test))
    else {
        return;
    };
    let mut rng = Rng(13);
    for (shape, lens) in gdn_shapes() {
        let (batch, slots) = gdn_batch(lens);
        let (t, hv) = (batch.total_tokens(), shape.value_heads);
        let pool_seed = 200 + t as u64;
        let mixed = rng.vec(t * shape.conv_dim(), 1.0);
        let g: Vec<f32> = rng
            .vec(t * hv, 1.0)
            .iter()
            .map(|x| -0.3 * (x + 1.0))
            .collect();
        let beta: Vec<f32> = rng.vec(t * hv, 1.0).iter().map(|x| 0.5 + 0.5 * x).collect();
        let run = |be: &CudaBackend| {
            delta_rule_from_seeded_pools(be, shape, slots, pool_seed, t, |pools, out| {
                be.gated_delta_rule(
                    &be.upload(&mixed),
                    &be.upload(&g),
                    &be.upload(&beta),
                    pools,
                    &batch,
                    shape,
                    out,
                )
            })
        };
        let (want, got) = (run(sequential), run(pipelined));
        assert_eq!(got.0, want.0, "outputs {shape:?} lens {lens:?}");
        assert_eq!(got.1, want.1, "states {shape:?} lens {lens:?}");
    }
}

/// The gates computed inside the delta rule (decode's row kernel; the other paths run the gates
/// op first) give bit for bit the outputs and states of the gates op then the rule, on every
/// shape and batch of `gdn_shapes`, with the chunked prefill and without.
#[test]
fn gates_and_delta_rule_equal_gates_then_rule_bitwise() {
    let test = "gates_and_delta_rule_equal_gates_then_rule_bitwise";
    let (Some(recurrent), Some(chunked)) = (cuda(GemmPrecision::F32, test), cuda_chunked_gdn(test))
    else {
        return;
    };
    for be in [recurrent, chunked] {
        let mut rng = Rng(12);
        for (shape, lens) in gdn_shapes() {
            let (batch, slots) = gdn_batch(lens);
            let (t, hv) = (batch.total_tokens(), shape.value_heads);
            let pool_seed = 100 + t as u64;
            let mixed = be.upload(&rng.vec(t * shape.conv_dim(), 1.0));
            let (a, b) = (
                be.upload(&rng.vec(t * hv, 25.0)),
                be.upload(&rng.vec(t * hv, 6.0)),
            );
            let (a_log, dt_bias) = (be.upload(&rng.vec(hv, 1.0)), be.upload(&rng.vec(hv, 1.0)));
            let run = |fused: bool| {
                delta_rule_from_seeded_pools(be, shape, slots, pool_seed, t, |pools, out| {
                    if fused {
                        let gates = GdnGateInputs {
                            a: &a,
                            b: &b,
                            a_log: &a_log,
                            dt_bias: &dt_bias,
                        };
                        be.gdn_gates_and_delta_rule(&mixed, gates, pools, &batch, shape, out);
                    } else {
                        let (mut g, mut beta) = (be.zeros(t * hv), be.zeros(t * hv));
                        be.gdn_gates(&a, &b, &a_log, &dt_bias, &mut g, &mut beta);
                        be.gated_delta_rule(&mixed, &g, &beta, pools, &batch, shape, out);
                    }
                })
            };
            let (fused, separate) = (run(true), run(false));
            assert_eq!(fused.0, separate.0, "outputs {shape:?} lens {lens:?}");
            assert_eq!(fused.1, separate.1, "states {shape:?} lens {lens:?}");
        }
    }
}

/// The outputs and states of `rule` over `t` tokens, run on state pools filled from `pool_seed`:
/// two runs with the same seed start from the same random windows and states.
fn delta_rule_from_seeded_pools(
    be: &CudaBackend,
    shape: GdnShape,
    slots: usize,
    pool_seed: u64,
    t: usize,
    rule: impl FnOnce(&mut StateLayerPool<CudaBackend>, &mut CudaBuf),
) -> (Vec<f32>, Vec<f32>) {
    let mut pools = state_pools(be, &mut Rng(pool_seed), slots, shape.conv_dim(), shape);
    let mut out = be.upload(&vec![f32::NAN; t * shape.value_heads * shape.value_dim]);
    rule(&mut pools.ours, &mut out);
    let (_, (states, _)) = pools.contents(be);
    (be.to_host(&out), states)
}

#[test]
fn state_slots_reset_and_copy() {
    let Some(be) = cuda(GemmPrecision::F32, "state_slots_reset_and_copy") else {
        return;
    };
    let mut rng = Rng(10);
    let shape = GdnShape {
        key_heads: 2,
        value_heads: 6,
        key_dim: 16,
        value_dim: 16,
    };
    let mut pools = state_pools(be, &mut rng, 5, shape.conv_dim(), shape);
    for (src, dst) in [(0, 3), (4, 1), (2, 2)] {
        pools.copy_slot(be, src, dst);
    }
    pools.reset_slot(be, 4);
    let ((conv, conv_ref), (ssm, ssm_ref)) = pools.contents(be);
    check(
        "state slots: conv after copies and a reset",
        &conv,
        &conv_ref,
        0.0,
    );
    check(
        "state slots: ssm after copies and a reset",
        &ssm,
        &ssm_ref,
        0.0,
    );
}
