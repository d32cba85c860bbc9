//! Host tensors: a dtype, a shape and little-endian bytes that are either owned or borrowed from a
//! memory-mapped checkpoint file. Backends turn them into their own storage.

use crate::block_fp8_matrix::BlockFp8Matrix;
use crate::dtype::{decode_to_f32, DType};
use std::sync::Arc;

/// Something that owns bytes a tensor can point into (a memory map, a vector).
pub trait ByteOwner: Send + Sync {
    fn bytes(&self) -> &[u8];
}

impl ByteOwner for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("tensor `{name}`: expected shape {expected:?}, found {found:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{name}`: {message}")]
    Invalid { name: String, message: String },
}

/// A named tensor on the host. Cloning is cheap (the bytes are shared).
#[derive(Clone)]
pub struct HostTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    owner: Arc<dyn ByteOwner>,
    start: usize,
    end: usize,
    /// The block-FP8 form of these values when they were read from (or quantized to) one; kept by
    /// `rows`, `gather_rows` and `cols` that cut no scale block and by `reshaped` that keeps the
    /// matrices, dropped by every other operation that moves values.
    block_fp8: Option<Arc<BlockFp8Matrix>>,
}

impl std::fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HostTensor({} {} {:?})",
            self.name, self.dtype, self.shape
        )
    }
}

impl HostTensor {
    /// A view of `owner.bytes()[start..end]`. Fails when the range does not match the shape.
    pub fn from_owner(
        name: impl Into<String>,
        dtype: DType,
        shape: Vec<usize>,
        owner: Arc<dyn ByteOwner>,
        start: usize,
        end: usize,
    ) -> Result<Self, TensorError> {
        let name = name.into();
        let numel: usize = shape.iter().product();
        let owner_len = owner.bytes().len();
        if end < start || end > owner_len {
            return Err(TensorError::Invalid {
                name,
                message: format!("byte range {start}..{end} lies outside the {owner_len} available bytes (truncated file?)"),
            });
        }
        if numel * dtype.size_bytes() != end - start {
            return Err(TensorError::Invalid {
                name,
                message: format!(
                    "shape {shape:?} of {dtype} needs {} bytes but the range holds {}",
                    numel * dtype.size_bytes(),
                    end - start
                ),
            });
        }
        Ok(Self {
            name,
            dtype,
            shape,
            owner,
            start,
            end,
            block_fp8: None,
        })
    }

    /// An owned f32 tensor.
    pub fn from_f32(name: impl Into<String>, shape: Vec<usize>, data: &[f32]) -> Self {
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        Self::owned(name.into(), DType::F32, shape, bytes)
    }

    /// An owned bf16 tensor made by rounding `data`.
    pub fn from_f32_as_bf16(name: impl Into<String>, shape: Vec<usize>, data: &[f32]) -> Self {
        let bytes: Vec<u8> = data
            .iter()
            .flat_map(|&x| crate::dtype::f32_to_bf16(x).to_le_bytes())
            .collect();
        Self::owned(name.into(), DType::BF16, shape, bytes)
    }

