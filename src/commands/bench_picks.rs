//! How `bench`'s decode steps pick their tokens: greedily, or, for plain and batched decode,
//! sampled with `--temperature` / `--top-k` / `--top-p` as `serve` samples them (on the device when
//! the backend samples there, else with the engine's host sampler), so that a step's time holds the
//! sampler's cost a user with those settings pays.

use deltaserve_engine::rng::Rng;
use deltaserve_engine::sampler::{sample, PenaltyHistory};
use deltaserve_engine::SamplingParams;
use deltaserve_model::{argmax, Model};
use deltaserve_tensor::{Backend, RowSampling};
use std::cell::RefCell;

/// The seed of a run's draws: the same tokens every run.
const PICK_SEED: u64 = 0x5eed;

/// What a decode step's tokens are picked with (temperature 0: greedy, the filters unused).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeSampling {
    pub temperature: f32,
    /// 0: every token.
    pub top_k: usize,
    /// 1: every token.
    pub top_p: f32,
}

impl DecodeSampling {
    pub const GREEDY: Self = Self {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
    };

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// Picks each logits row's token with one run's settings; draws come from one seeded generator.
pub struct Picker {
    sampling: DecodeSampling,
    rng: RefCell<Rng>,
}

impl Picker {
    pub fn new(sampling: DecodeSampling) -> Self {
        Self {
            sampling,
            rng: RefCell::new(Rng::new(PICK_SEED)),
        }
    }

    pub fn greedy() -> Self {
        Self::new(DecodeSampling::GREEDY)
    }

    /// The token of each of `rows` logits rows: on the device when the backend samples there
    /// (only the ids come back), else from the logits copied to the host.
    pub fn pick<B: Backend>(&self, m: &Model<B>, logits: &B::Buf, rows: usize) -> Vec<u32> {
        let vocab = m.config.vocab_size;
        let DecodeSampling {
            temperature,
            top_k,
            top_p,
        } = self.sampling;
        let greedy = self.sampling.is_greedy();
        let mut rng = self.rng.borrow_mut();
        let requests: Vec<RowSampling> = (0..rows as u32)
            .map(|row| RowSampling {
                temperature: if greedy { 0.0 } else { temperature },
                top_k: top_k.min(u32::MAX as usize) as u32,
                top_p,
                uniform: if greedy { 0.0 } else { rng.next_f64() },
                ..RowSampling::greedy(row)
            })
            .collect();
        if let Some(ids) = m.backend.sample_rows(logits, vocab, &requests) {
            return ids;
        }
        let params = SamplingParams {
            temperature,
            top_k,
            top_p,
            ..SamplingParams::default()
        };
        let history = PenaltyHistory::new(&[]);
        m.backend
            .to_host(logits)
            .chunks_exact(vocab)
            .map(|row| {
                if greedy {
                    argmax(row)
                } else {
                    sample(row, &params, &history, &mut rng)
                }
            })
            .collect()
    }
}
