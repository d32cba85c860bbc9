//! The routed experts of a MoE block as the `Backend` sees them: their weights (one matrix per
//! expert projection, or stacked for a backend with a fused kernel) and the generic way to run
//! them, which every backend without a fused path uses: route, then per expert one batched GEMM
//! over the tokens that chose it (gathered), scattered back with the routing weights.

use crate::backend::Backend;
use crate::host::HostTensor;

/// Geometry of the routed experts of one MoE block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertShape {
    pub experts: usize,
    /// im: rows of each expert's gate and up projection.
    pub intermediate: usize,
    pub hidden: usize,
}

/// How tokens pick experts: softmax over the router logits, the `top_k` most probable (ties to the
/// lower expert index), weights renormalised to sum 1 when `renormalize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeRouting {
    pub top_k: usize,
    pub renormalize: bool,
}

/// One expert's projections as the checkpoint has them: gate and up `[im, h]`, down `[h, im]`.
pub struct ExpertTensors {
    pub gate: HostTensor,
    pub up: HostTensor,
    pub down: HostTensor,
}

/// The experts' weights in the backend's storage.
pub enum ExpertWeights<M> {
    /// One matrix per projection per expert (the generic path).
    PerExpert {
        gate: Vec<M>,
        up: Vec<M>,
        down: Vec<M>,
    },
    /// `gate_up [E * 2 * im, h]` (expert e's gate rows, then its up rows) and `down [E * h, im]`,
    /// for a backend's fused kernels; only that backend creates and reads this form.
    Stacked { gate_up: M, down: M },
}

/// The routed experts of one MoE block.
pub struct Experts<M> {
    pub shape: ExpertShape,
    pub weights: ExpertWeights<M>,
}

/// The shared expert of a MoE block: a SwiGLU MLP (`gate`, `up [ims, h]`, `down [h, ims]`) every
/// token runs, its output scaled by `sigmoid` of the token's gate logit (`gate_logits [T, 1]`) and
/// added to the routed experts' output.
pub struct SharedExpert<'a, M, Buf> {
    pub gate: &'a M,
    pub up: &'a M,
    pub down: &'a M,
    pub gate_logits: &'a Buf,
}

/// Uploads every expert matrix on its own (the generic storage).
pub fn load_per_expert<B: Backend + ?Sized>(
    backend: &B,
    experts: &[ExpertTensors],
    shape: ExpertShape,
) -> Result<Experts<B::Mat>, crate::TensorError> {
    let mut gate = Vec::with_capacity(experts.len());
    let mut up = Vec::with_capacity(experts.len());
    let mut down = Vec::with_capacity(experts.len());
    for e in experts {
        gate.push(backend.load_mat(&e.gate)?);
        up.push(backend.load_mat(&e.up)?);
        down.push(backend.load_mat(&e.down)?);
    }
    Ok(Experts {
        shape,
        weights: ExpertWeights::PerExpert { gate, up, down },
    })
}

/// The generic routed-experts pass: routing through `route_top_k`, then for each expert that any
/// token chose one gate/up GEMM over those tokens, SiLU-mul, one down GEMM, and a weighted
/// scatter-add into the output (experts in index order); then the gated shared expert.
pub fn moe_per_expert<B: Backend + ?Sized>(
    backend: &B,
    x: &B::Buf,
    router_logits: &B::Buf,
    experts: &Experts<B::Mat>,
    routing: MoeRouting,
    tokens: usize,
    shared: Option<SharedExpert<'_, B::Mat, B::Buf>>,
) -> B::Buf {
    let ExpertWeights::PerExpert { gate, up, down } = &experts.weights else {
        panic!(
            "{}: stacked expert weights reached the generic MoE path (only the backend that \
             stacked them can run them)",
            backend.name()
        );
    };
    let hidden = experts.shape.hidden;
    let routes = backend.route_top_k(
        router_logits,
        experts.shape.experts,
        routing.top_k,
        routing.renormalize,
    );
    let mut out = backend.zeros(tokens * hidden);
    for e in 0..experts.shape.experts {
        let (rows, weights): (Vec<u32>, Vec<f32>) = routes
            .iter()
            .filter(|r| r.expert as usize == e)
            .map(|r| (r.token, r.weight))
            .unzip();
        if rows.is_empty() {
            continue;
        }
        let n = rows.len();
        let xe = backend.gather_rows(x, hidden, &rows);
        let im = experts.shape.intermediate;
        let mut act = backend.scratch(n * im);
        backend.matmul_silu_gate(&xe, &gate[e], &up[e], &mut act, n);
        let mut ye = backend.scratch(n * hidden);
        backend.matmul(&act, &down[e], &mut ye, n);
        backend.scatter_add_rows(&mut out, &ye, hidden, &rows, &weights);
    }
    if let Some(shared) = shared {
        let mut s = shared_expert_output(backend, x, &shared, tokens);
        backend.sigmoid_scale_rows(&mut s, shared.gate_logits, hidden);
        backend.add_inplace(&mut out, &s);
    }
    out
}

/// The shared expert's MLP output `[T, h]`, before its gate.
pub fn shared_expert_output<B: Backend + ?Sized>(
    backend: &B,
    x: &B::Buf,
    shared: &SharedExpert<'_, B::Mat, B::Buf>,
    tokens: usize,
) -> B::Buf {
    let (ims, hidden) = backend.mat_shape(shared.gate);
    let mut act = backend.scratch(tokens * ims);
    backend.matmul_silu_gate(x, shared.gate, shared.up, &mut act, tokens);
    let mut out = backend.scratch(tokens * hidden);
    backend.matmul(&act, shared.down, &mut out, tokens);
    out
}
