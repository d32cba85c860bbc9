//! The weight matrix of the fast CPU backend, stored in row panels: rows are grouped by `PANEL` (64)
//! and each panel is laid out depth-major, `[cols, 64]`, so a GEMV streams one panel front to back
//! and the GEMM reads it as ready-made column panels. bf16 stays bf16 (or bf16 pairs), f16 -> f32,
//! block-FP8 stays FP8 (codes and scales, a quarter of the f32 bytes) where its blocks allow.

use crate::block_fp8_matrix::BlockFp8Matrix;
use crate::dtype::{bf16_to_f32, DType};
use crate::host::{HostTensor, TensorError};
use crate::reference::matrix_dims;
use rayon::prelude::*;

/// Weight rows per panel; equal to the tile kernel's `TILE_COLS`.
pub(crate) const PANEL: usize = 64;

/// The elements of a `CpuMat`, panel by panel. Panel `p` holds rows `p*PANEL ..` (rows past the
/// end are zero); element `(row, e)` sits at `(p * depth + e) * PANEL + row % PANEL`, where depth
/// is `cols`, or `cols.div_ceil(2)` for pairs (element `e` is then the low (even `e`) or high half
/// of pair `e / 2`).
#[derive(Clone, Copy)]
pub(crate) enum MatData<'a> {
    /// Raw bf16 bit patterns (`f32::from_bits((b as u32) << 16)` is the value).
    Bf16(&'a [u16]),
    /// bf16 pairs `(e even) | (e + 1) << 16` for `vdpbf16ps`.
    Bf16Pairs(&'a [u32]),
    F32(&'a [f32]),
    Fp8(Fp8Panels<'a>),
}

/// Block-FP8 weights in panels: the e4m3fn codes laid out as any panel, and per block of the scale
/// grid its scale times 2^120. A code's bits placed at the bottom of an f32 (sign to the top,
/// exponent and mantissa to bits 20-26) are its value times 2^-120 exactly (e4m3 subnormals become
/// f32 subnormals), so `f32(code bits) * scaled[block]` rounds once, to the same f32 as the
/// checkpoint's dequantized weight `e4m3(code) * scale`: every kernel computes bit for bit what it
/// computes on the f32 values. A panel lies in one row of the grid (block rows are a multiple of
/// `PANEL`).
#[derive(Clone, Copy)]
pub(crate) struct Fp8Panels<'a> {
    pub(crate) codes: &'a [u8],
    /// `[grid rows, grid cols]` row-major, each `scale * 2^120`.
    pub(crate) scaled: &'a [f32],
    pub(crate) grid_cols: usize,
    pub(crate) block: [usize; 2],
}

impl Fp8Panels<'_> {
    /// The scaled factors of panel `p`'s grid row, one per block of `block[1]` columns.
    pub(crate) fn panel_scales(&self, p: usize) -> &[f32] {
        let grid_row = p * PANEL / self.block[0];
        &self.scaled[grid_row * self.grid_cols..(grid_row + 1) * self.grid_cols]
    }

    /// Weight `(p * PANEL + j, e)`: the checkpoint's f32 value, as the kernels compute it.
    pub(crate) fn value(&self, p: usize, depth: usize, e: usize, j: usize) -> f32 {
        let bits = e4m3_bits_scaled_down(self.codes[(p * depth + e) * PANEL + j]);
        f32::from_bits(bits) * self.panel_scales(p)[e / self.block[1]]
    }
}

/// 2^120: what a code's bits placed at the bottom of an f32 lack of its value.
pub(crate) const E4M3_SCALED_UP: f32 = f32::from_bits((120 + 127) << 23);

/// The f32 bits of an e4m3fn code times 2^-120 (sign to bit 31, exponent and mantissa to bits 20-26).
pub(crate) fn e4m3_bits_scaled_down(code: u8) -> u32 {
    ((code as u32 & 0x80) << 24) | ((code as u32 & 0x7f) << 20)
}

enum Storage {
    Bf16(Aligned<u16>),
    Bf16Pairs(Aligned<u32>),
    F32(Aligned<f32>),
    Fp8 {
        codes: Aligned<u8>,
        scaled: Vec<f32>,
        grid_cols: usize,
        block: [usize; 2],
    },
}

/// A weight matrix `[rows, cols]` (`[out, in]`), stored in 64-byte aligned row panels.
pub struct CpuMat {
    rows: usize,
    cols: usize,
    data: Storage,
}

/// Elements kept in a `Vec` at an offset that puts the first one on a 64-byte boundary.
struct Aligned<T> {
    buf: Vec<T>,
    start: usize,
}

impl<T: Copy + Default> Aligned<T> {
    fn zeroed(len: usize) -> Self {
        let size = std::mem::size_of::<T>();
        let mut buf = Vec::with_capacity(len + 64 / size);
        // The allocation is at least `size`-aligned, so the distance to the next line is a whole
        // number of elements; the capacity reserved above keeps the buffer from moving.
        let start = (64 - buf.as_ptr() as usize % 64) % 64 / size;
        buf.resize(start + len, T::default());
        Self { buf, start }
    }

    fn as_slice(&self) -> &[T] {
        &self.buf[self.start..]
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.buf[self.start..]
    }
}

/// Fills panels of `depth` steps from `get(row, step)`, in parallel over panels (on the current
/// rayon pool). Rows past `rows` stay zero.
fn panels<T: Copy + Default + Send + Sync>(
    rows: usize,
    depth: usize,
    get: impl Fn(usize, usize) -> T + Sync,
) -> Aligned<T> {
    let mut out = Aligned::zeroed(rows.div_ceil(PANEL) * depth * PANEL);
    if depth > 0 {
        out.as_mut_slice()
            .par_chunks_mut(depth * PANEL)
            .enumerate()
            .for_each(|(p, panel)| {
                for j in 0..PANEL.min(rows - p * PANEL) {
                    let row = p * PANEL + j;
                    for (step, slot) in panel.chunks_exact_mut(PANEL).enumerate() {
                        slot[j] = get(row, step);
                    }
                }
            });
    }
    out
}

impl CpuMat {
    /// Copies a 2-D host tensor into panel storage: bf16 as bf16 (as bf16 pairs when
    /// `bf16_pairs`), f16 and f32 as f32.
    pub(crate) fn upload(t: &HostTensor, bf16_pairs: bool) -> Result<Self, TensorError> {
        let (rows, cols) = matrix_dims(t)?;
        if let Some(data) = t
            .block_fp8()
            .and_then(|fp8| Self::fp8_storage(rows, cols, fp8))
        {
            return Ok(Self { rows, cols, data });
        }
        let bytes = t.bytes();
        let data = match t.dtype {
            DType::BF16 => {
                let bits = |i: usize| u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
                Self::bf16_storage(rows, cols, bf16_pairs, bits)
            }
            DType::F32 => {
                let get = |row: usize, e: usize| {
                    let i = 4 * (row * cols + e);
                    f32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]])
                };
                Storage::F32(panels(rows, cols, get))
            }
            DType::F16 => {
                let get = |row: usize, e: usize| {
                    let i = 2 * (row * cols + e);
                    crate::dtype::f16_to_f32(u16::from_le_bytes([bytes[i], bytes[i + 1]]))
                };
                Storage::F32(panels(rows, cols, get))
            }
        };
        Ok(Self { rows, cols, data })
    }

    /// FP8 storage for a block-FP8 matrix whose kernels compute exactly its f32 values: block rows
    /// a multiple of `PANEL` (a panel in one grid row), no NaN code (the bit placement would make
    /// it a number) and scales whose 2^120 multiple is exact (finite, below 2^7). Otherwise `None`,
    /// and the matrix is kept as its f32 values.
    fn fp8_storage(rows: usize, cols: usize, fp8: &BlockFp8Matrix) -> Option<Storage> {
        let [grid_rows, grid_cols] = crate::block_fp8_matrix::scale_grid(rows, cols, fp8.block);
        let fits = fp8.block[0] > 0
            && fp8.block[1] > 0
            && fp8.block[0].is_multiple_of(PANEL)
            && fp8.codes.len() == rows * cols
            && fp8.scales.len() == grid_rows * grid_cols
            && fp8.codes.iter().all(|&c| c & 0x7f != 0x7f)
            && fp8.scales.iter().all(|s| s.is_finite() && s.abs() < 128.0);
        if !fits {
            return None;
        }
        let codes = panels(rows, cols, |row, e| fp8.codes[row * cols + e]);
        let scaled = fp8.scales.iter().map(|s| s * E4M3_SCALED_UP).collect();
        Some(Storage::Fp8 {
            codes,
            scaled,
            grid_cols,
            block: fp8.block,
        })
    }

    /// A bf16 matrix from row-major raw bits.
    pub(crate) fn from_bf16_bits(rows: usize, cols: usize, bits: &[u16], bf16_pairs: bool) -> Self {
        assert_eq!(
            bits.len(),
            rows * cols,
            "bf16 matrix [{rows}, {cols}] needs {} elements",
            rows * cols
        );
        Self {
            rows,
            cols,
            data: Self::bf16_storage(rows, cols, bf16_pairs, |i| bits[i]),
        }
    }

    /// `bits(i)` is element `i` of the row-major matrix.
    fn bf16_storage(
        rows: usize,
        cols: usize,
        pairs: bool,
        bits: impl Fn(usize) -> u16 + Sync,
    ) -> Storage {
        if pairs {
            Storage::Bf16Pairs(panels(rows, cols.div_ceil(2), |row, pair| {
                let low = bits(row * cols + 2 * pair) as u32;
                let high = if 2 * pair + 1 < cols {
                    bits(row * cols + 2 * pair + 1) as u32
                } else {
                    0
                };
                low | high << 16
            }))
        } else {
            Storage::Bf16(panels(rows, cols, |row, e| bits(row * cols + e)))
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub(crate) fn data(&self) -> MatData<'_> {
        match &self.data {
            Storage::Bf16(a) => MatData::Bf16(a.as_slice()),
            Storage::Bf16Pairs(a) => MatData::Bf16Pairs(a.as_slice()),
            Storage::F32(a) => MatData::F32(a.as_slice()),
            Storage::Fp8 {
                codes,
                scaled,
                grid_cols,
                block,
            } => MatData::Fp8(Fp8Panels {
                codes: codes.as_slice(),
                scaled,
                grid_cols: *grid_cols,
                block: *block,
            }),
        }
    }

    /// The dtype of the values (f16 checkpoints report f32, their storage here; so do block-FP8
    /// ones, whose kernels compute on their f32 values).
    pub fn dtype(&self) -> DType {
        match self.data {
            Storage::Bf16(_) | Storage::Bf16Pairs(_) => DType::BF16,
            Storage::F32(_) | Storage::Fp8 { .. } => DType::F32,
        }
    }

    /// Whether the weights are kept as block-FP8 codes.
    pub fn is_fp8(&self) -> bool {
        matches!(self.data, Storage::Fp8 { .. })
    }

    /// Bytes of weight storage a GEMV streams (padding rows of the last panel included).
    pub fn bytes(&self) -> usize {
        match &self.data {
            Storage::Bf16(a) => a.as_slice().len() * 2,
            Storage::Bf16Pairs(a) => a.as_slice().len() * 4,
            Storage::F32(a) => a.as_slice().len() * 4,
            Storage::Fp8 { codes, scaled, .. } => codes.as_slice().len() + scaled.len() * 4,
        }
    }

    /// Row `r` as f32 into `out [cols]` (an embedding lookup; strided through the panel).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} of a matrix with {} rows", self.rows);
        let (p, j) = (r / PANEL, r % PANEL);
        let out = &mut out[..self.cols];
        match self.data() {
            MatData::Bf16(bits) => {
                let panel = &bits[p * self.cols * PANEL..(p + 1) * self.cols * PANEL];
                for (o, step) in out.iter_mut().zip(panel.chunks_exact(PANEL)) {
                    *o = bf16_to_f32(step[j]);
                }
            }
            MatData::Bf16Pairs(pairs) => {
                let depth = self.cols.div_ceil(2);
                let panel = &pairs[p * depth * PANEL..(p + 1) * depth * PANEL];
                for (e, o) in out.iter_mut().enumerate() {
                    let pair = panel[(e / 2) * PANEL + j];
                    *o = bf16_to_f32((pair >> (16 * (e % 2))) as u16);
                }
            }
            MatData::F32(vals) => {
                let panel = &vals[p * self.cols * PANEL..(p + 1) * self.cols * PANEL];
                for (o, step) in out.iter_mut().zip(panel.chunks_exact(PANEL)) {
                    *o = step[j];
                }
            }
            MatData::Fp8(fp8) => {
                for (e, o) in out.iter_mut().enumerate() {
                    *o = fp8.value(p, self.cols, e, j);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code, under scales from tiny (subnormal) to just below 2^7, decodes through the bit
    /// placement to the f32 the checkpoint's dequantization gives, bit for bit.
    #[test]
    fn fp8_bits_times_the_scaled_factor_is_the_dequantized_weight() {
        let scales = [
            1.0f32,
            0.002_232_142_8,
            3.7e-41,
            1e-30,
            127.99,
            0.5,
            1.0 / 448.0,
        ];
        for code in (0u8..=255).filter(|c| c & 0x7f != 0x7f) {
            for &scale in &scales {
                let ours = f32::from_bits(e4m3_bits_scaled_down(code)) * (scale * E4M3_SCALED_UP);
                let want = crate::e4m3::e4m3_to_f32(code) * scale;
                assert_eq!(
                    ours.to_bits(),
                    want.to_bits(),
                    "code {code:#04x}, scale {scale:e}"
                );
            }
        }
    }

    #[test]
    fn every_layout_keeps_every_row() {
        let (rows, cols) = (70, 5);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| (i as f32 - 100.0) * 0.25)
            .collect();
        let bf = HostTensor::from_f32_as_bf16("w", vec![rows, cols], &values);
        let f = HostTensor::from_f32("w", vec![rows, cols], &values);
        let f16_bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        let owner: std::sync::Arc<dyn crate::host::ByteOwner> = std::sync::Arc::new(f16_bytes);
        let h =
            HostTensor::from_owner("w", DType::F16, vec![rows, cols], owner, 0, rows * cols * 2)
                .unwrap();
        let mats = [
            CpuMat::upload(&bf, false).unwrap(),
            CpuMat::upload(&bf, true).unwrap(),
            CpuMat::upload(&f, false).unwrap(),
            CpuMat::upload(&h, true).unwrap(),
        ];
        for m in &mats {
            assert_eq!((m.rows(), m.cols()), (rows, cols));
            let addr = match m.data() {
                MatData::Bf16(b) => b.as_ptr() as usize,
                MatData::Bf16Pairs(b) => b.as_ptr() as usize,
                MatData::F32(v) => v.as_ptr() as usize,
                MatData::Fp8(fp8) => fp8.codes.as_ptr() as usize,
            };
            assert_eq!(addr % 64, 0, "matrix storage starts on a cache line");
            let mut row = vec![0.0; cols];
            for r in 0..rows {
                m.row_into(r, &mut row);
                // The values are multiples of 0.25 below 100 in magnitude: exact in bf16 and f16.
                assert_eq!(
                    row,
                    values[r * cols..(r + 1) * cols],
                    "row {r} of a {:?} matrix",
                    m.dtype()
                );
            }
        }
        assert_eq!(mats[3].dtype(), DType::F32);
        assert_eq!(mats[0].bytes(), 2 * PANEL * cols * 2);
        let err = CpuMat::upload(&HostTensor::from_f32("v", vec![6], &values[..6]), false)
            .err()
            .unwrap();
        assert!(err.to_string().contains("2-D"), "{err}");
    }
}
