//! Every op of `CpuBackend` against `ReferenceBackend` on random inputs, on every kernel level the
//! CPU has (portable, AVX2 + FMA, AVX-512), with shapes chosen to hit the edges of
//! the SIMD width, the GEMM blocks, the KV blocks and the GDN chunks.
//!
//! Tolerances: the reference accumulates in f64, this backend in f32. A dot product of length K
//! with f32 accumulation errs by about sqrt(K) * 2^-24 * sum|x_i w_i| in the typical case; relative
//! to the largest output magnitude that is ~1e-6 for K = 1000. Errors are measured as
//! max |got - want| / max(1, max |want|); each assertion allows 3-15x the worst error measured on
//! an AVX-512 machine and on the portable path (printed with `--nocapture`), see `TOL_*`.

use super::{CpuBackend, IsaLevel};
use crate::backend::{AttnShape, Backend, GdnShape};
use crate::batch::BatchLayout;
use crate::host::HostTensor;
use crate::op_check::{self, check, AttentionPools, Operands, Rng, StatePools};
use crate::reference::ReferenceBackend;

/// Matrix products with K up to 1000 (measured worst: 1.7e-6, K = 1000).
const TOL_MATMUL: f32 = 5e-6;
/// Norms, rope, conv and elementwise ops (measured worst: 2.7e-7, rms_norm over 1024).
const TOL_DENSE: f32 = 2e-6;
/// Attention (softmax + weighted sums over up to 151 positions, measured worst: 3.6e-7).
const TOL_ATTENTION: f32 = 2e-6;
/// GDN outputs and states after up to 220 tokens from a non-zero state (measured worst: 1.2e-7).
const TOL_GDN: f32 = 2e-6;

/// One backend per kernel level this CPU runs (scalar, AVX2, AVX-512), forced with `with_isa`
/// whatever `DELTASERVE_CPU_LEVEL` says; thread counts differ so work splits differ too.
fn backends() -> Vec<(&'static str, CpuBackend)> {
    IsaLevel::available()
        .into_iter()
        .enumerate()
        .map(|(i, level)| {
            let be = CpuBackend::with_isa(2 + i % 2, level).unwrap();
            assert_eq!(
                be.isa().level(),
                level,
                "a supported level is used as forced"
            );
            (level.name(), be)
        })
        .collect()
}

/// `backends()` and one more at the best level with the bf16 matmul precision (`vdpbf16ps` pairs
/// where the CPU has them).
fn backends_and_bf16_precision() -> Vec<(&'static str, CpuBackend)> {
    let bf16_options = super::CpuOptions {
        threads: 2,
        matmul_precision: super::MatmulPrecision::Bf16,
        max_isa: IsaLevel::Avx512,
    };
    let mut configs = backends();
    configs.push(("best bf16", CpuBackend::with_options(bf16_options).unwrap()));
    configs
}

#[test]
fn matmul_matches_reference_for_every_kernel_and_dtype() {
    let mut rng = Rng(1);
    for (name, be) in backends() {
        for (n, k) in [(1, 1), (7, 15), (33, 17), (64, 64), (300, 1000)] {
            let values = rng.vec(n * k, 1.0);
            for bf16 in [true, false] {
                let t = if bf16 {
                    HostTensor::from_f32_as_bf16("w", vec![n, k], &values)
                } else {
                    HostTensor::from_f32("w", vec![n, k], &values)
                };
                let w = be.load_mat(&t).unwrap();
                let w_ref = ReferenceBackend.load_mat(&t).unwrap();
                for tokens in [1, 2, 3, 4, 5, 9, 17, 65, 130] {
                    let x = rng.vec(tokens * k, 1.0);
                    let (got, want) =
                        op_check::matmul(&be, &w, &w_ref, &x, tokens, Operands::Exact);
                    let label = format!("matmul {name} bf16={bf16} [{tokens}x{k}] @ [{n}x{k}]^T");
                    check(&label, &got, &want, TOL_MATMUL);
                    let mut got = vec![f32::NAN; tokens * n];
                    be.matmul_gemv(&x, &w, &mut got, tokens);
                    check(&format!("{label} gemv"), &got, &want, TOL_MATMUL);
                    let mut got = vec![f32::NAN; tokens * n];
                    be.matmul_gemm(&x, &w, &mut got, tokens);
                    check(&format!("{label} gemm"), &got, &want, TOL_MATMUL);
                }
            }
        }
    }
}

