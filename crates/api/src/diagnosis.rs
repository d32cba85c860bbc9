//! The DIAGNOSIS of a degenerate output: which part of the stack most likely produced it, read from the
//! speculative-decoding acceptance around it the way docs/serving.md, "Diagnosis", teaches. A pure
//! function of the verdict kind and the acceptance numbers; no engine, no I/O, no detection.

use deltaserve_health::DegenerationKind;
use serde::Serialize;

/// Draft acceptance rate (accepted / drafted, bonus tokens excluded) at or above which the drafter and
/// the target agree on what they produce.
pub const HIGH_ACCEPTANCE: f64 = 0.6;

/// After a first half at or above [`HIGH_ACCEPTANCE`], a second half at or below this rate (and at
/// most half the first) means acceptance collapsed during the request.
pub const COLLAPSED_ACCEPTANCE: f64 = 0.3;

/// Fewest drafted tokens a rate is read from; fewer say nothing about agreement.
pub const MIN_DRAFTS: u64 = 8;

/// Drafted and accepted draft tokens over some stretch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Acceptance {
    pub drafted: u64,
    pub accepted: u64,
}

impl Acceptance {
    pub fn new(drafted: u64, accepted: u64) -> Self {
        Self { drafted, accepted }
    }

    /// Accepted / drafted, when enough tokens were drafted to mean something.
    pub fn rate(self) -> Option<f64> {
        (self.drafted >= MIN_DRAFTS).then(|| self.accepted as f64 / self.drafted as f64)
    }

    /// The counts added since `earlier` (counters only grow; a reset reads as zero).
    pub fn since(self, earlier: Acceptance) -> Acceptance {
        Acceptance {
            drafted: self.drafted.saturating_sub(earlier.drafted),
            accepted: self.accepted.saturating_sub(earlier.accepted),
        }
    }

    pub fn plus(self, other: Acceptance) -> Acceptance {
        Acceptance {
            drafted: self.drafted + other.drafted,
            accepted: self.accepted + other.accepted,
        }
    }
}

/// What is known about speculative decoding around one degenerate output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpecObservation {
    /// The request's own counts from the engine's usage; `None` when the usage was lost (an abort
    /// not confirmed in time). Zero drafted means the request was not speculated.
    pub request: Option<Acceptance>,
    /// The engine's counters (all requests together) over the first and the second half of the
    /// request's output; `None` when the engine exports no speculative counters.
    pub server_halves: Option<(Acceptance, Acceptance)>,
}

/// The most likely origin of a degenerate output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A loop the drafter agrees with: the target forward pass computes it.
    TargetForward,
    /// Acceptance collapsed over the request: the recurrent state is being corrupted.
    RecurrentState,
    /// No agreement to read (no speculation, or low acceptance): the target forward pass or the
    /// model itself.
    TargetOrModel,
    /// Reasoning that never closed: a loop inside the reasoning, or a budget too small.
    ReasoningBudget,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TargetForward => "target_forward",
            Self::RecurrentState => "recurrent_state",
            Self::TargetOrModel => "target_or_model",
            Self::ReasoningBudget => "reasoning_budget",
        }
    }
}

/// A cause and the sentence an operator reads.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnosis {
    pub cause: Cause,
    /// The draft acceptance rate the diagnosis was read from, if any.
    pub draft_acceptance: Option<f64>,
    pub text: String,
}

const DOCTOR: &str =
    "run `deltaserve doctor` with the server's --model-path and --attention-backend to find \
                      the op that diverges from the reference";

fn loop_name(kind: DegenerationKind) -> &'static str {
    match kind {
        DegenerationKind::PeriodicLoop => "loop",
        DegenerationKind::NgramCollapse => "n-gram collapse",
        DegenerationKind::UnclosedReasoning => "unclosed reasoning",
    }
}

fn described(acceptance: Acceptance, source: &str) -> String {
    format!(
        "{:.2} ({}/{} drafts, {source})",
        acceptance.accepted as f64 / acceptance.drafted.max(1) as f64,
        acceptance.accepted,
        acceptance.drafted
    )
}

