//! The backend's `Buf`: a device buffer of f32 activations or parameters with its logical length,
//! and optionally the same values rounded to bf16 or quantized to FP8. Owns allocation only; ops
//! live in the op modules.

use crate::fp8_gemm::Fp8Activations;
use cudarc::driver::CudaSlice;

/// `len` f32 values on the device. The allocation holds at least one element, because CUDA refuses
/// zero-byte allocations and the model asks for empty buffers (e.g. a pool lent out and back).
///
/// An op whose output goes on to bf16 GEMMs may write `bf16_twin` beside it (the values rounded to
/// bf16 as `cast_f32_to_bf16` rounds them), so the GEMM skips its own cast: a 2048-token prefill
/// otherwise writes a norm's output in f32, reads it back and writes it again in bf16. The twin is
/// valid while it is set: every write to the f32 values goes through `data_mut`, which drops it.
/// `BF16_TWIN=0` in `DELTASERVE_CUDA_DEFINES` turns the twins off, to measure.
///
/// With block-FP8 weights the GEMMs read their activations quantized (`quantize_activations_fp8`),
/// so a norm whose output goes on to them may write `fp8_twin` instead: the codes and scales that
/// kernel would make, bit for bit, which saves its launch before each projection of a decode,
/// verify or prefill step. Valid for exactly the token count and width it was written for, and
/// dropped by any write, like the bf16 twin. Opt-in (`FP8_TWIN=1` in `DELTASERVE_CUDA_DEFINES`):
/// on an H100 (session 34) the saved launch was hidden behind its neighbours' early starts already
/// and a 35B-A3B verify got ~0.1 ms slower.
pub struct CudaBuf {
    data: CudaSlice<f32>,
    pub(crate) len: usize,
    /// The twin and how many of its values the op that wrote it wrote (a twin kept from an earlier,
    /// longer write holds stale values past that).
    bf16_twin: Option<(CudaSlice<u16>, usize)>,
    fp8_twin: Option<Fp8Twin>,
}

/// An FP8 twin and the `[tokens, k]` activations it holds.
struct Fp8Twin {
    activations: Fp8Activations,
    tokens: usize,
    k: usize,
}

impl CudaBuf {
    pub(crate) fn new(data: CudaSlice<f32>, len: usize) -> CudaBuf {
        CudaBuf {
            data,
            len,
            bf16_twin: None,
            fp8_twin: None,
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

    /// The f32 values for writing: the twins, if any, are dropped (they would be stale).
    pub(crate) fn data_mut(&mut self) -> &mut CudaSlice<f32> {
        self.bf16_twin = None;
        self.fp8_twin = None;
        &mut self.data
    }

    /// The f32 values and a twin of `twin_len` bf16 values, both for an op that writes the two at
    /// once; the twin is kept from an earlier write when it is long enough.
    pub(crate) fn data_and_twin_mut(
        &mut self,
        twin_len: usize,
        alloc: impl FnOnce(usize) -> CudaSlice<u16>,
    ) -> (&mut CudaSlice<f32>, &mut CudaSlice<u16>) {
        self.fp8_twin = None;
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

    /// The f32 values and an FP8 twin for `[tokens, k]` activations padded to `rows` tokens, for
    /// an op that writes the two at once (the bf16 twin is dropped); the twin's memory is kept
    /// from an earlier write when it is large enough.
    pub(crate) fn data_and_fp8_twin_mut(
        &mut self,
        tokens: usize,
        rows: usize,
        k: usize,
        alloc: impl FnOnce(usize, usize) -> Fp8Activations,
    ) -> (&mut CudaSlice<f32>, &mut Fp8Activations) {
        self.bf16_twin = None;
        let mut activations = match self.fp8_twin.take() {
            Some(twin)
                if twin.activations.codes.len() >= rows * k
                    && twin.activations.scales.len() >= rows * k / 128 =>
            {
                twin.activations
            }
            _ => alloc(rows * k, rows * k / 128),
        };
        activations.rows = rows;
        let twin = self.fp8_twin.insert(Fp8Twin {
            activations,
            tokens,
            k,
        });
        (&mut self.data, &mut twin.activations)
    }

    /// The token count and width of the FP8 twin the last op wrote, if any: for tests that check
    /// a twin was written where it should be.
    pub fn fp8_twin_shape(&self) -> Option<(usize, usize)> {
        self.fp8_twin.as_ref().map(|twin| (twin.tokens, twin.k))
    }

    /// The FP8 form of the first `tokens` rows of `k` values, if the op that wrote them wrote an
    /// FP8 twin of exactly those.
    pub(crate) fn fp8_twin(&self, tokens: usize, k: usize) -> Option<&Fp8Activations> {
        match &self.fp8_twin {
            Some(twin) if twin.tokens == tokens && twin.k == k => Some(&twin.activations),
            _ => None,
        }
    }
}