/// A random block-FP8 matrix `[n, k]` (128 x 128 blocks, no NaN code) as a checkpoint's loader
/// gives it: the exactly dequantized f32 values with the codes and scales beside them, and the
/// same values without them.
fn block_fp8_pair(rng: &mut Rng, n: usize, k: usize) -> (HostTensor, HostTensor) {
    use crate::block_fp8_matrix::{scale_grid, BlockFp8Matrix};
    let block = [128, 128];
    let [grid_rows, grid_cols] = scale_grid(n, k, block);
    let codes: Vec<u8> = (0..n * k)
        .map(|_| {
            let c = ((rng.next_f32() + 1.0) * 127.99) as u8;
            if c & 0x7f == 0x7f {
                c - 1
            } else {
                c
            }
        })
        .collect();
    let scales: Vec<f32> = rng
        .vec(grid_rows * grid_cols, 1.0)
        .iter()
        .map(|v| v.abs() * 0.01 + 1e-4)
        .collect();
    let values: Vec<f32> = (0..n * k)
        .map(|i| {
            let (r, c) = (i / k, i % k);
            crate::e4m3::e4m3_to_f32(codes[i]) * scales[(r / block[0]) * grid_cols + c / block[1]]
        })
        .collect();
    let plain = HostTensor::from_f32("w", vec![n, k], &values);
    let fp8 = plain.clone().with_block_fp8(BlockFp8Matrix {
        codes,
        scales,
        block,
    });
    (fp8, plain)
}

/// Block-FP8 weights kept as codes and scales compute bit for bit what their f32 values compute,
/// at every level, in the GEMV (1-4 rows), the GEMM (more), a group and an embedding lookup: the
/// kernels rebuild each weight's f32 value with one rounding, the one the checkpoint's
/// dequantization makes. The shapes cut the scale grid in partial blocks (200 rows, 300 and 1000
/// columns) and a panel of rows past the end.
#[test]
fn block_fp8_weights_compute_what_their_f32_values_compute() {
    let mut rng = Rng(31);
    for (name, be) in backends_and_bf16_precision() {
        for (n, k) in [(200, 300), (64, 128), (130, 1000)] {
            let (fp8_t, plain_t) = block_fp8_pair(&mut rng, n, k);
            let (fp8, plain) = (be.load_mat(&fp8_t).unwrap(), be.load_mat(&plain_t).unwrap());
            assert!(fp8.is_fp8() && !plain.is_fp8(), "{name}: FP8 kept");
            assert!(
                fp8.bytes() * 3 < plain.bytes(),
                "{name}: a quarter of the bytes, about"
            );
            let w_ref = ReferenceBackend.load_mat(&plain_t).unwrap();
            for tokens in [1, 2, 3, 4, 5, 9, 17] {
                let x = rng.vec(tokens * k, 1.0);
                let label = format!("{name} [{tokens}x{k}] @ fp8 [{n}x{k}]^T");
                let (got, want) = op_check::matmul(&be, &fp8, &w_ref, &x, tokens, Operands::Exact);
                check(&label, &got, &want, TOL_MATMUL);
                let (same, _) = op_check::matmul(&be, &plain, &w_ref, &x, tokens, Operands::Exact);
                assert_eq!(got, same, "{label}: differs from the f32 values' product");
                let mut group = [vec![f32::NAN; tokens * n], vec![f32::NAN; tokens * n]];
                let [a, b] = &mut group;
                be.matmul_group(&x, &[&fp8, &plain], &mut [a, b], tokens);
                assert_eq!(
                    (&group[0], &group[1]),
                    (&same, &same),
                    "{label}: in a group"
                );
            }
            let ids: Vec<u32> = [0, 1, 63, 64, n - 1]
                .into_iter()
                .filter(|&i| i < n)
                .map(|i| i as u32)
                .collect();
            let (mut rows, mut want) = (vec![0.0; ids.len() * k], vec![0.0; ids.len() * k]);
            be.embedding(&fp8, &ids, &mut rows);
            be.embedding(&plain, &ids, &mut want);
            assert_eq!(rows, want, "{name}: embedding rows of the FP8 matrix");
        }
    }
}