/// Reads the acceptance numbers around a degenerate output of `kind` (docs/serving.md,
/// "Diagnosis"):
/// - acceptance that fell from high in the first half of the request to low in the second: the
///   recurrent (GDN) state is being corrupted, typically by speculative rollback;
/// - acceptance near 100 % (at least [`HIGH_ACCEPTANCE`]) together with a loop: drafter and target
///   agree on the repetition, so the TARGET forward pass produces it; sampling will not fix it;
/// - low acceptance, or no speculation: the target forward pass or the model itself.
///
/// The request's own counts are preferred; the server-wide counters while it ran stand in when they
/// are missing.
pub fn diagnose(kind: DegenerationKind, spec: &SpecObservation) -> Diagnosis {
    let speculated = spec.request.is_none_or(|r| r.drafted > 0);
    let halves = spec.server_halves.filter(|_| speculated);
    if let Some((first, second)) = halves {
        if let (Some(early), Some(late)) = (first.rate(), second.rate()) {
            if early >= HIGH_ACCEPTANCE && late <= COLLAPSED_ACCEPTANCE && late <= early / 2.0 {
                return Diagnosis {
                    cause: Cause::RecurrentState,
                    draft_acceptance: Some(late),
                    text: format!(
                        "draft acceptance collapsed during the request, from {} in the first half of its \
                         output to {} in the second: the recurrent (GDN) state is likely being corrupted \
                         (speculative rollback restoring the wrong snapshot, or state written out of \
                         place), so drafter and target drift apart as the output degenerates; retry \
                         without --speculative-algorithm to confirm, and {DOCTOR}",
                        described(first, "server-wide"),
                        described(second, "server-wide"),
                    ),
                };
            }
        }
    }
    let observed = match (spec.request, halves) {
        (Some(request), _) if request.rate().is_some() => Some((request, "this request")),
        (None, Some((first, second))) if first.plus(second).rate().is_some() => {
            Some((first.plus(second), "server-wide while this request ran"))
        }
        _ => None,
    };
    let rate = observed.and_then(|(acceptance, _)| acceptance.rate());
    let name = loop_name(kind);
    let (cause, text) = match (kind, observed, rate) {
        (DegenerationKind::UnclosedReasoning, _, _) => {
            let agreement = match (observed, rate) {
                (Some((acceptance, source)), Some(r)) if r >= HIGH_ACCEPTANCE => format!(
                    "; draft acceptance {} says the drafter agrees with what the target writes, so look \
                     at the target forward pass, not the drafter",
                    described(acceptance, source)
                ),
                _ => String::new(),
            };
            (
                Cause::ReasoningBudget,
                format!(
                    "the output stayed inside its reasoning block past the budget without closing it: \
                     either the reasoning loops (a broken forward pass does this; {DOCTOR}) or the task \
                     needs a larger budget (raise max_tokens){agreement}"
                ),
            )
        }
        (_, Some((acceptance, source)), Some(r)) if r >= HIGH_ACCEPTANCE => (
            Cause::TargetForward,
            format!(
                "draft acceptance {} together with a {name}: the MTP drafter and the target agree on the \
                 repetition, so the TARGET forward pass produces it (not the drafter, whose tokens are \
                 only kept when the target computes them too, and not sampling: sampling parameters will \
                 not fix it); {DOCTOR}",
                described(acceptance, source)
            ),
        ),
        (_, Some((acceptance, source)), Some(_)) => (
            Cause::TargetOrModel,
            format!(
                "draft acceptance is low, {}: the drafter disagrees with the target, but only tokens the \
                 target computes are emitted, so the {name} comes from the target forward pass or from the \
                 model itself (a weak model or hot sampling loops too); {DOCTOR}; if doctor passes, look at \
                 the model and the sampling settings",
                described(acceptance, source)
            ),
        ),
        _ => (
            Cause::TargetOrModel,
            format!(
                "{}: the {name} comes from the target forward pass or from the model itself; {DOCTOR}; if \
                 doctor passes, look at the model and the sampling settings",
                if speculated {
                    "speculative decoding drafted too few tokens here to compare drafter and target"
                } else {
                    "no speculative decoding on this request, so there is no drafter to compare the target with"
                }
            ),
        ),
    };
    Diagnosis {
        cause,
        draft_acceptance: rate,
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOP: DegenerationKind = DegenerationKind::PeriodicLoop;

    fn request(drafted: u64, accepted: u64) -> SpecObservation {
        SpecObservation {
            request: Some(Acceptance::new(drafted, accepted)),
            server_halves: None,
        }
    }

    #[test]
    fn high_acceptance_with_a_loop_blames_the_target_forward_pass() {
        // The founding failure on the demo model: 144 of 171 drafts accepted while "5555..." loops.
        let d = diagnose(LOOP, &request(171, 144));
        assert_eq!(d.cause, Cause::TargetForward);
        assert!((d.draft_acceptance.unwrap() - 144.0 / 171.0).abs() < 1e-9);
        assert!(d.text.contains("TARGET forward pass"), "{}", d.text);
        assert!(d.text.contains("not the drafter"), "{}", d.text);
        assert!(
            d.text.contains("sampling parameters will not fix it"),
            "{}",
            d.text
        );
        assert!(d.text.contains("deltaserve doctor"), "{}", d.text);
        assert!(
            d.text.contains("0.84 (144/171 drafts, this request)"),
            "{}",
            d.text
        );
        // Exactly at the threshold counts as high; an n-gram collapse reads the same way.
        let d = diagnose(DegenerationKind::NgramCollapse, &request(10, 6));
        assert_eq!(d.cause, Cause::TargetForward);
        assert!(d.text.contains("n-gram collapse"), "{}", d.text);
    }

    #[test]
    fn low_acceptance_is_target_or_model_without_blaming_the_drafter() {
        let d = diagnose(LOOP, &request(501, 32));
        assert_eq!(d.cause, Cause::TargetOrModel);
        assert!(d.text.contains("draft acceptance is low"), "{}", d.text);
        assert!(
            !d.text.contains("TARGET forward pass produces"),
            "{}",
            d.text
        );
        assert!(d.text.contains("deltaserve doctor"), "{}", d.text);
    }

    #[test]
    fn no_speculation_says_target_or_model_and_suggests_doctor() {
        let d = diagnose(LOOP, &request(0, 0));
        assert_eq!(d.cause, Cause::TargetOrModel);
        assert_eq!(d.draft_acceptance, None);
        assert!(d.text.contains("no speculative decoding"), "{}", d.text);
        assert!(d.text.contains("deltaserve doctor"), "{}", d.text);
        // Server-wide halves are ignored when this request was not speculated.
        let observation = SpecObservation {
            request: Some(Acceptance::new(0, 0)),
            server_halves: Some((Acceptance::new(100, 95), Acceptance::new(100, 5))),
        };
        assert_eq!(diagnose(LOOP, &observation).cause, Cause::TargetOrModel);
        // Too few drafts to read a rate from.
        let d = diagnose(LOOP, &request(3, 3));
        assert_eq!(d.cause, Cause::TargetOrModel);
        assert!(d.text.contains("too few tokens"), "{}", d.text);
    }

    #[test]
    fn acceptance_that_collapses_over_the_request_is_recurrent_state_corruption() {
        let observation = SpecObservation {
            request: Some(Acceptance::new(200, 110)),
            server_halves: Some((Acceptance::new(100, 92), Acceptance::new(100, 18))),
        };
        let d = diagnose(LOOP, &observation);
        assert_eq!(d.cause, Cause::RecurrentState);
        assert!(d.text.contains("recurrent (GDN) state"), "{}", d.text);
        assert!(d.text.contains("rollback"), "{}", d.text);
        assert!(d.text.contains("0.92 (92/100 drafts"), "{}", d.text);
        assert!(d.text.contains("0.18 (18/100 drafts"), "{}", d.text);
        // A drop that stays high, or a start that was never high, is not a collapse.
        for (first, second) in [((100, 95), (100, 70)), ((100, 40), (100, 5))] {
            let observation = SpecObservation {
                request: Some(Acceptance::new(200, first.1 + second.1)),
                server_halves: Some((
                    Acceptance::new(first.0, first.1),
                    Acceptance::new(second.0, second.1),
                )),
            };
            assert_ne!(diagnose(LOOP, &observation).cause, Cause::RecurrentState);
        }
        // A half with too few drafts says nothing.
        let observation = SpecObservation {
            request: Some(Acceptance::new(104, 96)),
            server_halves: Some((Acceptance::new(100, 95), Acceptance::new(4, 0))),
        };
        assert_eq!(diagnose(LOOP, &observation).cause, Cause::TargetForward);
    }

    #[test]
    fn the_server_window_stands_in_when_the_request_usage_was_lost() {
        let observation = SpecObservation {
            request: None,
            server_halves: Some((Acceptance::new(60, 55), Acceptance::new(60, 50))),
        };
        let d = diagnose(LOOP, &observation);
        assert_eq!(d.cause, Cause::TargetForward);
        assert!(
            d.text.contains("server-wide while this request ran"),
            "{}",
            d.text
        );
        let nothing = SpecObservation::default();
        assert_eq!(diagnose(LOOP, &nothing).cause, Cause::TargetOrModel);
    }

    #[test]
    fn unclosed_reasoning_points_at_the_budget_or_a_loop() {
        let d = diagnose(DegenerationKind::UnclosedReasoning, &request(300, 290));
        assert_eq!(d.cause, Cause::ReasoningBudget);
        assert!(d.text.contains("budget"), "{}", d.text);
        assert!(d.text.contains("not the drafter"), "{}", d.text);
        let d = diagnose(DegenerationKind::UnclosedReasoning, &request(0, 0));
        assert_eq!(d.cause, Cause::ReasoningBudget);
        assert!(!d.text.contains("drafter"), "{}", d.text);
    }
}
