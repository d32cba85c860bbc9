//! Block-FP8 weights on the GPU: the FP8 GEMV (W8A16, 1-32 rows) against the reference on the
//! exactly dequantized weights, its rows batch-invariant bit for bit over 2-32 rows (one row has a
//! kernel of its own), the W8A8 GEMV (2-16 rows, FP8 tensor cores from compute capability 8.9 on;
//! one row opt-in, `GEMV_FP8_W8A8_FROM`) and more rows on the FP8 tensor cores (the W8A8 GEMM, Hopper) against the
//! reference on the same quantized activations, or widened to bf16 behind cuBLAS within the bf16
//! GEMM tolerance, and
//! the device quantizer of `--load-format dummy --quantization fp8` equal to the host's, with the
//! weights kept as FP8 (`CudaOptions::keep_fp8_weights`, the default on Hopper) and widened to bf16
//! at load. Skipped without a GPU.
//!
//! Tolerances: the FP8 GEMV multiplies the exact FP8 values with the f32 activations (one token, on
//! the CUDA cores) or with the activations rounded to bf16 (2-32 tokens, on the tensor cores; the
//! reference is given them rounded alike) and sums in f32 (a vector's products or a 128-column
//! piece, then the block's scale), so it differs from the reference only by the order and the
//! accumulator of f32 sums over K: `TOL_FP8_GEMV` is `TOL_MATMUL` of ops.rs (K up to 17408 here). The
//! widened path rounds weights and activations to bf16 as any bf16 GEMM: `TOL_BF16_GEMM`, as in
//! golden.rs.

mod common;

use common::{
    cuda, cuda_fp8, cuda_fp8_deep, cuda_fp8_diag, cuda_fp8_diag_deep, cuda_fp8_gemm_bf16_out,
    cuda_fp8_tiles, cuda_fp8_twins, cuda_fp8_unmixed, cuda_fp8_w8a16, cuda_fp8_w8a8,
    cuda_lanes_bounded, group_products,
};
use deltaserve_cuda::GemmPrecision;
use deltaserve_model::dummy::DummySource;
use deltaserve_model::online_fp8::Fp8QuantizingSource;
use deltaserve_model::quantization::Fp8Quantization;
use deltaserve_model::source::TensorSource;
use deltaserve_tensor::e4m3::{block_scale, e4m3_to_f32, f32_to_e4m3};
use deltaserve_tensor::op_check::{check, matmul, matmul_group, Operands, Rng};
use deltaserve_tensor::reference::ReferenceBackend;
use deltaserve_tensor::{Backend, BlockFp8Matrix, DType, HostTensor};

const TOL_FP8_GEMV: f32 = 1e-5;
const TOL_BF16_GEMM: f32 = 2e-2;
/// The W8A8 GEMM against the reference on the same quantized activations: what is left is the
/// tensor cores' FP8 accumulation inside each 128-column slice (about 2^-14 of the slice's
/// magnitude sum, 128 products) before the f32 sum over slices, ~1e-3 of the largest output for
/// unit-scale random data over K = 17408 (136 slices), and the bf16 output (2^-9 = 2e-3 of a value
/// at most): 4e-3. (Against the exact activations the quantization itself costs ~3e-2 here.)
const TOL_FP8_GEMM: f32 = 4e-3;
/// The W8A8 GEMV (1-16 rows) on the same quantized activations: exact FP8 products summed in f32
/// (the mma's sums of 32 and the f32 sum over 128-column slices), an f32 output; measured on the
/// H200 at 0.9e-7..1.6e-7 of the largest output, so `TOL_FP8_GEMV`'s 1e-5 holds it.
const TOL_FP8_W8A8_GEMV: f32 = TOL_FP8_GEMV;

