//! The device memory's read bandwidth, measured with `read_bandwidth` (kernels/probe.cu) over a
//! buffer far larger than L2, best of several runs: the roofline decode is compared with.

use crate::backend::{device_failure, launch, CudaBackend};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, LaunchConfig};

/// 4 GiB: 80x the H200's 50 MB L2, so the probe reads HBM.
const PROBE_BYTES: usize = 4 << 30;
const RUNS: usize = 5;

impl CudaBackend {
    pub(crate) fn measure_read_bandwidth_op(&self) -> f64 {
        let floats = PROBE_BYTES / 4;
        let data: CudaSlice<f32> = self.alloc_zeros("bandwidth probe buffer", floats);
        let blocks = 132 * 16;
        let mut sink: CudaSlice<f32> = self.alloc_zeros("bandwidth probe sink", blocks);
        let vectors = (floats / 4) as i64;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut best = f64::MAX;
        for _ in 0..RUNS {
            let event = || {
                self.stream
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .unwrap_or_else(|e| device_failure("bandwidth probe event", e))
            };
            let start = event();
            // Contract: `data` holds `vectors` float4s (floats / 4), `sink` one float per block.
            launch!(self, "read_bandwidth", cfg, &data, &vectors, &mut sink);
            let end = event();
            let ms = start
                .elapsed_ms(&end)
                .unwrap_or_else(|e| device_failure("bandwidth probe timing", e));
            best = best.min(ms as f64 / 1e3);
        }
        PROBE_BYTES as f64 / best
    }
}