#[test]
fn a_matmul_group_equals_each_matrix_alone() {
    // The group runs the panels of all its matrices in one parallel region; each output must be
    // bit for bit what `matmul` gives for its matrix alone, and match the reference. The shapes mix
    // matrices split across threads (>= 256 KiB: the 1000 x 300 ones) with small ones that run as
    // one piece, and token counts on both sides of the GEMV / GEMM boundary.
    let mut rng = Rng(14);
    let configs = backends_and_bf16_precision();
    let k = 300;
    for (name, be) in configs {
        let tensors: Vec<HostTensor> = [1000, 7, 640, 65]
            .into_iter()
            .enumerate()
            .map(|(i, n)| {
                let values = rng.vec(n * k, 1.0);
                if i % 2 == 0 {
                    HostTensor::from_f32_as_bf16("w", vec![n, k], &values)
                } else {
                    HostTensor::from_f32("w", vec![n, k], &values)
                }
            })
            .collect();
        let ws: Vec<_> = tensors.iter().map(|t| be.load_mat(t).unwrap()).collect();
        let w_refs: Vec<_> = tensors
            .iter()
            .map(|t| ReferenceBackend.load_mat(t).unwrap())
            .collect();
        let (ws, w_refs): (Vec<_>, Vec<_>) = (ws.iter().collect(), w_refs.iter().collect());
        for tokens in [1, 2, 3, 5, 9, 20] {
            let x = rng.vec(tokens * k, 1.0);
            let exact = op_check::matmul_group(&be, &ws, &w_refs, &x, tokens, Operands::Exact);
            let rounded = op_check::matmul_group(&be, &ws, &w_refs, &x, tokens, Operands::Bf16);
            for (i, w) in ws.iter().enumerate() {
                // The bf16 precision rounds the activations of bf16 matrices only.
                let rounds = be.bf16_pairs() && tensors[i].dtype == crate::DType::BF16;
                let (got, want) = if rounds { &rounded[i] } else { &exact[i] };
                let label = format!("matmul_group {name} matrix {i} [{tokens}x{k}]");
                check(&label, got, want, TOL_MATMUL);
                let mut alone = vec![f32::NAN; tokens * w.rows()];
                be.matmul(&x, w, &mut alone, tokens);
                assert!(got == &alone, "{label}: differs from the matrix alone");
            }
        }
    }
}

