//! Launcher of `sample_rows` (kernels/sampling.cu): one block per requested row picks a token from
//! the logits where they lie, so only the chosen ids come back to the host.

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
        let params: Vec<DeviceRowSampling> = rows
            .iter()
            .map(|r| DeviceRowSampling {
                uniform: r.uniform.clamp(0.0, 1.0),
                temperature: r.temperature,
                top_p: r.top_p,
                min_p: r.min_p,
                row: r.row as i32,
                top_k: r.top_k.min(i32::MAX as u32) as i32,
                pad: 0,
            })
            .collect();
        let params = self.upload("sample_rows parameters", &params);
        // Every block writes its row's id.
        let mut chosen: CudaSlice<i32> = self.alloc_for_overwrite("sample_rows output", rows.len());
        let vocab32 = vocab as i32;
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (SAMPLE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // Contract: every row index addresses a whole row of `logits` (checked above); `params`
        // and `chosen` hold one entry per block; `DeviceRowSampling` is `RowParams` of sampling.cu.
        launch!(
            self,
            "sample_rows",
            cfg,
            &logits.data,
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
}
