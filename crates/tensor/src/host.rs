//! Host tensors: a dtype, a shape and little-endian bytes that are either owned or borrowed from a
//! memory-mapped checkpoint file. Backends turn them into their own storage.

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
        }
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

    /// Rows `[from, to)` along dimension 0, sharing the bytes (no copy).
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
        }
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
        Self::owned(self.name.clone(), self.dtype, shape, bytes)
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
        Self::owned(self.name.clone(), self.dtype, vec![rows, to - from], bytes)
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
        Self {
            shape,
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
    fn truncated_range_is_an_error() {
        let owner: Arc<dyn ByteOwner> = Arc::new(vec![0u8; 10]);
        let err = HostTensor::from_owner("w", DType::F32, vec![4], owner, 0, 16).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}
