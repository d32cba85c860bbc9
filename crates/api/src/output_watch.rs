//! Watches one choice's output for degeneration (docs/serving.md, "Degeneration detector"): feeds
//! the streaming detector every token id with its text delta, samples the speculative counters
//! along the way, and turns a verdict into a report with its diagnosis, as a response field and a
//! log line. Stopping the request is the caller's business (generation.rs); counting it belongs to
//! the metrics.

use deltaserve_engine::{EngineHandle, RequestId};
use deltaserve_health::{DegenerationDetector, StreamEnd, Verdict};
use serde_json::{json, Value};

use crate::diagnosis::{diagnose, Acceptance, Diagnosis, SpecObservation};
use crate::spec_counters::SpecTimeline;

/// What the server does when a choice's output degenerates (`--degeneration-action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DegenerationAction {
    /// Count, log and report the degeneration; let the request run on.
    #[default]
    Log,
    /// Count, log and report it, and end the request at once.
    Stop,
}

impl DegenerationAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Log => "log",
            Self::Stop => "stop",
        }
    }
}

/// How one choice is watched.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    /// A fresh detector (cloned from the server's, whose configuration was validated once).
    pub detector: DegenerationDetector,
    pub action: DegenerationAction,
    /// The prompt ends inside an open `<think>` block: the output starts in reasoning.
    pub starts_in_reasoning: bool,
}

/// A degenerate output: the detector's verdict, its diagnosis, and what the server did.
#[derive(Debug, Clone, PartialEq)]
pub struct DegenerationReport {
    pub verdict: Verdict,
    pub diagnosis: Diagnosis,
    pub action: DegenerationAction,
    /// The request was ended at the verdict (`--degeneration-action stop` and it fired mid-stream).
    pub stopped: bool,
    pub engine_request: RequestId,
}

impl DegenerationReport {
    /// The `degeneration` field of a choice (an extra field OpenAI clients ignore).
    pub fn to_json(&self) -> Value {
        let verdict = &self.verdict;
        let evidence = &verdict.evidence;
        json!({
            "kind": verdict.kind.as_str(),
            "rule": verdict.rule,
            "signal": verdict.signal,
            "period_tokens": evidence.period_tokens,
            "period_chars": evidence.period_chars,
            "repeats": evidence.repeats,
            "span": evidence.span,
            "began_at_token": evidence.start_token,
            "detected_at_token": verdict.detected_at_token,
            "action": self.action.as_str(),
            "stopped": self.stopped,
            "draft_acceptance": self.diagnosis.draft_acceptance,
            "cause": self.diagnosis.cause.as_str(),
            "diagnosis": self.diagnosis.text,
        })
    }

    /// One warning line for the server log.
    pub fn log_line(&self, response_id: &str, choice: usize) -> String {
        let action = if self.stopped {
            format!(
                "stopped the request at token {}",
                self.verdict.detected_at_token
            )
        } else {
            "logged only".to_string()
        };
        format!(
            "WARNING degenerate output in {response_id} choice {choice} (engine request {}): {}; DIAGNOSIS \
             ({}): {}; action: {action}",
            self.engine_request,
            self.verdict,
            self.diagnosis.cause.as_str(),
            self.diagnosis.text
        )
    }
}

/// The degeneration watch of one running choice.
#[derive(Debug)]
pub struct OutputWatch {
    detector: DegenerationDetector,
    action: DegenerationAction,
    timeline: SpecTimeline,
    engine_request: RequestId,
    stopped: bool,
}

impl OutputWatch {
    pub fn new(spec: WatchSpec, engine: &dyn EngineHandle, engine_request: RequestId) -> Self {
        let mut detector = spec.detector;
        detector.reset();
        if spec.starts_in_reasoning {
            detector.start_reasoning();
        }
        Self {
            detector,
            action: spec.action,
            timeline: SpecTimeline::start(engine),
            engine_request,
            stopped: false,
        }
    }

