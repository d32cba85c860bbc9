//! One prompt through both forward passes, every layer checked on the same input: the target runs
//! freely, and the reference runs each layer on the target's own residual stream before it (the
//! stream after layer `i` is replaced by the target's before layer `i + 1`). Each row compares what
//! one layer added to the stream, so rounding does not compound through the layers (random
//! checkpoints amplify bf16 rounding until a free-running comparison fails on a correct backend),
//! while a wrong layer still differs at O(1). Where the ops all pass but a layer diverges, the
//! wiring is at fault.

use crate::report::{CheckRow, Comparison};
use deltaserve_model::{ForwardInput, LayerObserver, Model};
use deltaserve_tensor::{Backend, BatchLayout};

/// The residual stream before and after every layer, on the host.
struct Capture<'a, B: Backend> {
    backend: &'a B,
    inputs: Vec<Vec<f32>>,
    outputs: Vec<Vec<f32>>,
    /// When set, the stream each layer's successor starts from (the target's outputs).
    forced: Option<&'a [Vec<f32>]>,
}

impl<B: Backend> LayerObserver<B> for Capture<'_, B> {
    fn before_layer(&mut self, _layer: usize, hidden: &B::Buf) {
        self.inputs.push(self.backend.to_host(hidden));
    }
    fn after_layer(&mut self, _layer: usize, hidden: &B::Buf) {
        self.outputs.push(self.backend.to_host(hidden));
    }
    fn replace_after_layer(&mut self, layer: usize) -> Option<Vec<f32>> {
        self.forced.and_then(|f| f.get(layer).cloned())
    }
}

/// What one forward of the prompt saw: each layer's input and output stream, and the logits.
struct Run {
    inputs: Vec<Vec<f32>>,
    outputs: Vec<Vec<f32>>,
    logits: Vec<f32>,
}

