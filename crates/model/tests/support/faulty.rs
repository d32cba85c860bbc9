//! A backend that fails on purpose, for the tests of a failed step under tensor parallelism: it
//! forwards every op to an inner backend and panics on a chosen matmul call, as a device error
//! surfaces (a panic inside an op). Included by path from crates/engine/tests as well. The other ops
//! pass through (`deltaserve_tensor::forward_ops!`).
#![allow(dead_code)]

use deltaserve_tensor::{Backend, Communicator, InProcessGroup};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// The message of the injected panic.
pub const INJECTED: &str = "injected device failure";

/// What `recover_after_failure` reports after a failure armed to lose the device.
pub const DEVICE_LOST: &str = "injected: the device is gone";

/// When a `Faulty` backend fails; shared with the test, which arms it.
#[derive(Clone, Default)]
pub struct Fault {
    /// 0: disarmed; `n`: the `n`-th matmul from now panics (once, then disarmed).
    countdown: Arc<AtomicUsize>,
    /// Matmuls run so far (to pick a call inside a given step).
    calls: Arc<AtomicUsize>,
    /// Whether the armed failure takes the device with it (`recover_after_failure` then reports
    /// it lost), and whether it has.
    loses_device: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
}

impl Fault {
    /// The `nth` (1-based) matmul from now panics.
    pub fn arm(&self, nth: usize) {
        assert!(nth > 0);
        self.countdown.store(nth, Ordering::SeqCst);
    }

    /// The `nth` matmul from now panics and the device is lost for good, as after an illegal
    /// address on a GPU.
    pub fn arm_device_loss(&self, nth: usize) {
        self.loses_device.store(true, Ordering::SeqCst);
        self.arm(nth);
    }

    /// Whether an armed fault has not fired yet.
    pub fn armed(&self) -> bool {
        self.countdown.load(Ordering::SeqCst) > 0
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let fire = self
            .countdown
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok_and(|before| before == 1);
        if fire {
            if self.loses_device.load(Ordering::SeqCst) {
                self.lost.store(true, Ordering::SeqCst);
            }
            panic!("{INJECTED}");
        }
    }
}

/// `inner`, failing where `fault` says.
pub struct Faulty<B> {
    pub inner: B,
    pub fault: Fault,
}

/// Two ranks of `inner()`, each behind a `Faulty` wrapper, over one in-process group: the faults
/// the test arms, the backends and the communicators, as `load_tensor_parallel` takes them.
pub type FaultyPair<B> = (
    [Fault; 2],
    Vec<Faulty<B>>,
    Vec<Box<dyn Communicator<Faulty<B>>>>,
);

pub fn faulty_pair<B: Backend + 'static>(inner: impl Fn() -> B) -> FaultyPair<B>
where
    InProcessGroup: Communicator<Faulty<B>>,
{
    let faults = [Fault::default(), Fault::default()];
    let backends = faults
        .iter()
        .map(|fault| Faulty {
            inner: inner(),
            fault: fault.clone(),
        })
        .collect();
    let comms = InProcessGroup::new(2)
        .into_iter()
        .map(|g| Box::new(g) as Box<dyn Communicator<Faulty<B>>>)
        .collect();
    (faults, backends, comms)
}

impl<B: Backend> Backend for Faulty<B> {
    type Buf = B::Buf;
    type Mat = B::Mat;

    fn matmul(&self, x: &Self::Buf, w: &Self::Mat, out: &mut Self::Buf, tokens: usize) {
        self.fault.tick();
        self.inner.matmul(x, w, out, tokens)
    }
    fn matmul_group(
        &self,
        x: &Self::Buf,
        ws: &[&Self::Mat],
        outs: &mut [&mut Self::Buf],
        tokens: usize,
    ) {
        self.fault.tick();
        self.inner.matmul_group(x, ws, outs, tokens)
    }
    fn recover_after_failure(&self) -> Result<(), String> {
        self.inner.recover_after_failure()?;
        match self.fault.lost.load(Ordering::SeqCst) {
            true => Err(DEVICE_LOST.to_string()),
            false => Ok(()),
        }
    }
    deltaserve_tensor::forward_ops!(inner;
        name, zeros, kv_dtype, scratch, upload, to_host, buf_len, load_mat, load_vec, mat_shape,
        mat_bytes, embedding, add_rms_norm, rms_norm, gated_rms_norm, add_inplace, silu_mul,
        sigmoid_mul_inplace, rope, concat_cols, gather_rows, scatter_add_rows, sigmoid_scale_rows,
        attention, causal_conv1d, gdn_gates, gated_delta_rule, reset_state_slot, copy_state_slot,
        route_top_k, load_experts, generate_experts, moe_experts, generate_mat, samples_on_device,
        sample_rows, device, run_step, copy_buf);
}
