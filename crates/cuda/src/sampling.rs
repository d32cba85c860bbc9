//! Launcher of `sample_rows` (kernels/sampling.cu): one block per requested row picks a token from
//! the logits where they lie, so only the chosen ids come back to the host.

use crate::backend::{device_failure, launch, CudaBackend};
use crate::buffer::CudaBuf;
use cudarc::driver::{CudaSlice, LaunchConfig};
use deltaserve_tensor::RowSampling;

/// Threads per row: 32 warps stream a 248k-entry row in ~240 loads each.
const SAMPLE_THREADS: u32 = 1024;

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
        let row_ids: Vec<i32> = rows.iter().map(|r| r.row as i32).collect();
        let top_ks: Vec<i32> = rows
            .iter()
            .map(|r| r.top_k.min(i32::MAX as u32) as i32)
            .collect();
        let temperatures: Vec<f32> = rows.iter().map(|r| r.temperature).collect();
        let top_ps: Vec<f32> = rows.iter().map(|r| r.top_p).collect();
        let min_ps: Vec<f32> = rows.iter().map(|r| r.min_p).collect();
        let uniforms: Vec<f64> = rows.iter().map(|r| r.uniform.clamp(0.0, 1.0)).collect();
        let row_ids = self.upload("sample_rows rows", &row_ids);
        let top_ks = self.upload("sample_rows top_k", &top_ks);
        let temperatures = self.upload("sample_rows temperatures", &temperatures);
        let top_ps = self.upload("sample_rows top_p", &top_ps);
        let min_ps = self.upload("sample_rows min_p", &min_ps);
        let uniforms = self.upload("sample_rows uniforms", &uniforms);
        let mut chosen: CudaSlice<i32> = self.alloc_zeros("sample_rows output", rows.len());
        let vocab32 = vocab as i32;
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (SAMPLE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // Contract: every row index addresses a whole row of `logits` (checked above); the six
        // parameter arrays and `chosen` hold one entry per block.
        launch!(
            self,
            "sample_rows",
            cfg,
            &logits.data,
            &vocab32,
            &row_ids,
            &top_ks,
            &temperatures,
            &top_ps,
            &min_ps,
            &uniforms,
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
}
