//! Blocked, multi-threaded `out [T, N] = x [T, K] @ w^T` for prefill-sized T: items of (column block,
//! row range) run the `tile` kernel over their rows against the weight panels of the block, widened
//! to f32 once per depth block (bf16) or read in place (f32, bf16 pairs for `vdpbf16ps`).
//!
//! Every output is the same sequential chain over `e` as in the GEMV, so results do not depend on T.

use super::gemv::Bf16Rows;
use super::isa::Isa;
use super::mat::{CpuMat, MatData, PANEL};
use super::pack::{widen_bf16, widen_fp8};
use super::par::SharedOut;
use super::tile::{tile_raw, MAX_ROWS, TILE_COLS};
use rayon::prelude::*;
use std::ops::Range;

/// Depth of one block of widened weights (its panels stay in L2 while all rows of an item pass);
/// even, so bf16 pairs never straddle two blocks.
const KC: usize = 256;
/// Output columns of one work item: four weight panels.
const NC: usize = 4 * PANEL;
/// Rows of T below which an item is not split further.
const MIN_ROWS_PER_ITEM: usize = 8 * MAX_ROWS;

const _: () = assert!(TILE_COLS == PANEL, "a weight panel is one tile of columns");

/// How matrix products multiply bf16 weights, GEMV and GEMM alike (f32 weights always use `F32`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulPrecision {
    /// Weights widened exactly to f32, f32 activations, f32 FMA: agrees with `reference` to ~1e-6.
    #[default]
    F32,
    /// Activations rounded to bf16 (as a bf16 torch model holds them), exact bf16 x bf16 products,
    /// f32 sums, via AVX512_BF16 `vdpbf16ps`: about twice the GEMM throughput, errors of the
    /// order of bf16 rounding (measured ~1.5e-3 of the output scale). Applies to every product of a
    /// bf16 matrix, decode included, so results stay independent of batch size. On CPUs without
    /// AVX512_BF16 it falls back to `F32`.
    Bf16,
}

/// `out [tokens, rows(w)] = x [tokens, cols(w)] @ w^T`.
pub(crate) fn gemm(
    isa: Isa,
    pool: &rayon::ThreadPool,
    w: &CpuMat,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
) {
    let (n, k) = (w.rows(), w.cols());
    assert!(
        x.len() >= tokens * k,
        "matmul input holds {} values, {tokens} tokens of {k} need more",
        x.len()
    );
    assert!(
        out.len() >= tokens * n,
        "matmul output holds {} values, {tokens} x {n} need more",
        out.len()
    );
    if n == 0 || tokens == 0 {
        return;
    }
    if k == 0 {
        out[..tokens * n].fill(0.0);
        return;
    }
    let pairs = matches!(w.data(), MatData::Bf16Pairs(_));
    let bf16_x = pairs.then(|| Bf16Rows::new(isa, pool, x, tokens, k));
    let n_blocks = n.div_ceil(NC);
    let wanted_items = 4 * pool.current_num_threads();
    let t_splits = wanted_items
        .div_ceil(n_blocks)
        .min(tokens.div_ceil(MIN_ROWS_PER_ITEM))
        .max(1);
    let t_per = tokens.div_ceil(t_splits).next_multiple_of(MAX_ROWS);
    let items: Vec<(usize, usize)> = (0..n_blocks)
        .flat_map(|nb| (0..tokens).step_by(t_per).map(move |t0| (nb, t0)))
        .collect();
    let shared = SharedOut::new(&mut out[..tokens * n]);
    let run = |&(nb, t0): &(usize, usize)| {
        let cols = nb * NC..((nb + 1) * NC).min(n);
        let rows = t0..(t0 + t_per).min(tokens);
        // SAFETY: items cover disjoint (row range, column block) rectangles of `out`, so no two
        // concurrent items write the same element; shapes were asserted above.
        unsafe {
            match &bf16_x {
                Some(xb) if isa.bf16_dot() => item_pairs(w, xb, &shared, rows, cols),
                _ => item_f32(isa, w, x, bf16_x.as_ref(), &shared, rows, cols),
            }
        }
    };
    if items.len() == 1 {
        items.iter().for_each(run);
    } else {
        pool.install(|| items.par_iter().for_each(run));
    }
}

