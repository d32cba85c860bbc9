//! A device error that poisons the CUDA context (here a kernel that executes `trap`, as an illegal
//! address or an ECC error would) must make `recover_after_failure` report the device lost, so the
//! engine stops and the server exits instead of failing every later request; a context that only
//! ran out of memory must not. Its own test binary: after the trap nothing else can run in this
//! process's context.

use deltaserve_cuda::CudaBackend;
use deltaserve_tensor::Backend;

const TRAP: &str = r#"extern "C" __global__ void trap_now() { __trap(); }"#;

#[test]
fn a_trapped_context_is_reported_lost_and_an_oom_is_not() {
    let backend = match CudaBackend::new(0) {
        Ok(backend) => backend,
        Err(why) => {
            println!("SKIP a_trapped_context_is_reported_lost: no usable CUDA device: {why}");
            return;
        }
    };
    assert_eq!(
        backend.recover_after_failure(),
        Ok(()),
        "a healthy device is not lost"
    );

    // Out of memory is not a loss: a request for more than the GPU holds fails and the context
    // stays usable.
    let too_much =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| backend.zeros(1 << 40)));
    assert!(too_much.is_err(), "a 4 TiB buffer cannot be allocated");
    assert_eq!(
        backend.recover_after_failure(),
        Ok(()),
        "an allocation failure leaves the device usable"
    );

    // The primary context is the backend's too, so a trap here poisons it.
    let ctx = cudarc::driver::CudaContext::new(0).expect("the device the backend opened");
    let ptx = cudarc::nvrtc::compile_ptx(TRAP).expect("NVRTC compiles a one-line kernel");
    let module = ctx.load_module(ptx).expect("loading the trap kernel");
    let trap = module.load_function("trap_now").expect("trap_now");
    let stream = ctx.default_stream();
    let config = cudarc::driver::LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // The launch itself may already report the error; either way the context is gone after it.
    let _ = unsafe { stream.launch_builder(&trap).launch(config) };
    let _ = stream.synchronize();

    let lost = backend
        .recover_after_failure()
        .expect_err("a trapped context must be reported lost");
    println!("reported: {lost}");
    assert!(lost.contains("after the failure"), "{lost}");
    // Dropping the buffers of a dead context would only report more errors.
    std::mem::forget(backend);
    std::mem::forget(module);
}