/// A random `[rows, cols]` block-FP8 matrix (every finite code, scales of several magnitudes) as a
/// checkpoint hands it on: the exact f32 values carrying their FP8 parts.
fn random_fp8(rng: &mut Rng, rows: usize, cols: usize) -> HostTensor {
    let grid = [rows.div_ceil(128), cols.div_ceil(128)];
    let codes: Vec<u8> = (0..rows * cols)
        .map(|_| {
            let code = ((rng.next_f32() + 1.0) * 128.0) as u8;
            if code & 0x7f == 0x7f {
                code - 1 // NaN codes never occur in a checkpoint
            } else {
                code
            }
        })
        .collect();
    let scales: Vec<f32> = (0..grid[0] * grid[1])
        .map(|i| (1.0 + rng.next_f32().abs()) * 2f32.powi(-12 + (i % 5) as i32))
        .collect();
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            e4m3_to_f32(codes[i]) * scales[(r / 128) * grid[1] + c / 128]
        })
        .collect();
    HostTensor::from_f32("w", vec![rows, cols], &values).with_block_fp8(BlockFp8Matrix {
        codes,
        scales,
        block: [128, 128],
    })
}

/// `random_fp8` loaded on `be` and on the reference backend.
fn random_fp8_on(
    be: &deltaserve_cuda::CudaBackend,
    rng: &mut Rng,
    rows: usize,
    cols: usize,
) -> (deltaserve_cuda::CudaMat, <ReferenceBackend as Backend>::Mat) {
    let t = random_fp8(rng, rows, cols);
    (
        be.load_mat(&t).unwrap(),
        ReferenceBackend.load_mat(&t).unwrap(),
    )
}

#[test]
fn fp8_gemv_matches_reference_and_is_batch_invariant() {
    let test = "fp8_gemv_matches_reference_and_is_batch_invariant";
    // The W8A16 kernels: the widening tensor-core kernel with one tile (2-8 rows; the default),
    // then all four tiles (2-32 rows).
    if let Some(be) = cuda_fp8_w8a16(test) {
        fp8_gemv_matches_reference_on(be, &[8, 2, 3, 5, 7]);
    }
    if let Some(be) = cuda_fp8_tiles(test) {
        fp8_gemv_matches_reference_on(be, &[32, 2, 3, 7, 8, 9, 16, 17, 24, 25, 31]);
    }
}

/// The one-row kernel, then `token_counts` (the widest first) on the tensor-core kernel, each
/// against the reference and bit for bit the widest's rows, then one row more than the widest
/// (widened to bf16 for cuBLAS).
fn fp8_gemv_matches_reference_on(be: &deltaserve_cuda::CudaBackend, token_counts: &[usize]) {
    let widest_count = token_counts[0];
    let mut rng = Rng(31);
    // Partial tiles in both dimensions (300 rows, 16 * 9 columns), the 27B down shape's width.
    for (rows, cols) in [(300, 144), (1030, 5120), (64, 17408)] {
        let (w, w_ref) = random_fp8_on(be, &mut rng, rows, cols);
        let x = rng.vec((widest_count + 1) * cols, 1.0);
        let (got, want) = matmul(be, &w, &w_ref, &x[..cols], 1, Operands::Exact);
        check(
            &format!("fp8 gemv [{rows}x{cols}] x 1 row"),
            &got,
            &want,
            TOL_FP8_GEMV,
        );
        let mut widest = Vec::new();
        for &tokens in token_counts {
            let (got, want) = matmul(be, &w, &w_ref, &x[..tokens * cols], tokens, Operands::Bf16);
            check(
                &format!("fp8 gemv [{rows}x{cols}] x {tokens} rows"),
                &got,
                &want,
                TOL_FP8_GEMV,
            );
            if tokens == widest_count {
                widest = got;
            } else {
                assert_eq!(
                    got,
                    widest[..tokens * rows],
                    "fp8 gemv [{rows}x{cols}]: {tokens} rows differ from the same rows among \
                     {widest_count}"
                );
            }
        }
        let past = widest_count + 1;
        let (path, operands, tol) = past_the_gemv(be, rows, cols);
        let (got, want) = matmul(be, &w, &w_ref, &x, past, operands);
        check(
            &format!("fp8 {path} [{rows}x{cols}] x {past} rows"),
            &got,
            &want,
            tol,
        );
    }
}

