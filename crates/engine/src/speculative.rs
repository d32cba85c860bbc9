//! Speculative decoding with the model's MTP head (SGLang's NEXTN, chain drafting): settings, and
//! the acceptance rule that turns the target's verify logits into emitted tokens. Greedy requests
//! accept the longest matching prefix plus a bonus token; sampled requests use exact speculative
//! sampling (accept with min(1, p/q), else resample from the normalised residual max(0, p - q)), so
//! the output distribution equals non-speculative sampling under the same penalties and filters.

use crate::api::{SamplingParams, TokenConstraint};
use crate::rng::Rng;
use crate::sampler::{constrain, draw, processed_distribution, PenaltyHistory};

/// Test-only fault injection for the drafter: never set by the server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DraftFault {
    #[default]
    None,
    /// Every draft token is replaced by the next vocabulary id, so verification rejects (almost)
    /// everything and rollback is exercised at every position.
    WrongTokens,
    /// Drafts come from a function of the sequence's tokens so far (committed tokens followed by
    /// the drafts of this round), so tests can choose where drafts are right and where wrong.
    Scripted(DraftScript),
}

/// A draft oracle for tests: maps the tokens so far to the next draft token.
#[derive(Clone)]
pub struct DraftScript(pub std::sync::Arc<DraftOracle>);

/// Maps the tokens so far to the next draft token.
pub type DraftOracle = dyn Fn(&[u32]) -> u32 + Send + Sync;

impl std::fmt::Debug for DraftScript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DraftScript(..)")
    }
}

impl PartialEq for DraftScript {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for DraftScript {}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecConfig {
    /// k: draft tokens per verify step (`--speculative-num-steps`).
    pub num_steps: usize,
    /// No drafting while more than this many requests run (`--speculative-disable-batch-size`).
    pub disable_batch_size: Option<usize>,
    pub fault: DraftFault,
}

impl SpecConfig {
    /// State slots one speculating sequence holds: its own plus one snapshot per verified token.
    pub fn slots_per_sequence(&self) -> usize {
        1 + self.num_steps + 1
    }
}

/// What verification of one sequence's drafts decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verification {
    /// Drafts accepted (a prefix of the drafts).
    pub accepted: usize,
    /// The accepted drafts followed by one token chosen from the target (correction or bonus).
    pub emitted: Vec<u32>,
}

fn probability(dist: &[(u32, f32)], token: u32) -> f64 {
    dist.iter()
        .find(|&&(t, _)| t == token)
        .map_or(0.0, |&(_, p)| p as f64)
}

/// `max(0, p - q)` normalised; falls back to `p` when the residual vanishes (p == q up to rounding).
fn residual(p: &[(u32, f32)], q: &[(u32, f32)]) -> Vec<(u32, f32)> {
    let mut r: Vec<(u32, f32)> = p
        .iter()
        .map(|&(t, pt)| (t, (pt as f64 - probability(q, t)).max(0.0) as f32))
        .filter(|&(_, w)| w > 0.0)
        .collect();
    let total: f64 = r.iter().map(|&(_, w)| w as f64).sum();
    if total <= 0.0 {
        return p.to_vec();
    }
    for (_, w) in &mut r {
        *w = (*w as f64 / total) as f32;
    }
    r
}

/// Verifies `drafts` (drawn from `draft_dists`) against the target's logits rows: `target[j]` is the
/// target's next-token logits after the committed token and the first `j` drafts. `history` gains
/// every emitted token, so each row is processed with exactly the penalties a non-speculative run
/// would have applied.
pub fn verify(
    target: &[&[f32]],
    drafts: &[u32],
    draft_dists: &[Vec<(u32, f32)>],
    params: &SamplingParams,
    history: &mut PenaltyHistory,
    rng: &mut Rng,
) -> Verification {
    verify_constrained(
        target,
        drafts,
        draft_dists,
        params,
        history,
        rng,
        None,
        usize::MAX,
    )
    .expect("verification without a constraint cannot fail")
}