    /// Reads one generated token (its id and the text it added). Returns true when a verdict fired on
    /// this token and the action is to stop the request.
    pub fn push(&mut self, engine: &dyn EngineHandle, id: u32, text: &str) -> bool {
        let fired = self.detector.push(id, text).is_some();
        self.timeline.on_token(engine, self.detector.tokens_seen());
        fired && self.action == DegenerationAction::Stop
    }

    /// The caller ended the request because of the verdict.
    pub fn mark_stopped(&mut self) {
        self.stopped = true;
    }

    /// Ends the watch: the verdict (one that fired during the stream, or the end-of-stream rule's)
    /// with its diagnosis. `request` is the request's own speculative counts, `None` when lost.
    pub fn finish(
        &mut self,
        engine: &dyn EngineHandle,
        end: StreamEnd,
        request: Option<Acceptance>,
    ) -> Option<DegenerationReport> {
        let verdict = self.detector.finish(end)?.clone();
        let observation = SpecObservation {
            request,
            server_halves: self.timeline.halves(engine, self.detector.tokens_seen()),
        };
        Some(DegenerationReport {
            diagnosis: diagnose(verdict.kind, &observation),
            verdict,
            action: self.action,
            stopped: self.stopped,
            engine_request: self.engine_request,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltaserve_engine::{
        EngineStats, EventReceiver, GenerationRequest, RequestId, SubmitError,
    };
    use deltaserve_health::{Config, DegenerationKind};

    /// An engine that exports no metrics (so no server-wide halves).
    struct NoMetrics;

    impl EngineHandle for NoMetrics {
        fn submit(&self, _: GenerationRequest) -> Result<(RequestId, EventReceiver), SubmitError> {
            Err(SubmitError::Stopped)
        }
        fn abort(&self, _: RequestId) {}
        fn stats(&self) -> EngineStats {
            EngineStats::default()
        }
        fn context_length(&self) -> usize {
            0
        }
        fn vocab_size(&self) -> usize {
            0
        }
    }

    /// Feeds "5" tokens until the detector fires; returns the watch and the token it fired on.
    fn looping_watch(action: DegenerationAction) -> (OutputWatch, Option<usize>) {
        let engine = NoMetrics;
        let spec = WatchSpec {
            detector: DegenerationDetector::new(Config::default()).unwrap(),
            action,
            starts_in_reasoning: false,
        };
        let mut watch = OutputWatch::new(spec, &engine, 7);
        let mut fired = None;
        for i in 0..600 {
            let text = if i < 5 { "Answer: " } else { "5" };
            if watch.push(&engine, i as u32 % 3 + 10, text) && fired.is_none() {
                fired = Some(i);
            }
        }
        (watch, fired)
    }

    #[test]
    fn stop_is_asked_for_once_and_the_report_reads_the_request_counts() {
        let (_, fired) = looping_watch(DegenerationAction::Log);
        assert_eq!(fired, None, "`log` never asks to stop");
        let (mut watch, fired) = looping_watch(DegenerationAction::Stop);
        assert!(fired.is_some_and(|i| i < 600));
        watch.mark_stopped();
        let engine = NoMetrics;
        let report = watch
            .finish(&engine, StreamEnd::Stop, Some(Acceptance::new(171, 144)))
            .expect("a verdict");
        assert_eq!(report.verdict.kind, DegenerationKind::PeriodicLoop);
        assert!(report.stopped);
        let json = report.to_json();
        assert_eq!(json["kind"], "periodic_loop");
        assert_eq!(json["cause"], "target_forward");
        assert_eq!(json["action"], "stop");
        assert_eq!(json["stopped"], true);
        let line = report.log_line("chatcmpl-abc", 2);
        assert!(line.starts_with("WARNING degenerate output in chatcmpl-abc choice 2 (engine request 7): periodic_loop"), "{line}");
        assert!(line.contains("DIAGNOSIS (target_forward)"), "{line}");
        assert!(line.contains("stopped the request at token"), "{line}");
        assert!(!line.contains('\n'), "one line: {line}");
    }
}