/// How rows past the FP8 GEMV are multiplied: on the FP8 tensor cores where the backend has them
/// and the shape fits (whole 128 x 128 blocks, scale rows of a multiple of 4 blocks), with the
/// activations quantized per 128 columns; else widened to bf16.
fn past_the_gemv(
    be: &deltaserve_cuda::CudaBackend,
    rows: usize,
    cols: usize,
) -> (&'static str, Operands, f32) {
    if be.has_fp8_gemm() && rows.is_multiple_of(128) && cols.is_multiple_of(512) {
        ("W8A8 tensor-core GEMM", Operands::E4m3Blocks, TOL_FP8_GEMM)
    } else {
        ("widened to bf16", Operands::Exact, TOL_BF16_GEMM)
    }
}

/// Decode batches past the GEMV and prefill-sized ones on FP8 weights (the W8A8 tensor-core GEMM
/// on Hopper, past the W8A8 GEMV's 16 rows): each against the reference on the same quantized
/// activations, with token counts the GEMM pads to its multiple of 16 (17, 40, 300) and ones it
/// does not (32, 64: those write f32 straight into the output, or bf16 and a cast with
/// `FP8_GEMM_F32_OUT=0`), and the 27B shape's widths.
#[test]
fn fp8_tensor_core_gemm_matches_reference_on_quantized_activations() {
    let test = "fp8_tensor_core_gemm_matches_reference_on_quantized_activations";
    for be in [cuda_fp8(test), cuda_fp8_gemm_bf16_out(test)]
        .into_iter()
        .flatten()
    {
        fp8_gemm_matches_reference_on(be);
    }
}

fn fp8_gemm_matches_reference_on(be: &deltaserve_cuda::CudaBackend) {
    if !be.has_fp8_gemm() {
        println!(
            "skipped: this GPU has no block-scaled FP8 GEMM (the widened path is tested above)"
        );
        return;
    }
    let mut rng = Rng(34);
    for (rows, cols) in [(256, 512), (1024, 5120), (128, 17408)] {
        let (w, w_ref) = random_fp8_on(be, &mut rng, rows, cols);
        for tokens in [17, 32, 40, 64, 300] {
            let x = rng.vec(tokens * cols, 1.0);
            let (got, want) = matmul(be, &w, &w_ref, &x, tokens, Operands::E4m3Blocks);
            check(
                &format!("fp8 W8A8 [{rows}x{cols}] x {tokens} rows"),
                &got,
                &want,
                TOL_FP8_GEMM,
            );
        }
    }
}

/// The W8A8 GEMV (the activations quantized per 128 columns, both operands' codes on the FP8
/// tensor cores; opt-in, here for 1 to 16 rows: one tile of 8 tokens and two) equals the reference
/// on the same quantized activations and gives each row count's rows bit for bit as among 16 (its
/// fused silu gate: below); row counts that are not whole 16-row blocks, the 27B shape's widths.
#[test]
fn fp8_w8a8_gemv_matches_reference_on_quantized_activations() {
    let test = "fp8_w8a8_gemv_matches_reference_on_quantized_activations";
    let Some(be) = cuda_fp8_w8a8(test) else {
        return;
    };
    if be.compute_capability() < (8, 9) {
        println!("skipped: no FP8 tensor cores before compute capability 8.9");
        return;
    }
    let mut rng = Rng(35);
    for (rows, cols) in [(300, 512), (1030, 5120), (64, 17408)] {
        let (w, w_ref) = random_fp8_on(be, &mut rng, rows, cols);
        let x = rng.vec(16 * cols, 1.0);
        let mut widest = Vec::new();
        for tokens in [16, 1, 2, 3, 4, 5, 7, 8, 9, 12, 15] {
            let x = &x[..tokens * cols];
            let (got, want) = matmul(be, &w, &w_ref, x, tokens, Operands::E4m3Blocks);
            check(
                &format!("fp8 W8A8 GEMV [{rows}x{cols}] x {tokens} rows"),
                &got,
                &want,
                TOL_FP8_W8A8_GEMV,
            );
            if tokens == 16 {
                widest = got;
            } else {
                assert_eq!(
                    got,
                    widest[..tokens * rows],
                    "fp8 W8A8 GEMV [{rows}x{cols}]: {tokens} rows differ from the same rows among 16"
                );
            }
        }
    }
}

