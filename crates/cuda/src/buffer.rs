//! The backend's `Buf`: a device buffer of f32 activations or parameters with its logical length,
//! and optionally the same values rounded to bf16. Owns allocation only; ops live in the op modules.

use cudarc::driver::CudaSlice;

/// `len` f32 values on the device. The allocation holds at least one element, because CUDA refuses
/// zero-byte allocations and the model asks for empty buffers (e.g. a pool lent out and back).
///
/// An op whose output goes on to bf16 GEMMs may write `bf16_twin` beside it (the values rounded to
/// bf16 as `cast_f32_to_bf16` rounds them), so the GEMM skips its own cast: a 2048-token prefill
/// otherwise writes a norm's output in f32, reads it back and writes it again in bf16. The twin is
/// valid while it is set: every write to the f32 values goes through `data_mut`, which drops it.
/// `BF16_TWIN=0` in `DELTASERVE_CUDA_DEFINES` turns the twins off, to measure.
pub struct CudaBuf {
    data: CudaSlice<f32>,
    pub(crate) len: usize,
    /// The twin and how many of its values the op that wrote it wrote (a twin kept from an earlier,
    /// longer write holds stale values past that).
    bf16_twin: Option<(CudaSlice<u16>, usize)>,
}

impl CudaBuf {
    pub(crate) fn new(data: CudaSlice<f32>, len: usize) -> CudaBuf {
        CudaBuf {
            data,
            len,
            bf16_twin: None,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn data(&self) -> &CudaSlice<f32> {
        &self.data
    }

    /// The f32 values for writing: the bf16 twin, if any, is dropped (it would be stale).
    pub(crate) fn data_mut(&mut self) -> &mut CudaSlice<f32> {
        self.bf16_twin = None;
        &mut self.data
    }

    /// The f32 values and a twin of `twin_len` bf16 values, both for an op that writes the two at
    /// once; the twin is kept from an earlier write when it is long enough.
    pub(crate) fn data_and_twin_mut(
        &mut self,
        twin_len: usize,
        alloc: impl FnOnce(usize) -> CudaSlice<u16>,
    ) -> (&mut CudaSlice<f32>, &mut CudaSlice<u16>) {
        let twin = match self.bf16_twin.take() {
            Some((twin, _)) if twin.len() >= twin_len => twin,
            _ => alloc(twin_len),
        };
        let (twin, _) = self.bf16_twin.insert((twin, twin_len));
        (&mut self.data, twin)
    }

    /// The first `len` values rounded to bf16, if the op that wrote them wrote at least as many
    /// into a twin.
    pub(crate) fn bf16_twin(&self, len: usize) -> Option<&CudaSlice<u16>> {
        match &self.bf16_twin {
            Some((twin, written)) if *written >= len => Some(twin),
            _ => None,
        }
    }
}
