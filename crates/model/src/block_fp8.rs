//! Block-scaled FP8 matrices: a `[rows, cols]` weight of e4m3fn codes and a grid of f32 scales,
//! one per `block[0] x block[1]` tile (`[ceil(rows / block[0]), ceil(cols / block[1])]`; the last
//! tile of a row or column of tiles is partial when the dimension is not a multiple of the block).
//! `W[r][c] = e4m3(code[r][c]) * scale[r / block[0]][c / block[1]]`, the product rounded once to f32,
//! exactly as transformers and the FP8 kernels of SGLang/vLLM dequantize (`weight.float() *
//! scale_inv`): the scale is what the checkpoint calls `weight_scale_inv`.
//! Stacked experts (`[E, rows, cols]` with scales `[E, ...]`) are `matrices` such grids back to back.

use deltaserve_tensor::e4m3::{block_scale, e4m3_to_f32, f32_to_e4m3};
use rayon::prelude::*;

/// The scale grid of a `[rows, cols]` matrix in `block` tiles.
pub use deltaserve_tensor::block_fp8_matrix::scale_grid;

/// Dequantizes `matrices` stacked `[rows, cols]` FP8 matrices with their stacked scale grids.
/// Panics on lengths that disagree with the shapes (callers check shapes first, with names).
pub fn dequantize(
    codes: &[u8],
    scales: &[f32],
    matrices: usize,
    [rows, cols]: [usize; 2],
    block: [usize; 2],
) -> Vec<f32> {
    let [grid_rows, grid_cols] = scale_grid(rows, cols, block);
    assert_eq!(codes.len(), matrices * rows * cols, "FP8 codes vs shape");
    assert_eq!(
        scales.len(),
        matrices * grid_rows * grid_cols,
        "scales vs grid"
    );
    let decoded: [f32; 256] = std::array::from_fn(|c| e4m3_to_f32(c as u8));
    let mut out = vec![0.0f32; codes.len()];
    if cols == 0 {
        return out;
    }
    out.par_chunks_mut(cols)
        .zip(codes.par_chunks(cols))
        .enumerate()
        .for_each(|(row, (out_row, code_row))| {
            let (matrix, r) = (row / rows, row % rows);
            let grid_row = (matrix * grid_rows + r / block[0]) * grid_cols;
            let row_scales = &scales[grid_row..grid_row + grid_cols];
            for ((tile_out, tile_codes), &scale) in out_row
                .chunks_mut(block[1])
                .zip(code_row.chunks(block[1]))
                .zip(row_scales)
            {
                for (o, &c) in tile_out.iter_mut().zip(tile_codes) {
                    *o = decoded[c as usize] * scale;
                }
            }
        });
    out
}