/// With FP8 weights kept and `FP8_TWIN=1`, a layer norm writes its output's FP8 twin (buffer.rs), which the W8A8
/// GEMV (2-16 rows) and the FP8 GEMM (more) then read in place of quantizing the activations
/// themselves: the products of the norm's output equal those of a copy of it (no twin) bit for
/// bit. One output buffer for every row count, the widest first, so a twin written for more rows
/// is rewritten, padding included, for fewer; a write after the norm drops the twin.
#[test]
fn fp8_twins_of_norm_outputs_equal_the_gemm_quantization_bitwise() {
    let test = "fp8_twins_of_norm_outputs_equal_the_gemm_quantization_bitwise";
    let Some(be) = cuda_fp8_twins(test) else {
        return;
    };
    if be.compute_capability() < (8, 9) {
        println!("skipped: no FP8 tensor cores before compute capability 8.9, so no twins");
        return;
    }
    let mut rng = Rng(41);
    let (dim, n) = (1024, 384);
    let (w, _) = random_fp8_on(be, &mut rng, n, dim);
    let product = |x: &_, tokens: usize| {
        let mut out = be.zeros(tokens * n);
        be.matmul(x, &w, &mut out, tokens);
        be.to_host(&out)
    };
    let widest = 200;
    let scale = be.upload(&rng.vec(dim, 0.5));
    let mut normed = be.zeros(widest * dim);
    for tokens in [widest, 40, 17, 16, 9, 8, 6, 4, 3, 2] {
        let len = tokens * dim;
        let mut acc = be.upload(&rng.vec(len, 2.0));
        be.add_rms_norm(
            &mut acc,
            &be.upload(&rng.vec(len, 2.0)),
            &scale,
            1e-6,
            dim,
            &mut normed,
        );
        assert_eq!(
            normed.fp8_twin_shape(),
            Some((tokens, dim)),
            "add_rms_norm of {tokens} rows wrote no FP8 twin"
        );
        let copy = be.copy_buf(&normed);
        assert_eq!(
            product(&normed, tokens),
            product(&copy, tokens),
            "add_rms_norm, {tokens} rows"
        );
        be.add_inplace(&mut normed, &copy);
        assert_eq!(normed.fp8_twin_shape(), None);
        assert_eq!(
            product(&normed, tokens),
            product(&be.copy_buf(&normed), tokens),
            "add_rms_norm then add_inplace, {tokens} rows"
        );
    }
}

/// One token's `x @ gate^T` and `silu(x @ gate^T) * (x @ up^T)` (the fused op) on `be`.
fn one_token_products(
    be: &deltaserve_cuda::CudaBackend,
    gate: &HostTensor,
    up: &HostTensor,
    x: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let rows = gate.shape[0];
    let (g, u) = (be.load_mat(gate).unwrap(), be.load_mat(up).unwrap());
    let x = be.upload(x);
    let (mut product, mut fused) = (be.zeros(rows), be.zeros(rows));
    be.matmul(&x, &g, &mut product, 1);
    be.matmul_silu_gate(&x, &g, &u, &mut fused, 1);
    (be.to_host(&product), be.to_host(&fused))
}

