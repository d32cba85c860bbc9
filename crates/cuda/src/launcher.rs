//! Kernel launches, with programmatic dependent launch (PDL) where a kernel allows it.
//!
//! A decode step is some 700 small kernels in order on one stream. Between two of them the GPU
//! normally drains the first grid completely before it starts the second, so every boundary leaves
//! the memory system idle for a few microseconds. On Hopper a kernel launched with the
//! programmatic-stream-serialization attribute may start while the previous one still runs: its
//! blocks first do the work that needs nothing from the previous kernel (a GEMV issues its first
//! weight loads) and then execute `griddepcontrol.wait`, which returns once the previous grid has
//! completed and its memory is visible. A kernel that never executes that wait must not start
//! early, so the attribute is set exactly for the kernels whose PTX contains the instruction
//! (`waits_for_previous_grid`); every other launch keeps the full stream order. Kernels place the
//! wait before any read of an earlier kernel's output and before any global write (common.cuh).

use crate::backend::CudaBackend;
use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig};
use std::ffi::c_void;

/// What one kernel parameter hands to the driver: a device address (copied here, so the driver
/// can read it through a pointer) or a pointer to a plain value passed by value.
pub(crate) enum KernelParam {
    Device(u64),
    Value(*const c_void),
}

/// A value that can be a kernel parameter.
pub(crate) trait KernelArg {
    fn param(&self, stream: &CudaStream) -> KernelParam;
}

impl<T> KernelArg for CudaSlice<T> {
    fn param(&self, stream: &CudaStream) -> KernelParam {
        // The guard records nothing: event tracking is off for the backend's context.
        KernelParam::Device(self.device_ptr(stream).0)
    }
}

/// Plain values passed by value: their bytes are the kernel's parameter as it is declared in C.
///
/// # Safety
/// The type's layout must be the C layout of the kernel parameter it is passed as.
pub(crate) unsafe trait ValueArg {}

impl<T: ValueArg> KernelArg for T {
    fn param(&self, _stream: &CudaStream) -> KernelParam {
        KernelParam::Value(self as *const T as *const c_void)
    }
}

// SAFETY: primitive types are their own C types.
unsafe impl ValueArg for i32 {}
unsafe impl ValueArg for u32 {}
unsafe impl ValueArg for i64 {}
unsafe impl ValueArg for u64 {}
unsafe impl ValueArg for f32 {}

/// Whether the PTX entry `name` executes `griddepcontrol.wait`, i.e. may be launched before the
/// previous kernel on its stream has finished. Looks only inside that entry's body (from its
/// `.entry` line to the next one), where NVRTC has inlined the device functions it calls.
pub fn waits_for_previous_grid(ptx: &str, name: &str) -> bool {
    let header = format!(".entry {name}(");
    let Some(start) = ptx.find(&header) else {
        return false;
    };
    let body = &ptx[start + header.len()..];
    let end = body.find(".entry ").unwrap_or(body.len());
    body[..end].contains("griddepcontrol.wait")
}

impl CudaBackend {
    /// Launches kernel `name`; with PDL when the kernel waits for its predecessor itself.
    ///
    /// # Safety
    /// The parameters must match the kernel's C signature in number, order and type, and every
    /// length the kernel indexes with must hold (the callers state this contract at each call).
    pub(crate) unsafe fn launch_kernel(
        &self,
        name: &'static str,
        cfg: LaunchConfig,
        args: &[&dyn KernelArg],
    ) -> Result<(), DriverError> {
        let kernel = self.kernel(name);
        let params: Vec<KernelParam> = args.iter().map(|a| a.param(&self.stream)).collect();
        let mut pointers: Vec<*mut c_void> = params
            .iter()
            .map(|p| match p {
                KernelParam::Device(address) => address as *const u64 as *mut c_void,
                KernelParam::Value(value) => *value as *mut c_void,
            })
            .collect();
        self.ctx.bind_to_thread()?;
        // SAFETY: zero is a valid bit pattern for this plain C struct; the fields used are set.
        let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attribute.id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attribute.value.programmaticStreamSerializationAllowed = 1;
        let early_start = kernel.waits_for_previous_grid && self.dependent_launch;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: if early_start {
                &mut attribute
            } else {
                std::ptr::null_mut()
            },
            numAttrs: u32::from(early_start),
        };
        // SAFETY: `pointers` holds one pointer per kernel parameter (the caller's contract), each
        // to memory that outlives this call (`params` and the caller's values); the function
        // belongs to this context.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                kernel.function.cu_function(),
                pointers.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }
}

#[cfg(test)]
mod tests {
    use super::waits_for_previous_grid;

    #[test]
    fn only_the_entry_that_waits_is_found_waiting() {
        let ptx = "\
.visible .entry first(\n.param .u64 a\n)\n{\n griddepcontrol.wait;\n ret;\n}\n\
.visible .entry second(\n.param .u64 a\n)\n{\n ret;\n}\n";
        assert!(waits_for_previous_grid(ptx, "first"));
        assert!(!waits_for_previous_grid(ptx, "second"));
        assert!(!waits_for_previous_grid(ptx, "third"));
        assert!(!waits_for_previous_grid(ptx, "firs"));
    }
}