    fn owned(name: String, dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Self {
        let end = bytes.len();
        debug_assert_eq!(end, shape.iter().product::<usize>() * dtype.size_bytes());
        Self {
            name,
            dtype,
            shape,
            owner: Arc::new(bytes),
            start: 0,
            end,
            block_fp8: None,
        }
    }

    /// These values with the block-FP8 form they were dequantized from.
    pub fn with_block_fp8(mut self, matrix: BlockFp8Matrix) -> Self {
        self.block_fp8 = Some(Arc::new(matrix));
        self
    }

    pub fn block_fp8(&self) -> Option<&BlockFp8Matrix> {
        self.block_fp8.as_deref()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.owner.bytes()[self.start..self.end]
    }

    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.numel());
        decode_to_f32(self.dtype, self.bytes(), &mut out);
        out
    }

    /// Checks the shape, naming the tensor when it differs.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<(), TensorError> {
        if self.shape != expected {
            return Err(TensorError::Shape {
                name: self.name.clone(),
                expected: expected.to_vec(),
                found: self.shape.clone(),
            });
        }
        Ok(())
    }

    /// Elements per index of dimension 0.
    fn row_len(&self) -> usize {
        self.shape[1..].iter().product()
    }

    /// Rows `[from, to)` along dimension 0, sharing the bytes (no copy; FP8 parts, when kept, are
    /// copied).
    pub fn rows(&self, from: usize, to: usize) -> Self {
        assert!(from <= to && to <= self.shape[0], "row range out of bounds");
        let row_bytes = self.row_len() * self.dtype.size_bytes();
        let mut shape = self.shape.clone();
        shape[0] = to - from;
        Self {
            name: self.name.clone(),
            dtype: self.dtype,
            shape,
            owner: self.owner.clone(),
            start: self.start + from * row_bytes,
            end: self.start + to * row_bytes,
            block_fp8: self.block_fp8_slice(from, to).map(Arc::new),
        }
    }

    /// The FP8 parts of `rows(from, to)`: whole matrices of a stack (`[E, out, in]` packed
    /// experts: one scale grid each), or whole scale blocks of one matrix; `None` otherwise.
    fn block_fp8_slice(&self, from: usize, to: usize) -> Option<BlockFp8Matrix> {
        let fp8 = self.block_fp8()?;
        let &[.., rows, cols] = &self.shape[..] else {
            return None;
        };
        if self.shape.len() == 2 {
            return self.block_fp8_rows(&[(from, to)]);
        }
        let grid = crate::block_fp8_matrix::scale_grid(rows, cols, fp8.block);
        let matrices_per_row: usize = self.shape[1..self.shape.len() - 2].iter().product();
        let codes_per_row = self.row_len();
        let scales_per_row = matrices_per_row * grid[0] * grid[1];
        Some(BlockFp8Matrix {
            codes: fp8.codes[from * codes_per_row..to * codes_per_row].to_vec(),
            scales: fp8.scales[from * scales_per_row..to * scales_per_row].to_vec(),
            block: fp8.block,
        })
    }

    /// Concatenates row ranges of this tensor into a new owned tensor (used to reorder fused
    /// projections into one canonical layout at load time).
    pub fn gather_rows(&self, ranges: &[(usize, usize)]) -> Self {
        let row_bytes = self.row_len() * self.dtype.size_bytes();
        let src = self.bytes();
        let mut bytes = Vec::new();
        let mut rows = 0;
        for &(from, to) in ranges {
            assert!(from <= to && to <= self.shape[0], "row range out of bounds");
            bytes.extend_from_slice(&src[from * row_bytes..to * row_bytes]);
            rows += to - from;
        }
        let mut shape = self.shape.clone();
        shape[0] = rows;
        let gathered = Self::owned(self.name.clone(), self.dtype, shape, bytes);
        match self.block_fp8_rows(ranges) {
            Some(fp8) => gathered.with_block_fp8(fp8),
            None => gathered,
        }
    }

    /// The FP8 parts of `gather_rows(ranges)` of a 2-D tensor: codes gathered alike and the scale
    /// rows with them, when every range covers whole scale blocks (the per-head query/gate split
    /// of attention, 128-row heads in every released checkpoint; the last range may end in the
    /// matrix's last, partial block); `None` otherwise.
    fn block_fp8_rows(&self, ranges: &[(usize, usize)]) -> Option<BlockFp8Matrix> {
        let fp8 = self.block_fp8()?;
        let [rows, cols] = self.shape[..] else {
            return None;
        };
        let block_rows = fp8.block[0];
        // Only the last range may end in a partial block: gathered rows after it would fall
        // into that block's scale row.
        let last = ranges.len().saturating_sub(1);
        let whole_blocks = ranges.iter().enumerate().all(|(i, &(from, to))| {
            from.is_multiple_of(block_rows)
                && (to.is_multiple_of(block_rows) || (to == rows && i == last))
        });
        if !whole_blocks {
            return None;
        }
        let grid_cols = cols.div_ceil(fp8.block[1]);
        let mut codes = Vec::new();
        let mut scales = Vec::new();
        for &(from, to) in ranges {
            codes.extend_from_slice(&fp8.codes[from * cols..to * cols]);
            scales.extend_from_slice(
                &fp8.scales[from / block_rows * grid_cols..to.div_ceil(block_rows) * grid_cols],
            );
        }
        Some(BlockFp8Matrix {
            codes,
            scales,
            block: fp8.block,
        })
    }

    /// Columns `[from, to)` of a 2-D tensor, as a new owned tensor (a row-parallel shard of an
    /// `[out, in]` matrix).
    pub fn cols(&self, from: usize, to: usize) -> Self {
        assert_eq!(self.shape.len(), 2, "cols() needs a 2-D tensor");
        let (rows, cols) = (self.shape[0], self.shape[1]);
        assert!(from <= to && to <= cols, "column range out of bounds");
        let size = self.dtype.size_bytes();
        let src = self.bytes();
        let mut bytes = Vec::with_capacity(rows * (to - from) * size);
        for r in 0..rows {
            bytes.extend_from_slice(&src[(r * cols + from) * size..(r * cols + to) * size]);
        }
        let sliced = Self::owned(self.name.clone(), self.dtype, vec![rows, to - from], bytes);
        match self.block_fp8_cols(from, to) {
            Some(fp8) => sliced.with_block_fp8(fp8),
            None => sliced,
        }
    }

    /// The FP8 parts of `cols(from, to)`: codes and scale columns sliced alike, when both ends are
    /// scale-block boundaries (a row-parallel shard that cuts no block); `None` otherwise.
    fn block_fp8_cols(&self, from: usize, to: usize) -> Option<BlockFp8Matrix> {
        let fp8 = self.block_fp8()?;
        let (rows, cols) = (self.shape[0], self.shape[1]);
        let block_cols = fp8.block[1];
        let at_boundary = |c: usize| c.is_multiple_of(block_cols) || c == cols;
        if !(at_boundary(from) && at_boundary(to)) {
            return None;
        }
        let grid_cols = cols.div_ceil(block_cols);
        let (scale_from, scale_to) = (from / block_cols, to.div_ceil(block_cols));
        let codes = (0..rows)
            .flat_map(|r| &fp8.codes[r * cols + from..r * cols + to])
            .copied()
            .collect();
        let scales = fp8
            .scales
            .chunks(grid_cols)
            .flat_map(|row| &row[scale_from..scale_to])
            .copied()
            .collect();
        Some(BlockFp8Matrix {
            codes,
            scales,
            block: fp8.block,
        })
    }

    /// This tensor with `extra` rows of zeros appended along dimension 0, as a new owned tensor.
    pub fn with_zero_rows(&self, extra: usize) -> Self {
        let row_bytes = self.row_len() * self.dtype.size_bytes();
        let mut bytes = self.bytes().to_vec();
        bytes.resize(bytes.len() + extra * row_bytes, 0);
        let mut shape = self.shape.clone();
        shape[0] += extra;
        Self::owned(self.name.clone(), self.dtype, shape, bytes)
    }

    /// Same bytes, another shape with the same element count.
    pub fn reshaped(&self, shape: Vec<usize>) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            self.numel(),
            "reshape changes numel"
        );
        // The FP8 parts describe the old shape's matrices: kept when those stay (a leading unit
        // dimension added or dropped, as for one expert of a packed stack).
        let matrices = |s: &[usize]| -> Option<(usize, usize, usize)> {
            let &[.., rows, cols] = s else { return None };
            Some((s[..s.len() - 2].iter().product(), rows, cols))
        };
        let block_fp8 = if matrices(&shape) == matrices(&self.shape) {
            self.block_fp8.clone()
        } else {
            None
        };
        Self {
            shape,
            block_fp8,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_gather() {
        let t = HostTensor::from_f32("t", vec![3, 2], &[0., 1., 2., 3., 4., 5.]);
        assert_eq!(t.rows(1, 3).to_f32_vec(), vec![2., 3., 4., 5.]);
        assert_eq!(
            t.gather_rows(&[(2, 3), (0, 1)]).to_f32_vec(),
            vec![4., 5., 0., 1.]
        );
        assert!(t.expect_shape(&[2, 3]).is_err());
    }

    #[test]
    fn block_fp8_parts_follow_whole_block_gathers_only() {
        let (rows, cols) = (384, 32);
        let codes: Vec<u8> = (0..rows * cols).map(|i| (i % 251) as u8).collect();
        let scales = vec![1.0, 2.0, 3.0];
        let t = HostTensor::from_f32("w", vec![rows, cols], &vec![0.0; rows * cols])
            .with_block_fp8(BlockFp8Matrix {
                codes: codes.clone(),
                scales,
                block: [128, 128],
            });
        let swapped = t.gather_rows(&[(256, 384), (0, 128)]);
        let fp8 = swapped
            .block_fp8()
            .expect("whole blocks keep their FP8 form");
        assert_eq!(fp8.scales, vec![3.0, 1.0]);
        assert_eq!(fp8.codes[..128 * cols], codes[256 * cols..]);
        assert_eq!(fp8.codes[128 * cols..], codes[..128 * cols]);
        assert!(t.gather_rows(&[(0, 64)]).block_fp8().is_none());
        let wide =
            HostTensor::from_f32("w", vec![2, 300], &[0.0; 600]).with_block_fp8(BlockFp8Matrix {
                codes: (0..600).map(|i| (i % 200) as u8).collect(),
                scales: vec![1.0, 2.0, 3.0],
                block: [128, 128],
            });
        let shard = wide.cols(128, 300);
        let fp8 = shard
            .block_fp8()
            .expect("a shard on block boundaries keeps its FP8 form");
        assert_eq!(fp8.scales, vec![2.0, 3.0]);
        assert_eq!(fp8.codes.len(), 2 * 172);
        assert_eq!(
            fp8.codes[172], 28,
            "row 1, column 128: code (300 + 128) % 200"
        );
        assert!(wide.cols(64, 300).block_fp8().is_none());
        let first = t.rows(128, 256).block_fp8().cloned();
        assert_eq!(
            first.map(|f| (f.scales, f.codes)),
            Some((vec![2.0], codes[128 * cols..256 * cols].to_vec())),
            "whole row blocks keep their FP8 form"
        );
        assert!(t.rows(0, 64).block_fp8().is_none());
        // 200 rows: blocks [0, 128) and the partial [128, 200); the tail may end a gather only.
        let partial = HostTensor::from_f32("w", vec![200, cols], &vec![0.0; 200 * cols])
            .with_block_fp8(BlockFp8Matrix {
                codes: codes[..200 * cols].to_vec(),
                scales: vec![1.0, 2.0],
                block: [128, 128],
            });
        let tail = partial.rows(128, 200).block_fp8().cloned();
        assert_eq!(
            tail.map(|f| (f.scales, f.codes.len())),
            Some((vec![2.0], 72 * cols)),
            "the last, partial block is whole too"
        );
        let tail_first = partial.gather_rows(&[(128, 200), (0, 128)]);
        assert!(
            tail_first.block_fp8().is_none(),
            "rows after a partial block would fall into its scale row"
        );
        assert!(t.reshaped(vec![rows * 2, cols / 2]).block_fp8().is_none());
        assert!(t.reshaped(vec![rows, cols]).block_fp8().is_some());
        assert!(t.reshaped(vec![1, rows, cols]).block_fp8().is_some());
    }

    /// One expert of a packed `[E, out, in]` stack keeps its codes and its own scale grid.
    #[test]
    fn block_fp8_parts_follow_whole_matrices_of_a_stack() {
        let (experts, rows, cols) = (3, 256, 16);
        let codes: Vec<u8> = (0..experts * rows * cols)
            .map(|i| (i % 253) as u8)
            .collect();
        let scales: Vec<f32> = (0..experts * 2).map(|i| i as f32).collect();
        let t = HostTensor::from_f32(
            "experts",
            vec![experts, rows, cols],
            &vec![0.0; experts * rows * cols],
        )
        .with_block_fp8(BlockFp8Matrix {
            codes: codes.clone(),
            scales,
            block: [128, 128],
        });
        let one = t.rows(1, 2).reshaped(vec![rows, cols]);
        let fp8 = one.block_fp8().expect("a whole expert keeps its FP8 form");
        assert_eq!(fp8.scales, vec![2.0, 3.0]);
        assert_eq!(fp8.codes, codes[rows * cols..2 * rows * cols]);
        let up = one.rows(128, 256).block_fp8().cloned().unwrap();
        assert_eq!(up.scales, vec![3.0]);
        assert!(t.reshaped(vec![experts * rows, cols]).block_fp8().is_none());
    }

    #[test]
    fn truncated_range_is_an_error() {
        let owner: Arc<dyn ByteOwner> = Arc::new(vec![0u8; 10]);
        let err = HostTensor::from_owner("w", DType::F32, vec![4], owner, 0, 16).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}
