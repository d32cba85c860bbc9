//! One prompt through both forward passes, comparing the residual stream after every layer and the
//! final logits: where the ops all pass but a layer diverges, the wiring is at fault.

use crate::report::{CheckRow, Comparison};
use deltaserve_model::{ForwardInput, LayerObserver, Model};
use deltaserve_tensor::reference::ReferenceBackend;
use deltaserve_tensor::{Backend, BatchLayout};

struct Capture<'a, B: Backend> {
    backend: &'a B,
    layers: Vec<Vec<f32>>,
}

impl<B: Backend> LayerObserver<B> for Capture<'_, B> {
    fn after_layer(&mut self, _layer: usize, hidden: &B::Buf) {
        self.layers.push(self.backend.to_host(hidden));
    }
}

fn run<B: Backend>(model: &Model<B>, prompt: &[u32]) -> (Vec<Vec<f32>>, Vec<f32>) {
    let mut cache = model.single_sequence_cache(prompt.len());
    let blocks = (0..cache.geometry.num_blocks as u32).collect();
    let batch = BatchLayout::packed(cache.geometry.block_size, [(prompt.len(), 0, blocks, 0)]);
    let rows: Vec<u32> = (0..prompt.len() as u32).collect();
    let mut capture = Capture {
        backend: &model.backend,
        layers: Vec::new(),
    };
    let out = model.forward_observed(
        &ForwardInput {
            tokens: prompt,
            batch: &batch,
            logit_rows: &rows,
            hidden_rows: &[],
        },
        &mut cache,
        &mut capture,
    );
    (capture.layers, model.backend.to_host(&out.logits))
}

/// Compares the hidden state after each layer, then the logits, of `prompt` (non-empty).
pub fn check_layers<B: Backend>(
    reference: &Model<ReferenceBackend>,
    target: &Model<B>,
    prompt: &[u32],
    tolerance: f32,
) -> Vec<CheckRow> {
    let (ref_layers, ref_logits) = run(reference, prompt);
    let (our_layers, our_logits) = run(target, prompt);
    let c = &reference.config;
    let mut rows: Vec<CheckRow> = ref_layers
        .iter()
        .zip(&our_layers)
        .enumerate()
        .map(|(i, (r, o))| CheckRow {
            what: format!("hidden after layer ({} tokens)", prompt.len()),
            layer: Some(i),
            layer_kind: if c.is_full_attention(i) {
                "full_attention"
            } else {
                "linear_attention"
            },
            comparison: Comparison::of(o, r),
            tolerance,
        })
        .collect();
    rows.push(CheckRow {
        what: "logits".into(),
        layer: None,
        layer_kind: "model",
        comparison: Comparison::of(&our_logits, &ref_logits),
        tolerance,
    });
    rows
}