/// The deeper-buffered one-token lane kernel (`GEMV_FP8_DEEP_BELOW`) gives the lane kernel's rows
/// bit for bit, plain and as the fused silu gate: the same vectors a lane, in the same order.
#[test]
fn fp8_deep_lane_kernel_is_the_lane_kernel_bitwise() {
    let test = "fp8_deep_lane_kernel_is_the_lane_kernel_bitwise";
    let (Some(plain), Some(deep)) = (cuda_fp8_w8a16(test), cuda_fp8_deep(test)) else {
        return;
    };
    let mut rng = Rng(36);
    for (rows, cols) in [(300, 144), (1030, 5120), (64, 17408)] {
        let gate = random_fp8(&mut rng, rows, cols);
        let up = random_fp8(&mut rng, rows, cols);
        let x = rng.vec(cols, 1.0);
        let run = |be| one_token_products(be, &gate, &up, &x);
        assert_eq!(run(plain), run(deep), "fp8 [{rows}x{cols}], one token");
    }
}

/// One token over a group of FP8 and bf16 matrices (an FP8 model's GDN in_proj_qkv/z beside the
/// unquantized in_proj_a/b) in one launch gives each matrix's rows bit for bit as one launch per
/// format does, and the reference's within the GEMV tolerance; a group whose bf16 rows would share
/// a warp with FP8 ones (37 rows) keeps one launch per format. `cuda_fp8_w8a16` never takes the
/// deep kernel, so the shapes here take the mixed launch on any GPU.
#[test]
fn fp8_mixed_group_is_one_launch_per_format_bitwise() {
    let test = "fp8_mixed_group_is_one_launch_per_format_bitwise";
    let (Some(mixed), Some(unmixed)) = (cuda_fp8_w8a16(test), cuda_fp8_unmixed(test)) else {
        return;
    };
    let mut rng = Rng(37);
    let cols = 1024;
    for bf16_rows in [[48, 44], [37, 8]] {
        let host: Vec<HostTensor> = vec![
            random_fp8(&mut rng, 296, cols),
            random_fp8(&mut rng, 128, cols),
            HostTensor::from_f32_as_bf16(
                "a",
                vec![bf16_rows[0], cols],
                &rng.vec(bf16_rows[0] * cols, 1.0),
            ),
            HostTensor::from_f32_as_bf16(
                "b",
                vec![bf16_rows[1], cols],
                &rng.vec(bf16_rows[1] * cols, 1.0),
            ),
        ];
        let x = rng.vec(cols, 1.0);
        let run = |be| group_products(be, &host, &x, 1);
        let got = run(mixed);
        assert_eq!(
            got,
            run(unmixed),
            "mixed group with bf16 rows {bf16_rows:?}"
        );
        for (m, (t, got)) in host.iter().zip(&got).enumerate() {
            let w = ReferenceBackend.load_mat(t).unwrap();
            let mut want = ReferenceBackend.zeros(t.shape[0]);
            ReferenceBackend.matmul(&ReferenceBackend.upload(&x), &w, &mut want, 1);
            let tol = if m < 2 { TOL_FP8_GEMV } else { TOL_BF16_GEMM };
            check(
                &format!("mixed group matrix {m}"),
                got,
                &ReferenceBackend.to_host(&want),
                tol,
            );
        }
    }
}

/// `x` as the one-token lane kernels' tensor-core form (`GEMV_FP8_DIAG`) multiplies it: each
/// 128-column group quantized to e4m3 with the scale amax / 448 (the codes of x times the scale's
/// f32 reciprocal, nearest even, saturated), then the codes' values times the scale.
fn as_diag_activations(x: &[f32]) -> Vec<f32> {
    x.chunks(128)
        .flat_map(|group| {
            let amax = group.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = block_scale(amax);
            let inv = 1.0 / scale;
            group
                .iter()
                .map(move |&v| e4m3_to_f32(f32_to_e4m3(v * inv)) * scale)
        })
        .collect()
}