/// Computes `out[rows, cols]` over the whole depth K with f32 panels (`cols.start` is a multiple
/// of `PANEL`). A pair matrix reaching here (a CPU without AVX512_BF16) is widened like bf16 and
/// multiplied with the bf16-rounded activations `xb`; block-FP8 panels are widened to their f32
/// values (`mat::Fp8Panels`).
///
/// Safety: `x` is `[T, K]` and `out` is `[T, N]` for `w` `[N, K]` with `rows.end <= T`,
/// `cols.end <= N`; no other thread touches `out[rows, cols]` during the call.
unsafe fn item_f32(
    isa: Isa,
    w: &CpuMat,
    x: &[f32],
    xb: Option<&Bf16Rows>,
    out: &SharedOut<'_>,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    let (n, k) = (w.rows(), w.cols());
    let panels = cols.len().div_ceil(PANEL);
    let first = cols.start / PANEL;
    // Activations as f32: `x` itself, or the bf16-rounded copy widened back.
    let widened_x: Vec<f32>;
    let (a, lda) = match xb {
        Some(xb) => {
            widened_x = xb
                .bits
                .iter()
                .map(|&b| crate::dtype::bf16_to_f32(b))
                .collect();
            (&widened_x[..], xb.stride)
        }
        None => (x, k),
    };
    let mut packed = match w.data() {
        MatData::F32(_) => Vec::new(),
        _ => vec![0.0f32; panels * PANEL * KC.min(k)],
    };
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        // Panel q of this depth block as `[kc, PANEL]` f32: widened into `packed`, or in place.
        for (q, dst) in packed.chunks_exact_mut(kc * PANEL).take(panels).enumerate() {
            let p = first + q;
            match w.data() {
                MatData::F32(_) => {}
                MatData::Bf16(bits) => {
                    widen_bf16(isa, &bits[(p * k + k0) * PANEL..][..kc * PANEL], dst)
                }
                MatData::Fp8(fp8) => {
                    // The steps of each scale block at once (contiguous in the panel).
                    let (factors, block) = (fp8.panel_scales(p), fp8.block[1]);
                    let mut e = k0;
                    while e < k0 + kc {
                        let end = (k0 + kc).min((e / block + 1) * block);
                        let src = &fp8.codes[(p * k + e) * PANEL..(p * k + end) * PANEL];
                        let to = &mut dst[(e - k0) * PANEL..(end - k0) * PANEL];
                        widen_fp8(isa, src, factors[e / block], to);
                        e = end;
                    }
                }
                MatData::Bf16Pairs(pairs) => {
                    let src =
                        &pairs[(p * k.div_ceil(2) + k0 / 2) * PANEL..][..kc.div_ceil(2) * PANEL];
                    for (e, step) in dst.chunks_exact_mut(PANEL).enumerate() {
                        for (d, &pair) in step.iter_mut().zip(&src[(e / 2) * PANEL..][..PANEL]) {
                            *d = crate::dtype::bf16_to_f32((pair >> (16 * (e % 2))) as u16);
                        }
                    }
                }
            }
        }
        let block: Vec<*const f32> = (0..panels)
            .map(|q| match w.data() {
                MatData::F32(vals) => vals[((first + q) * k + k0) * PANEL..][..kc * PANEL].as_ptr(),
                _ => packed[q * kc * PANEL..(q + 1) * kc * PANEL].as_ptr(),
            })
            .collect();
        for t in rows.clone().step_by(MAX_ROWS) {
            let tile_rows = MAX_ROWS.min(rows.end - t);
            for (q, &b) in block.iter().enumerate() {
                let j0 = q * PANEL;
                tile_raw(
                    isa,
                    tile_rows,
                    kc,
                    a.as_ptr().add(t * lda + k0),
                    lda,
                    1,
                    b,
                    PANEL,
                    out.ptr_at(t * n + cols.start + j0),
                    n,
                    PANEL.min(cols.len() - j0),
                    k0 > 0,
                );
            }
        }
    }
}

/// As `item_f32` for bf16-pair panels through `vdpbf16ps`, read in place (`isa.bf16_dot()` holds).
///
/// Safety: as `item_f32`, with `xb` the bf16 rows of `x`.
unsafe fn item_pairs(
    w: &CpuMat,
    xb: &Bf16Rows,
    out: &SharedOut<'_>,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let MatData::Bf16Pairs(pairs) = w.data() else {
            unreachable!("item_pairs is only chosen for pair panels")
        };
        let (n, k) = (w.rows(), w.cols());
        let depth = k.div_ceil(2);
        let first = cols.start / PANEL;
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            for t in rows.clone().step_by(MAX_ROWS) {
                let tile_rows = MAX_ROWS.min(rows.end - t);
                for (q, j0) in (0..cols.len()).step_by(PANEL).enumerate() {
                    super::tile::tile_bf16_raw(
                        tile_rows,
                        kc.div_ceil(2),
                        xb.bits.as_ptr().add(t * xb.stride + k0),
                        xb.stride,
                        pairs.as_ptr().add(((first + q) * depth + k0 / 2) * PANEL),
                        PANEL,
                        out.ptr_at(t * n + cols.start + j0),
                        n,
                        PANEL.min(cols.len() - j0),
                        k0 > 0,
                    );
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (w, xb, out, rows, cols);
        unreachable!("bf16 dot products are only detected on x86_64");
    }
}