/// FP8 codes and the scale grid of one `[rows, cols]` matrix (repeated for `matrices` stacked ones),
/// with the recipe of DeepSeek-V3 / Qwen's FP8 releases: per tile, `scale = amax / 448` and
/// `code = e4m3(w / scale)`, rounded to nearest even (an all-zero tile gets scale 1).
pub fn quantize(
    values: &[f32],
    matrices: usize,
    [rows, cols]: [usize; 2],
    block: [usize; 2],
) -> (Vec<u8>, Vec<f32>) {
    assert_eq!(values.len(), matrices * rows * cols, "values vs shape");
    let [grid_rows, grid_cols] = scale_grid(rows, cols, block);
    let mut scales = vec![1.0f32; matrices * grid_rows * grid_cols];
    let tile_rows = |matrix: usize, tile_row: usize| {
        let first = tile_row * block[0];
        (first..(first + block[0]).min(rows)).map(move |r| (matrix * rows + r) * cols)
    };
    scales
        .par_chunks_mut(grid_cols)
        .enumerate()
        .for_each(|(grid_row, row_scales)| {
            let (matrix, tile_row) = (grid_row / grid_rows, grid_row % grid_rows);
            for (tile_col, scale) in row_scales.iter_mut().enumerate() {
                let (from, to) = (tile_col * block[1], ((tile_col + 1) * block[1]).min(cols));
                let amax = tile_rows(matrix, tile_row)
                    .flat_map(|start| &values[start + from..start + to])
                    .fold(0.0f32, |m, v| m.max(v.abs()));
                *scale = block_scale(amax);
            }
        });
    let mut codes = vec![0u8; values.len()];
    if cols > 0 {
        codes
            .par_chunks_mut(cols)
            .zip(values.par_chunks(cols))
            .enumerate()
            .for_each(|(row, (code_row, value_row))| {
                let (matrix, r) = (row / rows, row % rows);
                let grid_row = (matrix * grid_rows + r / block[0]) * grid_cols;
                for (tile_col, (tile_codes, tile_values)) in code_row
                    .chunks_mut(block[1])
                    .zip(value_row.chunks(block[1]))
                    .enumerate()
                {
                    let scale = scales[grid_row + tile_col];
                    for (c, &v) in tile_codes.iter_mut().zip(tile_values) {
                        *c = f32_to_e4m3(v / scale);
                    }
                }
            });
    }
    (codes, scales)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic spread of magnitudes (tiny to large) and signs.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let unit = (state >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
                let magnitude = 10f32.powf(unit * 6.0 - 4.0); // 1e-4 .. 1e2
                if state & 1 == 0 {
                    magnitude
                } else {
                    -magnitude
                }
            })
            .collect()
    }

    #[test]
    fn dequantize_uses_each_tiles_own_scale() {
        // [300, 200] in 128 x 128 tiles: a 3 x 2 grid whose last row and column of tiles are
        // partial (44 rows, 72 columns), stacked twice like packed experts.
        let (rows, cols, block) = (300, 200, [128, 128]);
        assert_eq!(scale_grid(rows, cols, block), [3, 2]);
        let codes: Vec<u8> = (0..2 * rows * cols)
            .map(|i| (i % 251) as u8 & 0x7e)
            .collect();
        let scales: Vec<f32> = (0..12).map(|i| 0.5 + i as f32).collect();
        let w = dequantize(&codes, &scales, 2, [rows, cols], block);
        for (m, r, c) in [
            (0, 0, 0),
            (0, 127, 127),
            (0, 128, 127),
            (0, 127, 128),
            (0, 299, 199),
            (1, 0, 0),
            (1, 256, 128),
            (1, 299, 199),
        ] {
            let i = (m * rows + r) * cols + c;
            let scale = scales[m * 6 + (r / 128) * 2 + c / 128];
            assert_eq!(w[i], e4m3_to_f32(codes[i]) * scale, "({m}, {r}, {c})");
        }
    }

    #[test]
    fn quantize_then_dequantize_error_is_half_a_step_per_tile() {
        for (rows, cols, seed) in [(300, 200, 1), (64, 96, 2), (128, 256, 3), (1, 129, 4)] {
            let block = [128, 128];
            let w = values(2 * rows * cols, seed);
            let (codes, scales) = quantize(&w, 2, [rows, cols], block);
            let back = dequantize(&codes, &scales, 2, [rows, cols], block);
            let [gr, gc] = scale_grid(rows, cols, block);
            for m in 0..2 {
                for r in 0..rows {
                    for c in 0..cols {
                        let i = (m * rows + r) * cols + c;
                        let scale = scales[(m * gr + r / 128) * gc + c / 128];
                        // e4m3 keeps 3 fraction bits: half a step is 2^-4 of the value for
                        // normals and 2^-10 (in units of the scale) below 2^-6; the f32 divide and
                        // multiply add a few ulps.
                        let bound =
                            (w[i].abs() * 2f32.powi(-4)).max(scale * 2f32.powi(-10)) * (1.0 + 1e-6);
                        let err = (back[i] - w[i]).abs();
                        assert!(
                            err <= bound,
                            "[{rows}x{cols}] ({m},{r},{c}): {} -> {} (err {err}, bound {bound})",
                            w[i],
                            back[i]
                        );
                    }
                }
            }
            // Each tile's largest magnitude maps onto 448 (code 0x7e / 0xfe) exactly.
            for m in 0..2 {
                for tr in 0..gr {
                    for tc in 0..gc {
                        let hits = (tr * 128..((tr + 1) * 128).min(rows))
                            .flat_map(|r| {
                                (tc * 128..((tc + 1) * 128).min(cols)).map(move |c| (r, c))
                            })
                            .filter(|&(r, c)| codes[(m * rows + r) * cols + c] & 0x7f == 0x7e)
                            .count();
                        assert!(hits >= 1, "tile ({m},{tr},{tc}) has no code at 448");
                    }
                }
            }
        }
    }

    #[test]
    fn zero_tiles_and_exact_values_survive() {
        let mut w = vec![0.0f32; 130 * 3];
        // The second tile row holds one value (448 * 2^-7: a power-of-two scale, so the round
        // trip is exact); the first is all zero.
        w[129 * 3 + 1] = 3.5;
        let (codes, scales) = quantize(&w, 1, [130, 3], [128, 128]);
        assert_eq!(scales, [1.0, 2f32.powi(-7)]);
        assert_eq!(dequantize(&codes, &scales, 1, [130, 3], [128, 128]), w);
    }
}