/// The one-token FP8 lane kernels on the FP8 tensor cores (`GEMV_FP8_DIAG=1`: the plain, the
/// deeper-buffered and the mixed-format launch, and the fused silu gate) against the reference on
/// the activations as that form quantizes them, within the W8A8 GEMV's tolerance (exact products,
/// f32 sums of 64-column pieces); the deeper-buffered kernel bit for bit the plain one; the mixed
/// launch's bf16 rows bit for bit the CUDA-core form's. Shapes with rows past the group's end in
/// the last warp, rows whose last 16-code vectors end inside a quad (144 = 9 vectors) and a last
/// 128-column group cut short (144, 2064).
#[test]
fn fp8_one_token_on_the_tensor_cores_matches_reference() {
    let test = "fp8_one_token_on_the_tensor_cores_matches_reference";
    let (Some(diag), Some(deep), Some(lanes)) = (
        cuda_fp8_diag(test),
        cuda_fp8_diag_deep(test),
        cuda_fp8_w8a16(test),
    ) else {
        return;
    };
    let mut rng = Rng(39);
    for (rows, cols) in [
        (37, 144),
        (300, 144),
        (1030, 5120),
        (64, 17408),
        (130, 2064),
    ] {
        let gate = random_fp8(&mut rng, rows, cols);
        let up = random_fp8(&mut rng, rows, cols);
        let mut x = rng.vec(cols, 1.0);
        // Once (it then dominates every output), a group whose largest value is far above the
        // rest (they quantize to e4m3 subnormals and zeros); a group of only tiny values.
        if (rows, cols) == (300, 144) {
            x[1] = -2.0e5;
        }
        for v in &mut x[cols - 16..] {
            *v *= 1e-30;
        }
        let x_seen = as_diag_activations(&x);
        let reference = |w: &HostTensor| {
            let w = ReferenceBackend.load_mat(w).unwrap();
            let mut out = ReferenceBackend.zeros(rows);
            ReferenceBackend.matmul(&ReferenceBackend.upload(&x_seen), &w, &mut out, 1);
            ReferenceBackend.to_host(&out)
        };
        let (want_gate, want_up) = (reference(&gate), reference(&up));
        let run = |be| one_token_products(be, &gate, &up, &x);
        let (product, fused) = run(diag);
        check(
            &format!("fp8 tensor-core one token [{rows}x{cols}]"),
            &product,
            &want_gate,
            TOL_FP8_W8A8_GEMV,
        );
        let silu = |v: f32| v / (1.0 + (-v).exp());
        let want_fused: Vec<f32> = want_gate
            .iter()
            .zip(&want_up)
            .map(|(&g, &u)| silu(g) * u)
            .collect();
        check(
            &format!("fp8 tensor-core one token silu gate [{rows}x{cols}]"),
            &fused,
            &want_fused,
            TOL_FP8_W8A8_GEMV,
        );
        assert_eq!(
            (product, fused),
            run(deep),
            "fp8 tensor-core one token [{rows}x{cols}]: the deeper-buffered kernel"
        );
    }
    let cols = 1024;
    let host: Vec<HostTensor> = vec![
        random_fp8(&mut rng, 296, cols),
        random_fp8(&mut rng, 128, cols),
        HostTensor::from_f32_as_bf16("a", vec![48, cols], &rng.vec(48 * cols, 1.0)),
        HostTensor::from_f32_as_bf16("b", vec![44, cols], &rng.vec(44 * cols, 1.0)),
    ];
    let x = rng.vec(cols, 1.0);
    let x_seen = as_diag_activations(&x);
    let got = group_products(diag, &host, &x, 1);
    let on_lanes = group_products(lanes, &host, &x, 1);
    for (m, t) in host.iter().enumerate().take(2) {
        let w = ReferenceBackend.load_mat(t).unwrap();
        let mut want = ReferenceBackend.zeros(t.shape[0]);
        ReferenceBackend.matmul(&ReferenceBackend.upload(&x_seen), &w, &mut want, 1);
        check(
            &format!("fp8 tensor-core mixed group matrix {m}"),
            &got[m],
            &ReferenceBackend.to_host(&want),
            TOL_FP8_W8A8_GEMV,
        );
    }
    assert_eq!(
        got[2..],
        on_lanes[2..],
        "the mixed launch's bf16 rows with the FP8 rows on the tensor cores"
    );
}

