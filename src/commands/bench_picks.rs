//! How `bench`'s decode steps pick their tokens: greedily, or, for plain and batched decode,
//! sampled with `--temperature` / `--top-k` / `--top-p` as `serve` samples them (on the device when
//! the backend samples there, else with the engine's host sampler), so that a step's time holds the
//! sampler's cost a user with those settings pays.

use deltaserve_engine::rng::Rng;
use deltaserve_engine::sampler::{sample, PenaltyHistory};
use deltaserve_engine::{row_sampling, SamplingParams};
use deltaserve_model::{argmax, Model};
use deltaserve_tensor::{Backend, RowSampling};
use std::cell::RefCell;

/// The seed of a run's draws: the same tokens every run.
const PICK_SEED: u64 = 0x5eed;

/// Whether `params` pick the most likely token (temperature 0).
pub fn is_greedy(params: &SamplingParams) -> bool {
    params.temperature <= 0.0
}

/// Picks each logits row's token with one run's settings; draws come from one seeded generator.
pub struct Picker {
    params: SamplingParams,
    rng: RefCell<Rng>,
}

impl Picker {
    pub fn new(params: SamplingParams) -> Self {
        Self {
            params,
            rng: RefCell::new(Rng::new(PICK_SEED)),
        }
    }

    pub fn greedy() -> Self {
        Self::new(SamplingParams::default())
    }

    /// The token of each of `rows` logits rows: on the device when the backend samples there
    /// (only the ids come back), else from the logits copied to the host.
    pub fn pick<B: Backend>(&self, m: &Model<B>, logits: &B::Buf, rows: usize) -> Vec<u32> {
        self.pick_columns(m, logits, rows, m.config.vocab_size)
    }

    /// `pick` over rows of `vocab` logits each (an MTP step's: the draft head's rows), giving
    /// the picked column of each row.
    pub fn pick_columns<B: Backend>(
        &self,
        m: &Model<B>,
        logits: &B::Buf,
        rows: usize,
        vocab: usize,
    ) -> Vec<u32> {
        let greedy = is_greedy(&self.params);
        let mut rng = self.rng.borrow_mut();
        let requests: Vec<RowSampling> = (0..rows as u32)
            .map(|row| {
                let uniform = if greedy { 0.0 } else { rng.next_f64() };
                row_sampling(row, &self.params, uniform, None)
            })
            .collect();
        if let Some(ids) = m.backend.sample_rows(logits, vocab, &requests) {
            return ids;
        }
        let history = PenaltyHistory::new(&[]);
        m.backend
            .to_host(logits)
            .chunks_exact(vocab)
            .map(|row| {
                if greedy {
                    argmax(row)
                } else {
                    sample(row, &self.params, &history, &mut rng)
                }
            })
            .collect()
    }
}