fn run<B: Backend>(model: &Model<B>, prompt: &[u32], forced: Option<&[Vec<f32>]>) -> Run {
    let mut cache = model.single_sequence_cache(prompt.len());
    let blocks = (0..cache.geometry.num_blocks as u32).collect();
    let batch = BatchLayout::packed(cache.geometry.block_size, [(prompt.len(), 0, blocks, 0)]);
    let rows: Vec<u32> = (0..prompt.len() as u32).collect();
    let mut capture = Capture {
        backend: &model.backend,
        inputs: Vec::new(),
        outputs: Vec::new(),
        forced,
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
    Run {
        inputs: capture.inputs,
        outputs: capture.outputs,
        logits: model.backend.to_host(&out.logits),
    }
}

/// At most one token in this many may pick other experts than the reference does (at least one).
const NEAR_TIE_TOKENS: usize = 32;

/// A MoE layer's comparison. A token whose top-k experts include a near-tie can pick another expert
/// once the router's inputs are rounded, which changes that token's update at O(1) although every
/// kernel is right (the `moe experts` op check, which gives both backends the same router logits,
/// allows none). So the tokens over `tolerance` are left out when they are few (at most one in
/// `NEAR_TIE_TOKENS`); the comparison is then over the others, and the count is returned. A wrong
/// kernel or wiring changes most tokens and fails as a whole.
fn moe_layer_comparison(
    ours: &[f32],
    theirs: &[f32],
    tokens: usize,
    tolerance: f32,
) -> (Comparison, usize) {
    let whole = Comparison::of(ours, theirs);
    // A NaN is never a flip.
    if whole.relative <= tolerance
        || whole.relative.is_nan()
        || tokens == 0
        || !ours.len().is_multiple_of(tokens)
    {
        return (whole, 0);
    }
    let width = ours.len() / tokens;
    let scale = theirs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let row = |r: usize| r * width..(r + 1) * width;
    let over: Vec<usize> = (0..tokens)
        .filter(|&r| {
            let worst = ours[row(r)]
                .iter()
                .zip(&theirs[row(r)])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            worst > tolerance * scale
        })
        .collect();
    if over.len() > (tokens / NEAR_TIE_TOKENS).max(1) {
        return (whole, 0);
    }
    let keep = |values: &[f32]| -> Vec<f32> {
        (0..tokens)
            .filter(|r| !over.contains(r))
            .flat_map(|r| values[row(r)].to_vec())
            .collect()
    };
    let rest = Comparison::of(&keep(ours), &keep(theirs));
    // Relative to the whole update's scale, as every other row of the report.
    let relative = if scale > 0.0 {
        rest.max_abs / scale
    } else {
        rest.max_abs
    };
    (
        Comparison {
            max_abs: rest.max_abs,
            relative,
        },
        over.len(),
    )
}

/// What a layer added to the residual stream.
fn update(output: &[f32], input: &[f32]) -> Vec<f32> {
    output.iter().zip(input).map(|(o, i)| o - i).collect()
}

/// Compares, layer by layer, what each layer adds to the stream given the target's own input to
/// it, then the logits of the target's final stream; `prompt` is non-empty.
pub fn check_layers<R: Backend, B: Backend>(
    reference: &Model<R>,
    target: &Model<B>,
    prompt: &[u32],
    tolerance: f32,
) -> Vec<CheckRow> {
    let ours = run(target, prompt, None);
    let theirs = run(reference, prompt, Some(&ours.outputs));
    let c = &reference.config;
    let tokens = prompt.len();
    let mut rows: Vec<CheckRow> = (0..ours.outputs.len().min(theirs.outputs.len()))
        .map(|i| {
            let ours_update = update(&ours.outputs[i], &ours.inputs[i]);
            let theirs_update = update(&theirs.outputs[i], &theirs.inputs[i]);
            let (comparison, excluded) = if c.is_moe_layer(i) {
                moe_layer_comparison(&ours_update, &theirs_update, tokens, tolerance)
            } else {
                (Comparison::of(&ours_update, &theirs_update), 0)
            };
            let excluded = match excluded {
                0 => String::new(),
                n => format!(", {n} over tolerance left out as expert-choice flips"),
            };
            CheckRow {
                what: format!("layer update on the same input ({tokens} tokens{excluded})"),
                layer: Some(i),
                layer_kind: if c.is_full_attention(i) {
                    "full_attention"
                } else {
                    "linear_attention"
                },
                comparison,
                tolerance,
            }
        })
        .collect();
    rows.push(CheckRow {
        what: "logits of the same final stream".into(),
        layer: None,
        layer_kind: "model",
        comparison: Comparison::of(&ours.logits, &theirs.logits),
        tolerance,
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tokens` rows of 4 values; the rows in `off` differ by `by` in their first value.
    fn rows(tokens: usize, off: &[usize], by: f32) -> (Vec<f32>, Vec<f32>) {
        let theirs: Vec<f32> = (0..tokens * 4).map(|i| 1.0 + (i % 7) as f32).collect();
        let mut ours = theirs.clone();
        for &r in off {
            ours[r * 4] += by;
        }
        (ours, theirs)
    }

    #[test]
    fn a_few_flipped_tokens_are_left_out_and_many_fail_the_layer() {
        let (ours, theirs) = rows(64, &[5], 3.0);
        let (c, excluded) = moe_layer_comparison(&ours, &theirs, 64, 5e-2);
        assert_eq!((c.relative, excluded), (0.0, 1));

        let (ours, theirs) = rows(64, &[5, 40], 3.0);
        assert_eq!(moe_layer_comparison(&ours, &theirs, 64, 5e-2).1, 2);

        let (ours, theirs) = rows(64, &[1, 5, 40], 3.0);
        let (c, excluded) = moe_layer_comparison(&ours, &theirs, 64, 5e-2);
        assert_eq!(excluded, 0, "three of 64 tokens are more than 1 in 32");
        assert!(c.relative > 5e-2);

        let (mut ours, theirs) = rows(64, &[], 0.0);
        ours[9] = f32::NAN;
        let (c, excluded) = moe_layer_comparison(&ours, &theirs, 64, 5e-2);
        assert!(
            c.relative.is_nan() && excluded == 0,
            "a NaN in one token must fail"
        );
    }

    #[test]
    fn small_errors_everywhere_leave_nothing_out() {
        let (ours, theirs) = rows(64, &(0..64).collect::<Vec<_>>(), 0.01);
        let (c, excluded) = moe_layer_comparison(&ours, &theirs, 64, 5e-2);
        assert_eq!(excluded, 0);
        assert!(c.relative < 5e-2);
    }
}