/// The lane kernels with their whole iterations unbounded (the default) give the bounded kernels'
/// (`GEMV_LANE_UNCHECKED=0`) rows bit for bit: FP8 for one token, bf16 for 1-4, on groups whose matrices end
/// inside a warp and whose last warp runs past the group (where the bounded loop must run).
#[test]
fn lane_kernels_without_bounds_equal_the_bounded_ones_bitwise() {
    let test = "lane_kernels_without_bounds_equal_the_bounded_ones_bitwise";
    let (Some(bounded), Some(unbounded)) = (cuda_lanes_bounded(test), cuda_fp8_w8a16(test)) else {
        return;
    };
    let mut rng = Rng(38);
    for cols in [5120, 17408, 144] {
        let rows = [37, 300, 129, 10];
        let fp8: Vec<HostTensor> = rows
            .iter()
            .map(|&n| random_fp8(&mut rng, n, cols))
            .collect();
        let bf16: Vec<HostTensor> = rows
            .iter()
            .map(|&n| HostTensor::from_f32_as_bf16("w", vec![n, cols], &rng.vec(n * cols, 1.0)))
            .collect();
        for (host, token_counts) in [(&fp8, 1..=1), (&bf16, 1..=4)] {
            for tokens in token_counts {
                let x = rng.vec(tokens * cols, 1.0);
                let run = |be| group_products(be, host, &x, tokens);
                let dtype = host[0].dtype;
                assert_eq!(
                    run(bounded),
                    run(unbounded),
                    "{dtype:?} x {cols}, {tokens} tokens"
                );
            }
        }
    }
}

/// A group of FP8 matrices in one launch (row counts that split a block's 16 rows between
/// matrices, as the q/k/v and gate/up groups may) equals the reference for each matrix.
#[test]
fn fp8_matmul_group_matches_reference_for_each_matrix() {
    let test = "fp8_matmul_group_matches_reference_for_each_matrix";
    if let Some(be) = cuda_fp8_w8a16(test) {
        fp8_group_matches_reference_on(be, &[1, 3, 8]);
    }
    if let Some(be) = cuda_fp8_tiles(test) {
        fp8_group_matches_reference_on(be, &[1, 3, 8, 20]);
    }
}

fn fp8_group_matches_reference_on(be: &deltaserve_cuda::CudaBackend, token_counts: &[usize]) {
    let mut rng = Rng(33);
    let cols = 1040;
    let host: Vec<HostTensor> = [37, 300, 129, 8]
        .iter()
        .map(|&rows| random_fp8(&mut rng, rows, cols))
        .collect();
    let ws: Vec<_> = host.iter().map(|t| be.load_mat(t).unwrap()).collect();
    let w_refs: Vec<_> = host
        .iter()
        .map(|t| ReferenceBackend.load_mat(t).unwrap())
        .collect();
    let (w_list, w_ref_list): (Vec<_>, Vec<_>) = ws.iter().zip(&w_refs).unzip();
    for &tokens in token_counts {
        // One token multiplies the f32 activations, more their bf16 rounding.
        let operands = if tokens == 1 {
            Operands::Exact
        } else {
            Operands::Bf16
        };
        let x = rng.vec(tokens * cols, 1.0);
        let outputs = matmul_group(be, &w_list, &w_ref_list, &x, tokens, operands);
        for (m, (got, want)) in outputs.iter().enumerate() {
            check(
                &format!("fp8 group matrix {m}, {tokens} rows"),
                got,
                want,
                TOL_FP8_GEMV,
            );
        }
    }
}

