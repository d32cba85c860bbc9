//! Turning one row of logits into the next token: penalties, temperature, top-k, top-p, min-p, then
//! a draw from the request's own RNG (or argmax when greedy), plus OpenAI-style logprobs taken from
//! the raw logits. The processed distribution is exposed so speculative sampling can use it exactly.

use crate::api::{SamplingParams, TokenConstraint, TokenLogprob, TokenMask};
use crate::rng::Rng;
use std::borrow::Cow;
use std::collections::HashMap;

/// Tokens seen so far by one request, for the penalties.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PenaltyHistory {
    /// Occurrences of each token among the generated tokens.
    pub output_counts: HashMap<u32, u32>,
    /// Tokens of the prompt (the repetition penalty covers prompt and output, as in HF and vLLM).
    pub prompt_tokens: std::collections::HashSet<u32>,
}

impl PenaltyHistory {
    pub fn new(prompt: &[u32]) -> Self {
        Self {
            output_counts: HashMap::new(),
            prompt_tokens: prompt.iter().copied().collect(),
        }
    }

    pub fn record(&mut self, token: u32) {
        *self.output_counts.entry(token).or_insert(0) += 1;
    }
}

pub(crate) fn has_penalties(p: &SamplingParams) -> bool {
    p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 || p.repetition_penalty != 1.0
}

/// Applies repetition (HF: divide positive logits, multiply negative ones), presence and frequency
/// (OpenAI: subtract per generated occurrence) penalties in place.
pub fn apply_penalties(logits: &mut [f32], p: &SamplingParams, history: &PenaltyHistory) {
    if p.repetition_penalty != 1.0 {
        let seen = history
            .prompt_tokens
            .iter()
            .chain(history.output_counts.keys());
        for &t in seen {
            let l = &mut logits[t as usize];
            *l = if *l > 0.0 {
                *l / p.repetition_penalty
            } else {
                *l * p.repetition_penalty
            };
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        for (&t, &count) in &history.output_counts {
            logits[t as usize] -= p.presence_penalty + p.frequency_penalty * count as f32;
        }
    }
}

/// Index of the largest value; the lowest index wins ties.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The distribution a request samples from, as `(token, probability)` sorted by probability
/// (descending, ties by lower id), normalised over the surviving tokens. Filters apply in the order
/// temperature, top-k, top-p, min-p. Greedy requests get the single argmax token with probability 1.
pub fn processed_distribution(
    logits: &[f32],
    p: &SamplingParams,
    history: &PenaltyHistory,
) -> Vec<(u32, f32)> {
    let penalised;
    let logits = if has_penalties(p) {
        let mut l = logits.to_vec();
        apply_penalties(&mut l, p, history);
        penalised = l;
        &penalised[..]
    } else {
        logits
    };
    if p.temperature == 0.0 {
        return vec![(argmax(logits), 1.0)];
    }
    let mut keys = rank_keys(logits);
    if p.top_k > 0 && p.top_k < keys.len() {
        keys.select_nth_unstable(p.top_k - 1);
        keys.truncate(p.top_k);
    }
    keys.sort_unstable();
    let order: Vec<u32> = keys.into_iter().map(ranked_id).collect();
    let max = logits[order[0] as usize] as f64;
    let t = p.temperature as f64;
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i as usize] as f64 - max) / t).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut keep = order.len();
    if p.top_p < 1.0 {
        let mut cumulative = 0.0;
        for (i, w) in weights.iter().enumerate() {
            cumulative += w / total;
            if cumulative >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    if p.min_p > 0.0 {
        // weights[0] is the most likely token: min-p keeps tokens at least min_p times as likely.
        let threshold = p.min_p as f64 * weights[0];
        keep = keep.min(
            weights
                .iter()
                .take_while(|&&w| w >= threshold)
                .count()
                .max(1),
        );
    }
    // Tokens a grammar forbids (logit -inf) have weight 0 and sort last: never keep them, so not
    // even a rounding remainder in `draw` can pick one.
    keep = keep.min(weights.iter().take_while(|&&w| w > 0.0).count().max(1));
    let kept_total: f64 = weights[..keep].iter().sum();
    order[..keep]
        .iter()
        .zip(&weights[..keep])
        .map(|(&i, &w)| (i, (w / kept_total) as f32))
        .collect()
}

/// The logits a request samples from at its next position: `row` itself, or, under a constraint
/// that restricts this position, a copy with every forbidden token at negative infinity. An error
/// when the constraint fails or allows no token of the row.
pub fn constrain<'a>(
    row: &'a [f32],
    constraint: Option<&mut (dyn TokenConstraint + 'static)>,
) -> Result<Cow<'a, [f32]>, String> {
    match constraint {
        None => Ok(Cow::Borrowed(row)),
        Some(constraint) => apply_mask(row, constraint.allowed()?),
    }
}

/// `row` under a constraint's answer for its position (`None`: any token).
pub fn apply_mask(row: &[f32], mask: Option<TokenMask>) -> Result<Cow<'_, [f32]>, String> {
    match mask {
        None => Ok(Cow::Borrowed(row)),
        Some(mask) if mask.allows_none(row.len()) => {
            Err("the output grammar allows no further token".to_string())
        }
        Some(mask) => Ok(Cow::Owned(mask.apply(row))),
    }
}