#[test]
fn bf16_precision_equals_the_exact_product_of_bf16_rounded_activations() {
    // The bf16 precision rounds activations to bf16 and then multiplies exactly (GEMM and GEMV
    // alike): against the reference fed the same rounded activations it must be as close as the
    // f32 path is; against the unrounded reference its error is the rounding's (measured ~1.5e-3).
    let options = super::CpuOptions {
        threads: 2,
        matmul_precision: super::MatmulPrecision::Bf16,
        max_isa: IsaLevel::Avx512,
    };
    let be = CpuBackend::with_options(options).unwrap();
    let mut rng = Rng(12);
    for (n, k, tokens) in [(70, 1001, 65), (300, 256, 130), (5, 3, 7), (33, 64, 1)] {
        let t = HostTensor::from_f32_as_bf16("w", vec![n, k], &rng.vec(n * k, 1.0));
        let (w, w_ref) = (
            be.load_mat(&t).unwrap(),
            ReferenceBackend.load_mat(&t).unwrap(),
        );
        let x = rng.vec(tokens * k, 1.0);
        let (got, exact) = op_check::matmul(&be, &w, &w_ref, &x, tokens, Operands::Exact);
        let label = format!("bf16 matmul [{tokens}x{k}] @ [{n}x{k}]^T");
        if be.isa().bf16_dot() {
            let (got, rounded) = op_check::matmul(&be, &w, &w_ref, &x, tokens, Operands::Bf16);
            check(
                &format!("{label} vs rounded input"),
                &got,
                &rounded,
                TOL_MATMUL,
            );
            check(&format!("{label} vs exact input"), &got, &exact, 1e-2);
        } else {
            // Without AVX512_BF16 the precision falls back to the exact f32 product.
            check(&format!("{label} (f32 fallback)"), &got, &exact, TOL_MATMUL);
        }
    }
}