/// The fused silu gate on FP8 weights (the paired FP8 kernels: the plain and the deeper-buffered
/// lane kernel for one row, on the CUDA cores and on the tensor cores, the widening tensor-core
/// kernel with one tile and four, the W8A8 one with one and two where k is whole 128-column blocks)
/// is bit for bit its two ops.
#[test]
fn fp8_matmul_silu_gate_equals_group_then_silu_mul_bitwise() {
    let test = "fp8_matmul_silu_gate_equals_group_then_silu_mul_bitwise";
    let backends = [
        cuda_fp8(test),
        cuda_fp8_w8a16(test),
        cuda_fp8_tiles(test),
        cuda_fp8_w8a8(test),
        cuda_fp8_diag(test),
        cuda_fp8_diag_deep(test),
    ];
    for be in backends.into_iter().flatten() {
        let mut rng = Rng(32);
        for (rows, cols) in [(300, 144), (1030, 5120)] {
            let gate = be.load_mat(&random_fp8(&mut rng, rows, cols)).unwrap();
            let up = be.load_mat(&random_fp8(&mut rng, rows, cols)).unwrap();
            common::assert_silu_gate_is_the_two_ops(be, &gate, &up, &mut rng, "fp8");
        }
    }
}

/// The device quantizer gives the host's codes and scales: the products of the two matrices (the
/// identity reads a matrix back through the FP8 GEMV one column at a time) are equal bit for bit.
#[test]
fn device_quantized_dummy_matrices_equal_host_quantized() {
    // Kept as FP8 (read back through the FP8 GEMV) and widened at load (through the bf16 one).
    let kept = cuda_fp8("device_quantized_dummy_matrices_equal_host_quantized");
    let widened = cuda(
        GemmPrecision::Bf16,
        "device_quantized_dummy_matrices_equal_host_quantized",
    );
    for be in kept.into_iter().chain(widened) {
        device_quantized_equal_host_quantized(be);
    }
}

fn device_quantized_equal_host_quantized(be: &deltaserve_cuda::CudaBackend) {
    let source = Fp8QuantizingSource::new(
        Box::new(DummySource::new(DType::BF16, 11)),
        Fp8Quantization::qwen_default(),
    );
    for (name, rows, cols) in [
        ("layers.0.mlp.gate_proj.weight", 300, 272),
        ("layers.3.linear_attn.out_proj.weight", 128, 16),
    ] {
        let spec = source
            .generated_matrix(name, [rows, cols])
            .expect("converted matrices are offered for generation");
        assert_eq!(spec.block_fp8, Some([128, 128]));
        let on_device = be
            .generate_mat(&spec)
            .expect("the cuda backend quantizes on the device under bf16")
            .expect("generation succeeds");
        let host = source.get(name, &[rows, cols]).expect("host quantization");
        assert!(
            host.block_fp8().is_some(),
            "{name}: host tensor without FP8 parts"
        );
        let uploaded = be.load_mat(&host).expect("upload");
        for (token, column) in [(0usize, 0usize), (1, cols / 2), (2, cols - 1)] {
            let mut x = vec![0.0f32; 3 * cols];
            x[token * cols + column] = 1.0;
            let x = be.upload(&x);
            let (mut a, mut b) = (be.zeros(3 * rows), be.zeros(3 * rows));
            be.matmul(&x, &on_device, &mut a, 3);
            be.matmul(&x, &uploaded, &mut b, 3);
            let (a, b) = (be.to_host(&a), be.to_host(&b));
            let differing = a
                .iter()
                .zip(&b)
                .filter(|(p, q)| p.to_bits() != q.to_bits())
                .count();
            assert_eq!(
                differing, 0,
                "{name}: column {column}: {differing} values differ"
            );
        }
        // And the values are the host's dequantized weights (exactly, through the FP8 GEMV; to
        // bf16 when widened, as the host tensor is on upload).
        let mut x = vec![0.0f32; cols];
        x[0] = 1.0;
        let mut out = be.zeros(rows);
        be.matmul(&be.upload(&x), &on_device, &mut out, 1);
        let want: Vec<f32> = host.to_f32_vec().chunks(cols).map(|row| row[0]).collect();
        let got = be.to_host(&out);
        let widened_want: Vec<f32> = want
            .iter()
            .map(|&v| {
                deltaserve_tensor::dtype::bf16_to_f32(deltaserve_tensor::dtype::f32_to_bf16(v))
            })
            .collect();
        assert!(
            got == want || got == widened_want,
            "{name}: column 0 is neither the FP8 values nor their bf16 rounding"
        );
    }
}