/// Draws from a processed distribution with one uniform number.
pub fn draw(dist: &[(u32, f32)], rng: &mut Rng) -> u32 {
    if dist.len() == 1 {
        return dist[0].0;
    }
    let u = rng.next_f64();
    let mut cumulative = 0.0;
    for &(token, prob) in dist {
        cumulative += prob as f64;
        if u < cumulative {
            return token;
        }
    }
    // Rounding left the cumulative sum a hair below 1: the last token takes the remainder.
    dist[dist.len() - 1].0
}

/// Chooses the next token for one request.
pub fn sample(logits: &[f32], p: &SamplingParams, history: &PenaltyHistory, rng: &mut Rng) -> u32 {
    draw(&processed_distribution(logits, p, history), rng)
}

/// Log-softmax of the raw logits at `chosen`, with the `top` best alternatives (OpenAI logprobs
/// report the model's distribution, before penalties and temperature, as vLLM does by default).
pub fn logprobs(logits: &[f32], chosen: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let log_total = logits
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    let lp = |i: u32| (logits[i as usize] as f64 - log_total) as f32;
    let mut best = rank_keys(logits);
    let top = top.min(best.len());
    if top > 0 && top < best.len() {
        best.select_nth_unstable(top - 1);
    }
    best.truncate(top);
    best.sort_unstable();
    TokenLogprob {
        logprob: lp(chosen),
        top: best
            .into_iter()
            .map(ranked_id)
            .map(|i| (i, lp(i)))
            .collect(),
    }
}

/// Every token of the row as an integer whose ascending order is the tokens' by logit, highest
/// first (`f32::total_cmp`), ties to the lower id: the logit's order-preserving bits, inverted, above
/// the id. Sorting these gives what sorting the ids with a comparator that reads the logits gave,
/// without its indirect loads: a 248k-token row in ~8 ms instead of ~20 (this project's 2-core
/// machine kind, docs/benchmarks.md session 16).
fn rank_keys(logits: &[f32]) -> Vec<u64> {
    logits
        .iter()
        .zip(0u32..)
        .map(|(&logit, id)| (u64::from(!total_order_bits(logit)) << 32) | u64::from(id))
        .collect()
}

fn ranked_id(key: u64) -> u32 {
    key as u32
}

/// The bits of `x` as an unsigned integer ordered as `f32::total_cmp` orders the floats.
fn total_order_bits(x: f32) -> u32 {
    let bits = x.to_bits();
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..Default::default()
        }
    }

    #[test]
    fn rank_keys_order_tokens_as_total_cmp_with_ties_to_the_lower_id() {
        let row = [
            1.0,
            f32::NAN,
            -0.0,
            0.0,
            f32::NEG_INFINITY,
            1.0,
            -f32::NAN,
            f32::INFINITY,
            -2.5,
            1e-30,
            -1e-30,
            1.0,
        ];
        let mut by_comparator: Vec<u32> = (0..row.len() as u32).collect();
        by_comparator.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        let mut keys = rank_keys(&row);
        keys.sort_unstable();
        let by_keys: Vec<u32> = keys.into_iter().map(ranked_id).collect();
        assert_eq!(by_keys, by_comparator);
        assert_eq!(by_keys[..5], [1, 7, 0, 5, 11]);
    }

    #[test]
    fn greedy_takes_argmax_after_penalties() {
        let logits = [1.0, 3.0, 2.0];
        let mut h = PenaltyHistory::new(&[]);
        assert_eq!(sample(&logits, &params(0.0), &h, &mut Rng::new(0)), 1);
        h.record(1);
        let p = SamplingParams {
            frequency_penalty: 1.5,
            ..params(0.0)
        };
        assert_eq!(sample(&logits, &p, &h, &mut Rng::new(0)), 2);
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..params(0.0)
        };
        assert_eq!(
            sample(&logits, &p, &h, &mut Rng::new(0)),
            2,
            "3.0 / 2 = 1.5 < 2.0"
        );
    }

    #[test]
    fn filters_shrink_the_distribution() {
        let logits = [0.0, 1.0, 2.0, 3.0];
        let h = PenaltyHistory::default();
        let top_k = SamplingParams {
            top_k: 2,
            ..params(1.0)
        };
        let d = processed_distribution(&logits, &top_k, &h);
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![3, 2]);
        assert!((d.iter().map(|x| x.1).sum::<f32>() - 1.0).abs() < 1e-6);
        let top_p = SamplingParams {
            top_p: 0.5,
            ..params(1.0)
        };
        assert_eq!(
            processed_distribution(&logits, &top_p, &h).len(),
            1,
            "p(3) = 0.64 >= 0.5"
        );
        let min_p = SamplingParams {
            min_p: 0.3,
            ..params(1.0)
        };
        // p(2)/p(3) = e^-1 = 0.37 >= 0.3, p(1)/p(3) = 0.14 < 0.3.
        assert_eq!(processed_distribution(&logits, &min_p, &h).len(), 2);
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let logits = [0.0, (3.0f32).ln()]; // probabilities 1/4 and 3/4
        let h = PenaltyHistory::default();
        let mut rng = Rng::new(42);
        let n = 20_000;
        let ones = (0..n)
            .filter(|_| sample(&logits, &params(1.0), &h, &mut rng) == 1)
            .count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.015, "{frac}");
    }

    #[test]
    fn logprobs_are_log_softmax_of_raw_logits() {
        let lp = logprobs(&[0.0, 0.0, (2.0f32).ln()], 2, 2);
        assert!((lp.logprob - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(lp.top[0].0, 2);
        assert_eq!(lp.top[1].0, 0, "ties go to the lower id");
    }
}
