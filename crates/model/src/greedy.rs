//! Single-sequence greedy decoding over the model with a private cache: the simplest correct way to
//! continue a prompt, used by `deltaserve generate`, by tests and by canaries. The serving engine has
//! its own batched loop; this one exists so the model can be checked without it.

use crate::cache::{CacheGeometry, HybridCache};
use crate::forward::{ForwardInput, Model};
use deltaserve_tensor::{Backend, BatchLayout};

const BLOCK_SIZE: usize = 16;

/// Index of the largest value; the lowest index wins ties (as torch.argmax does).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

impl<B: Backend> Model<B> {
    /// A cache sized for one sequence of up to `max_tokens` tokens.
    pub fn single_sequence_cache(&self, max_tokens: usize) -> HybridCache<B> {
        let geometry = CacheGeometry {
            num_blocks: max_tokens.div_ceil(BLOCK_SIZE).max(1),
            block_size: BLOCK_SIZE,
            state_slots: 1,
            mtp: self.has_mtp(),
        };
        HybridCache::new(&self.backend, &self.config, geometry)
    }

    /// Greedy continuation of `prompt` (non-empty) by up to `max_new` tokens; stops after emitting
    /// any of `stop_ids`. `on_token` sees each new token as it is chosen.
    pub fn generate_greedy(
        &self,
        prompt: &[u32],
        max_new: usize,
        stop_ids: &[u32],
        on_token: &mut dyn FnMut(u32),
    ) -> Vec<u32> {
        assert!(
            !prompt.is_empty(),
            "generate_greedy needs at least one prompt token"
        );
        let total = prompt.len() + max_new;
        let mut cache = self.single_sequence_cache(total);
        let blocks: Vec<u32> = (0..cache.geometry.num_blocks as u32).collect();
        let mut generated = Vec::with_capacity(max_new);
        let mut pos = 0;
        let mut step: Vec<u32> = prompt.to_vec();
        while generated.len() < max_new {
            let batch = BatchLayout::packed(BLOCK_SIZE, [(step.len(), pos, blocks.clone(), 0)]);
            let last = [step.len() as u32 - 1];
            let out = self.forward(
                &ForwardInput {
                    tokens: &step,
                    batch: &batch,
                    logit_rows: &last,
                    hidden_rows: &[],
                },
                &mut cache,
            );
            pos += step.len();
            let next = argmax(&self.backend.to_host(&out.logits));
            generated.push(next);
            on_token(next);
            if stop_ids.contains(&next) {
                break;
            }
            step = vec![next];
        }
        generated
    }
}
