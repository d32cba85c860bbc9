//! Launcher of `sample_rows` (kernels/sampling.cu): one block per requested row picks a token from
//! the logits where they lie, so only the chosen ids come back to the host. Rows under a grammar's
//! token mask are first copied with every forbidden logit at -infinity (`mask_rows`; the caller's
//! logits stay as they are), then sampled from the copy.

use crate::backend::{device_failure, launch, CudaBackend};
use crate::buffer::CudaBuf;
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig};
use deltaserve_tensor::RowSampling;

/// One row's settings as the kernel reads them (`RowParams` in kernels/sampling.cu): one upload.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DeviceRowSampling {
    uniform: f64,
    temperature: f32,
    top_p: f32,
    min_p: f32,
    row: i32,
    top_k: i32,
    pad: i32,
}

// SAFETY: plain old data with a C layout and no padding the kernel reads (32 bytes, as RowParams).
unsafe impl DeviceRepr for DeviceRowSampling {}

/// Threads per row: 32 warps stream a 248k-entry row in ~240 loads each.
const SAMPLE_THREADS: u32 = 1024;
/// Threads per block of `mask_rows` (one per token).
const MASK_THREADS: u32 = 256;

impl CudaBackend {
    pub(crate) fn sample_rows_op(
        &self,
        logits: &CudaBuf,
        vocab: usize,
        rows: &[RowSampling],
    ) -> Vec<u32> {
        if rows.is_empty() {
            return Vec::new();
        }
        assert!(
            vocab > 0 && vocab <= i32::MAX as usize,
            "sample_rows: vocabulary of {vocab} tokens is out of range"
        );
        if let Some(bad) = rows
            .iter()
            .find(|r| (r.row as usize + 1) * vocab > logits.len)
        {
            panic!(
                "sample_rows: row {} is outside the {} logits ({} rows of {vocab})",
                bad.row,
                logits.len,
                logits.len / vocab
            );
        }
        // With any mask, every requested row is sampled from its (masked) copy, row n at n.
        let masked = rows
            .iter()
            .any(|r| r.allowed.is_some())
            .then(|| self.masked_copies(logits, vocab, rows));
        let params: Vec<DeviceRowSampling> = rows
            .iter()
            .enumerate()
            .map(|(n, r)| DeviceRowSampling {
                uniform: r.uniform.clamp(0.0, 1.0),
                temperature: r.temperature,
                top_p: r.top_p,
                min_p: r.min_p,
                row: if masked.is_some() { n } else { r.row as usize } as i32,
                top_k: r.top_k.min(i32::MAX as u32) as i32,
                pad: 0,
            })
            .collect();
        let source = masked.as_ref().unwrap_or(logits.data());
        let params = self.upload("sample_rows parameters", &params);
        // Every block writes its row's id.
        let mut chosen: CudaSlice<i32> = self.alloc_for_overwrite("sample_rows output", rows.len());
        let vocab32 = vocab as i32;
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (SAMPLE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // Contract: every row index addresses a whole row of `source` (the logits, checked above,
        // or their masked copies, one row per request); `params` and `chosen` hold one entry per
        // block; `DeviceRowSampling` is `RowParams` of sampling.cu.
        launch!(
            self,
            "sample_rows",
            cfg,
            source,
            &vocab32,
            &params,
            &mut chosen
        );
        let ids = self
            .stream
            .clone_dtoh(&chosen)
            .unwrap_or_else(|e| device_failure("sample_rows (reading the ids)", e));
        self.synchronize();
        ids.into_iter()
            .take(rows.len())
            .map(|id| id as u32)
            .collect()
    }

    /// Row n of the result: the logits row `rows[n].row` with every token its mask forbids at
    /// negative infinity (unmasked rows copied whole).
    fn masked_copies(
        &self,
        logits: &CudaBuf,
        vocab: usize,
        rows: &[RowSampling],
    ) -> CudaSlice<f32> {
        let words_per_row = vocab.div_ceil(32);
        let mut words: Vec<u32> = Vec::new();
        let mut offsets: Vec<i32> = Vec::with_capacity(rows.len());
        for r in rows {
            match r.allowed {
                Some(allowed) => {
                    let start = words.len();
                    offsets.push(start as i32);
                    // Ids past the mask's words are not allowed.
                    words.extend(allowed.iter().take(words_per_row));
                    words.resize(start + words_per_row, 0);
                }
                None => offsets.push(-1),
            }
        }
        let sources: Vec<i32> = rows.iter().map(|r| r.row as i32).collect();
        let sources = self.upload("mask_rows source rows", &sources);
        let offsets = self.upload("mask_rows mask offsets", &offsets);
        let words = self.upload("mask_rows masks", &words);
        // Every block writes its tokens of its row.
        let mut out: CudaSlice<f32> = self.alloc_for_overwrite("masked logits", rows.len() * vocab);
        let vocab32 = vocab as i32;
        let cfg = LaunchConfig {
            grid_dim: (
                vocab.div_ceil(MASK_THREADS as usize) as u32,
                rows.len() as u32,
                1,
            ),
            block_dim: (MASK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // Contract: each source row is a whole row of `logits` (checked by the caller); a
        // non-negative offset leaves `words_per_row` words of `words` from it (built above); `out`
        // holds rows * vocab values.
        launch!(
            self,
            "mask_rows",
            cfg,
            logits.data(),
            &vocab32,
            &sources,
            &offsets,
            &words,
            &mut out
        );
        out
    }
}