#[test]
fn matmul_results_do_not_depend_on_the_token_count() {
    // A row's output must be bit-identical whether it is multiplied alone (GEMV), with a few others
    // (GEMV with more tokens per pass) or inside a prefill (blocked GEMM, split across threads):
    // the engine batches sequences freely and a sequence's numbers must not depend on its company.
    let mut rng = Rng(13);
    let configs = backends_and_bf16_precision();
    for (name, be) in configs {
        for (n, k) in [(130, 300), (64, 1001)] {
            let values = rng.vec(n * k, 1.0);
            for t in [
                HostTensor::from_f32_as_bf16("w", vec![n, k], &values),
                HostTensor::from_f32("w", vec![n, k], &values),
            ] {
                let w = be.load_mat(&t).unwrap();
                let x = rng.vec(70 * k, 1.0);
                let mut all = vec![0.0; 70 * n];
                be.matmul(&x, &w, &mut all, 70);
                for tokens in [1, 2, 3, 4, 5, 7, 9, 13] {
                    for first in [0, 21] {
                        let part = x[first * k..(first + tokens) * k].to_vec();
                        let mut got = vec![0.0; tokens * n];
                        be.matmul(&part, &w, &mut got, tokens);
                        let want = &all[first * n..(first + tokens) * n];
                        assert!(
                            got == want,
                            "{name} {:?} [{n}x{k}]: rows {first}.. change with {tokens} tokens",
                            t.dtype
                        );
                        be.matmul_gemv(&part, &w, &mut got, tokens);
                        assert!(
                            got == want,
                            "{name} {:?} [{n}x{k}]: GEMV of {tokens} tokens differs from GEMM",
                            t.dtype
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_of_an_f16_checkpoint_widens_exactly() {
    let be = CpuBackend::new(2);
    let values = [1.0f32, -0.5, 0.25, 2.0, 3.0, -4.0];
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
        .collect();
    let owner: std::sync::Arc<dyn crate::host::ByteOwner> = std::sync::Arc::new(bytes);
    let t =
        HostTensor::from_owner("w", crate::dtype::DType::F16, vec![2, 3], owner, 0, 12).unwrap();
    let w = be.load_mat(&t).unwrap();
    let mut out = vec![0.0; 2];
    be.matmul(&vec![1.0, 1.0, 1.0], &w, &mut out, 1);
    assert_eq!(out, vec![0.75, 1.0]);
}

#[test]
fn embedding_and_row_ops_match_reference() {
    let mut rng = Rng(2);
    for (name, be) in backends() {
        let table = rng.vec(50 * 24, 1.0);
        for t in [
            HostTensor::from_f32_as_bf16("e", vec![50, 24], &table),
            HostTensor::from_f32("e", vec![50, 24], &table),
        ] {
            let ids = [3u32, 49, 0, 3];
            let (table, table_ref) = (
                be.load_mat(&t).unwrap(),
                ReferenceBackend.load_mat(&t).unwrap(),
            );
            let (got, want) = op_check::embedding(&be, &table, &table_ref, &ids);
            check(&format!("embedding {name} {:?}", t.dtype), &got, &want, 0.0);
        }
        let (a, b) = (rng.vec(6 * 5, 1.0), rng.vec(6 * 3, 1.0));
        let (got, want) = op_check::concat_cols(&be, &a, &b, 5, 3);
        check(&format!("concat {name}"), &got, &want, 0.0);
        let src = rng.vec(7 * 9, 1.0);
        let rows = [6u32, 0, 6, 2];
        let (got, want) = op_check::gather_rows(&be, &src, 9, &rows);
        check(&format!("gather {name}"), &got, &want, 0.0);
        let weights = [0.5f32, -1.5, 0.25, 2.0];
        let part = rng.vec(4 * 9, 1.0);
        let (got, want) = op_check::scatter_add_rows(&be, &src, &part, 9, &rows, &weights);
        check(&format!("scatter_add {name}"), &got, &want, TOL_DENSE);
        let logits = rng.vec(5 * 12, 4.0);
        for renorm in [true, false] {
            let (got, want) = op_check::route_top_k(&be, &logits, 12, 3, renorm);
            assert_eq!(got, want, "route_top_k {name}");
        }
    }
}

#[test]
fn norms_and_activations_match_reference() {
    let mut rng = Rng(3);
    for (name, be) in backends() {
        for (rows, dim) in [(1, 1), (3, 100), (40, 1024)] {
            let x = rng.vec(rows * dim, 3.0);
            let z = rng.vec(rows * dim, 6.0);
            let w = rng.vec(dim, 0.5);
            let (got, want) = op_check::rms_norm(&be, &w, &w, &x, 1e-6);
            check(
                &format!("rms_norm {name} [{rows}x{dim}]"),
                &got,
                &want,
                TOL_DENSE,
            );
            let ((acc, acc_ref), (got, want)) = op_check::add_rms_norm(&be, &w, &w, &z, &x, 1e-6);
            check(
                &format!("add_rms_norm {name} [{rows}x{dim}] residual"),
                &acc,
                &acc_ref,
                TOL_DENSE,
            );
            check(
                &format!("add_rms_norm {name} [{rows}x{dim}]"),
                &got,
                &want,
                TOL_DENSE,
            );
            let (got, want) = op_check::gated_rms_norm(&be, &w, &w, &x, &z, 1e-6);
            check(
                &format!("gated_rms_norm {name} [{rows}x{dim}]"),
                &got,
                &want,
                TOL_DENSE,
            );
        }
        // Below and above the parallel split, values wide enough to reach exp's saturation.
        for n in [1000, 100_003] {
            let a = rng.vec(n, 30.0);
            let b = rng.vec(n, 2.0);
            let (got, want) = op_check::add_inplace(&be, &a, &b);
            check(&format!("add {name} {n}"), &got, &want, TOL_DENSE);
            let (got, want) = op_check::silu_mul(&be, &a, &b);
            check(&format!("silu_mul {name} {n}"), &got, &want, TOL_DENSE);
            let (got, want) = op_check::sigmoid_mul_inplace(&be, &b, &a);
            check(&format!("sigmoid_mul {name} {n}"), &got, &want, TOL_DENSE);
            let dim = 7;
            let gate = rng.vec(n / dim, 20.0);
            let (got, want) = op_check::sigmoid_scale_rows(&be, &a[..n / dim * dim], &gate, dim);
            check(
                &format!("sigmoid_scale_rows {name} {n}"),
                &got,
                &want,
                TOL_DENSE,
            );
        }
    }
}

#[test]
fn rope_matches_reference() {
    let mut rng = Rng(4);
    for (name, be) in backends() {
        for (tokens, heads, head_dim, rotary) in [(5, 3, 32, 16), (70, 2, 256, 64)] {
            let x = rng.vec(tokens * heads * head_dim, 2.0);
            let positions: Vec<u32> = (0..tokens).map(|i| (i as u32 * 7919) % 100_000).collect();
            let (got, want) =
                op_check::rope(&be, &x, &positions, heads, head_dim, rotary, 10_000_000.0);
            check(&format!("rope {name} T={tokens}"), &got, &want, TOL_DENSE);
        }
    }
}

/// A batch whose sequences own scattered blocks: sequence `i` of `(len, pos)` gets the blocks
/// listed in `tables[i]`.
fn batch_of(
    block_size: usize,
    seqs: &[(usize, usize)],
    tables: &[Vec<u32>],
    slots: &[usize],
) -> BatchLayout {
    BatchLayout::packed(
        block_size,
        seqs.iter()
            .zip(tables)
            .zip(slots)
            .map(|((&(len, pos), blocks), &slot)| (len, pos, blocks.clone(), slot)),
    )
}

#[test]
fn attention_matches_reference_over_ragged_batches_and_decodes() {
    let shape = AttnShape {
        q_heads: 6,
        kv_heads: 2,
        head_dim: 40,
    };
    let block_size = 5;
    let num_blocks = 40;
    // Non-contiguous, interleaved block tables; 5 does not divide any of the lengths.
    let tables = vec![
        vec![7u32, 2, 30, 11, 5, 19, 23],
        vec![0u32, 33],
        vec![12u32, 1, 39, 8, 25, 3, 14, 36, 20],
    ];
    // Step 1: prefill chunks (one starting mid-sequence after an empty cache is not meaningful, so
    // the second step continues them); step 2: a decode, a second prefill chunk and a decode;
    // step 3: decodes only.
    let steps: Vec<Vec<(usize, usize)>> = vec![
        vec![(23, 0), (1, 0), (17, 0)],
        vec![(1, 23), (4, 1), (21, 17)],
        vec![(1, 24), (1, 5), (1, 38)],
    ];
    let mut rng = Rng(5);
    for (name, be) in backends() {
        let mut pools = AttentionPools::new(
            &be,
            num_blocks,
            block_size,
            shape.kv_heads,
            shape.head_dim,
            be.kv_dtype(),
        );
        for (s, step) in steps.iter().enumerate() {
            let batch = batch_of(block_size, step, &tables, &[0, 1, 2]);
            batch.validate(num_blocks, 3).unwrap();
            let t = batch.total_tokens();
            let q = rng.vec(t * shape.q_heads * shape.head_dim, 2.0);
            let k = rng.vec(t * shape.kv_heads * shape.head_dim, 2.0);
            let v = rng.vec(t * shape.kv_heads * shape.head_dim, 1.0);
            let (got, want) = pools.attend(&be, &q, &k, &v, &batch, shape);
            check(
                &format!("attention {name} step {s}"),
                &got,
                &want,
                TOL_ATTENTION,
            );
            let ((k_pool, k_ref), (v_pool, v_ref)) = pools.contents(&be);
            check(
                &format!("attention {name} step {s} K pool"),
                &k_pool,
                &k_ref,
                0.0,
            );
            check(
                &format!("attention {name} step {s} V pool"),
                &v_pool,
                &v_ref,
                0.0,
            );
        }
    }
}

#[test]
fn attention_with_full_size_heads_matches_reference() {
    let shape = AttnShape {
        q_heads: 8,
        kv_heads: 2,
        head_dim: 256,
    };
    let block_size = 16;
    let tables = vec![(0..12u32).rev().collect::<Vec<_>>()];
    let mut rng = Rng(6);
    for (name, be) in backends() {
        let mut pools = AttentionPools::new(&be, 12, block_size, 2, 256, be.kv_dtype());
        for (s, step) in [(150usize, 0usize), (1, 150)].into_iter().enumerate() {
            let batch = batch_of(block_size, &[step], &tables, &[0]);
            let t = batch.total_tokens();
            let q = rng.vec(t * 8 * 256, 1.0);
            let k = rng.vec(t * 2 * 256, 1.0);
            let v = rng.vec(t * 2 * 256, 1.0);
            let (got, want) = pools.attend(&be, &q, &k, &v, &batch, shape);
            check(
                &format!("attention 256 {name} step {s}"),
                &got,
                &want,
                TOL_ATTENTION,
            );
        }
    }
}

/// Sequences of a GDN step: `(len, snapshot slots)` in state slots 0, 1, 2, ...
fn gdn_batch(seqs: &[(usize, Vec<usize>)]) -> BatchLayout {
    let mut batch = BatchLayout::packed(
        256,
        seqs.iter()
            .enumerate()
            .map(|(i, (len, _))| (*len, 0, vec![0], i)),
    );
    for (seq, (_, snaps)) in batch.seqs.iter_mut().zip(seqs) {
        seq.snapshot_slots = snaps.clone();
    }
    batch
}

#[test]
fn conv1d_matches_reference_with_state_carried_and_snapshots() {
    let dim = 37;
    let slots = 12;
    let mut rng = Rng(7);
    let steps = [
        vec![(1, vec![]), (5, vec![]), (20, vec![]), (2, vec![])],
        vec![(1, vec![]), (3, vec![6, 7, 8]), (1, vec![9]), (40, vec![])],
    ];
    // Kernel 4 (every supported model, a fused path) and 3 (the generic path).
    for kernel in [4, 3] {
        for (name, be) in backends() {
            let mut pools = StatePools::new(&be, slots, dim, kernel, 1, 1, 1);
            let init = rng.vec(pools.ours.conv.len(), 1.0);
            let ssm = pools.ours.ssm.clone();
            pools.hold(&be, &init, &ssm);
            let w = rng.vec(dim * kernel, 1.0);
            for (s, step) in steps.iter().enumerate() {
                let batch = gdn_batch(step);
                batch.validate(1, slots).unwrap();
                let x = rng.vec(batch.total_tokens() * dim, 2.0);
                let (got, want) = pools.causal_conv1d(&be, &x, &w, &w, &batch);
                check(
                    &format!("conv1d k={kernel} {name} step {s}"),
                    &got,
                    &want,
                    TOL_DENSE,
                );
                let ((windows, windows_ref), _) = pools.contents(&be);
                check(
                    &format!("conv1d k={kernel} {name} step {s} windows"),
                    &windows,
                    &windows_ref,
                    0.0,
                );
            }
        }
    }
}

#[test]
fn gdn_gates_and_state_slots_match_reference() {
    let mut rng = Rng(8);
    for (name, be) in backends() {
        let heads = 6;
        let (a, b) = (rng.vec(9 * heads, 8.0), rng.vec(9 * heads, 8.0));
        let (a_log, dt_bias) = (rng.vec(heads, 1.0), rng.vec(heads, 15.0));
        let ((g, g_ref), (beta, beta_ref)) =
            op_check::gdn_gates(&be, &a, &b, &a_log, &a_log, &dt_bias, &dt_bias);
        check(&format!("gdn_gates g {name}"), &g, &g_ref, 0.0);
        check(&format!("gdn_gates beta {name}"), &beta, &beta_ref, 0.0);

        let mut pools = StatePools::new(&be, 3, 5, 4, 2, 3, 4);
        let conv_len = pools.ours.conv.len();
        let init = rng.vec(conv_len + pools.ours.ssm.len(), 1.0);
        pools.hold(&be, &init[..conv_len], &init[conv_len..]);
        pools.copy_slot(&be, 2, 0);
        pools.reset_slot(&be, 1);
        let ((conv, conv_ref), (ssm, ssm_ref)) = pools.contents(&be);
        check(&format!("state slots {name} conv"), &conv, &conv_ref, 0.0);
        check(&format!("state slots {name} ssm"), &ssm, &ssm_ref, 0.0);
        let pool = &pools.ours;
        let (c, s) = (pool.conv_slot_len(), pool.ssm_slot_len());
        assert_eq!(pool.conv[..c], pool.conv[2 * c..]);
        assert_eq!(pool.ssm[..s], pool.ssm[2 * s..]);
        assert!(pool.conv[c..2 * c]
            .iter()
            .chain(&pool.ssm[s..2 * s])
            .all(|&v| v == 0.0));
        assert_eq!(pool.ssm[2 * s..], init[conv_len + 2 * s..]);
    }
}

/// Runs `steps` of the gated delta rule on both backends from the same non-zero initial state and
/// compares outputs and every state slot after each step.
fn gdn_case(
    label: &str,
    shape: GdnShape,
    slots: usize,
    steps: &[Vec<(usize, Vec<usize>)>],
    seed: u64,
) {
    let mut rng = Rng(seed);
    let hv = shape.value_heads;
    for (name, be) in backends() {
        let mut pools = StatePools::new(
            &be,
            slots,
            shape.conv_dim(),
            4,
            hv,
            shape.key_dim,
            shape.value_dim,
        );
        let init = rng.vec(pools.ours.ssm.len(), 0.5);
        let conv = pools.ours.conv.clone();
        pools.hold(&be, &conv, &init);
        for (s, step) in steps.iter().enumerate() {
            let batch = gdn_batch(step);
            batch.validate(1, slots).unwrap();
            let t = batch.total_tokens();
            let mixed = rng.vec(t * shape.conv_dim(), 1.0);
            // Realistic gates: g = -exp(a_log) softplus(a + dt_bias) in about [-3, 0), beta in (0, 1).
            let (a, b) = (rng.vec(t * hv, 3.0), rng.vec(t * hv, 3.0));
            let (a_log, dt_bias) = (rng.vec(hv, 0.5), rng.vec(hv, 1.0));
            let (mut g, mut beta) = (vec![0.0; t * hv], vec![0.0; t * hv]);
            ReferenceBackend.gdn_gates(&a, &b, &a_log, &dt_bias, &mut g, &mut beta);
            let (got, want) = pools.gated_delta_rule(&be, &mixed, &g, &beta, &batch, shape);
            check(
                &format!("{label} {name} step {s} out"),
                &got,
                &want,
                TOL_GDN,
            );
            let (_, (states, states_ref)) = pools.contents(&be);
            check(
                &format!("{label} {name} step {s} states"),
                &states,
                &states_ref,
                TOL_GDN,
            );
        }
    }
}

#[test]
fn gated_delta_rule_matches_reference_across_chunk_boundaries() {
    // Value/key head ratio 3; dims that are not multiples of the 16-lane width or the 64-column tile.
    let shape = GdnShape {
        key_heads: 2,
        value_heads: 6,
        key_dim: 24,
        value_dim: 40,
    };
    let steps = vec![
        vec![
            (1, vec![]),
            (63, vec![]),
            (64, vec![]),
            (65, vec![]),
            (150, vec![]),
        ],
        // Decodes, a speculative verify with snapshots, and a prefill continuing from its state.
        vec![
            (1, vec![]),
            (3, vec![7, 8, 9]),
            (1, vec![10]),
            (70, vec![]),
            (2, vec![]),
        ],
    ];
    gdn_case("gdn", shape, 11, &steps, 9);
}

#[test]
fn gated_delta_rule_matches_reference_at_model_head_size() {
    let shape = GdnShape {
        key_heads: 1,
        value_heads: 3,
        key_dim: 128,
        value_dim: 128,
    };
    let steps = vec![
        vec![(65, vec![]), (1, vec![])],
        vec![(1, vec![]), (2, vec![3, 4])],
    ];
    gdn_case("gdn 128", shape, 5, &steps, 10);
}