/// `verify` under a constraint (a grammar): row `j` is masked by what the constraint allows after
/// the tokens emitted before it, so a draft the grammar forbids has target probability 0 and is
/// rejected, and the correction is drawn from the allowed tokens only. Every emitted token is
/// committed to the constraint, in order; nothing else is (rejected drafts never reach it). Greedy
/// requests therefore emit exactly what non-speculative constrained decoding emits. At most `budget`
/// tokens are emitted (what the request may still generate), so none past its end is committed.
#[allow(clippy::too_many_arguments)]
pub fn verify_constrained(
    target: &[&[f32]],
    drafts: &[u32],
    draft_dists: &[Vec<(u32, f32)>],
    params: &SamplingParams,
    history: &mut PenaltyHistory,
    rng: &mut Rng,
    mut constraint: Option<&mut (dyn TokenConstraint + 'static)>,
    budget: usize,
) -> Result<Verification, String> {
    debug_assert_eq!(target.len(), drafts.len() + 1);
    let mut emitted = Vec::with_capacity(drafts.len() + 1);
    for (j, &draft) in drafts.iter().enumerate() {
        if emitted.len() >= budget.max(1) {
            return Ok(Verification {
                accepted: j,
                emitted,
            });
        }
        let row = constrain(target[j], constraint.as_deref_mut())?;
        let p = processed_distribution(&row, params, history);
        let ratio =
            probability(&p, draft) / probability(&draft_dists[j], draft).max(f64::MIN_POSITIVE);
        // Ratios of 0 and of at least 1 decide without a random number (so greedy spends none).
        let accept = ratio >= 1.0 || (ratio > 0.0 && rng.next_f64() < ratio);
        let token = if accept {
            draft
        } else {
            draw(&residual(&p, &draft_dists[j]), rng)
        };
        emitted.push(token);
        history.record(token);
        if let Some(c) = constraint.as_deref_mut() {
            c.commit(token)?;
        }
        if !accept {
            return Ok(Verification {
                accepted: j,
                emitted,
            });
        }
    }
    if emitted.len() >= budget.max(1) {
        return Ok(Verification {
            accepted: drafts.len(),
            emitted,
        });
    }
    let row = constrain(target[drafts.len()], constraint.as_deref_mut())?;
    let bonus = draw(&processed_distribution(&row, params, history), rng);
    emitted.push(bonus);
    history.record(bonus);
    if let Some(c) = constraint {
        c.commit(bonus)?;
    }
    Ok(Verification {
        accepted: drafts.len(),
        emitted,
    })
}

/// Greedy verification from the target's argmax per row (`argmaxes[j]` after the committed token
/// and the first `j` drafts): the same decision as `verify` with greedy parameters, which is all a
/// device sampler needs to return.
pub fn verify_greedy(
    argmaxes: &[u32],
    drafts: &[u32],
    history: &mut PenaltyHistory,
) -> Verification {
    debug_assert_eq!(argmaxes.len(), drafts.len() + 1);
    let accepted = drafts
        .iter()
        .zip(argmaxes)
        .take_while(|(draft, target)| draft == target)
        .count();
    let emitted: Vec<u32> = drafts[..accepted]
        .iter()
        .chain(std::iter::once(&argmaxes[accepted]))
        .copied()
        .collect();
    for &token in &emitted {
        history.record(token);
    }
    Verification { accepted, emitted }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greedy() -> SamplingParams {
        SamplingParams::default()
    }

    #[test]
    fn greedy_accepts_the_matching_prefix_plus_one() {
        // Target argmaxes: 2, 0, 1, 3.
        let rows: [&[f32]; 4] = [
            &[0., 1., 5., 0.],
            &[9., 1., 5., 0.],
            &[0., 7., 5., 0.],
            &[0., 1., 5., 8.],
        ];
        let one_hot = |t| vec![(t, 1.0)];
        let mut rng = Rng::new(0);
        let mut h = PenaltyHistory::default();
        let v = verify(
            &rows,
            &[2, 0, 3],
            &[one_hot(2), one_hot(0), one_hot(3)],
            &greedy(),
            &mut h,
            &mut rng,
        );
        assert_eq!(
            v,
            Verification {
                accepted: 2,
                emitted: vec![2, 0, 1]
            }
        );
        let v = verify(
            &rows,
            &[2, 0, 1],
            &[one_hot(2), one_hot(0), one_hot(1)],
            &greedy(),
            &mut PenaltyHistory::default(),
            &mut rng,
        );
        assert_eq!(
            v,
            Verification {
                accepted: 3,
                emitted: vec![2, 0, 1, 3]
            }
        );
        let v = verify(
            &rows,
            &[1, 0, 1],
            &[one_hot(1), one_hot(0), one_hot(1)],
            &greedy(),
            &mut PenaltyHistory::default(),
            &mut rng,
        );
        assert_eq!(
            v,
            Verification {
                accepted: 0,
                emitted: vec![2]
            }
        );
        assert_eq!(
            rng.next_u64(),
            Rng::new(0).next_u64(),
            "greedy verification draws no random numbers"
        );
    }

    #[test]
    fn greedy_verification_from_argmaxes_decides_as_from_logits() {
        let rows: [&[f32]; 4] = [
            &[0., 1., 5., 0.],
            &[9., 1., 5., 0.],
            &[0., 7., 5., 0.],
            &[0., 1., 5., 8.],
        ];
        let argmaxes: Vec<u32> = rows.iter().map(|r| crate::sampler::argmax(r)).collect();
        for drafts in [[2, 0, 3], [2, 0, 1], [1, 0, 1], [2, 1, 1]] {
            let one_hot: Vec<Vec<(u32, f32)>> = drafts.iter().map(|&t| vec![(t, 1.0)]).collect();
            let (mut from_logits, mut from_argmax) =
                (PenaltyHistory::default(), PenaltyHistory::default());
            let want = verify(
                &rows,
                &drafts,
                &one_hot,
                &greedy(),
                &mut from_logits,
                &mut Rng::new(0),
            );
            let got = verify_greedy(&argmaxes, &drafts, &mut from_argmax);
            assert_eq!(got, want, "drafts {drafts:?}");
            assert_eq!(from_argmax, from_logits, "history");
        }
    }

    /// Chi-square goodness of fit: the first emitted token of speculative sampling (draft from q,
    /// verify against p) is distributed as p, for a q far from p, with top-k and temperature applied.
    #[test]
    fn speculative_sampling_preserves_the_target_distribution() {
        let target_logits: Vec<f32> = vec![1.0, 0.2, -0.5, 2.0, 0.0, -3.0, 0.7];
        let draft_logits: Vec<f32> = vec![-1.0, 2.0, 1.5, 0.0, 0.3, 1.0, -2.0];
        let params = SamplingParams {
            temperature: 0.8,
            top_k: 5,
            ..Default::default()
        };
        let history = PenaltyHistory::default();
        let p = processed_distribution(&target_logits, &params, &history);
        let q = processed_distribution(&draft_logits, &params, &history);
        let mut rng = Rng::new(1234);
        let trials = 200_000;
        let mut counts = vec![0usize; target_logits.len()];
        for _ in 0..trials {
            let draft = draw(&q, &mut rng);
            let v = verify(
                &[&target_logits, &target_logits],
                &[draft],
                std::slice::from_ref(&q),
                &params,
                &mut history.clone(),
                &mut rng,
            );
            counts[v.emitted[0] as usize] += 1;
        }
        let mut chi2 = 0.0;
        for &(token, prob) in &p {
            let expected = prob as f64 * trials as f64;
            let seen = counts[token as usize] as f64;
            chi2 += (seen - expected).powi(2) / expected;
        }
        let outside: usize = (0..target_logits.len() as u32)
            .filter(|t| probability(&p, *t) == 0.0)
            .map(|t| counts[t as usize])
            .sum();
        assert_eq!(outside, 0, "tokens outside the target's top-k were emitted");
        // 4 degrees of freedom (5 tokens survive top-k); 18.47 is the 0.001 critical value.
        println!("chi-square {chi2:.2} over {} outcomes", p.len());
        assert!(
            chi2 < 18.47,
            "chi-square {chi2} says the distribution differs from p; counts {counts:?}"
        );
    }
}
