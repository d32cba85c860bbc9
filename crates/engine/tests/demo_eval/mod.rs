//! The demo model's held-out evaluation through the engine, on any backend: the prompts and
//! transformers' greedy replies of tests/data/demo, the engine run, and the task scores of
//! scripts/eval_demo_model.py (arithmetic, primality, generated is_prime functions run by python3,
//! well-formed tool calls). Shared by crates/engine/tests/demo_model.rs (cpu),
//! crates/cuda/tests/demo_fp8.rs and crates/cuda/tests/demo_heldout.rs (its engine settings); each
//! test binary uses part of it.
#![allow(dead_code)]

use deltaserve_engine::*;
use deltaserve_model::config::ModelConfig;
use deltaserve_model::draft_fp8::DraftFp8Source;
use deltaserve_model::draft_vocab::limit_draft_head;
use deltaserve_model::online_fp8::Fp8QuantizingSource;
use deltaserve_model::quantization::Fp8Quantization;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::source::TensorSource;
use deltaserve_model::weights::Weights;
use deltaserve_model::Model;
use deltaserve_tensor::Backend;
use deltaserve_text::{parse_tool_calls, Tokenizer, ToolSchemas};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Which weights of the demo model to run.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Weighting {
    /// The bf16 checkpoint as stored.
    Bf16,
    /// `--quantization fp8`: linear weights quantized to 128 x 128 block FP8 at load.
    Fp8,
    /// `--speculative-draft-model-quantization fp8`: the bf16 trunk, the MTP head's layer and an
    /// output head of its own in block FP8.
    DraftFp8,
}

/// The demo model on `backend`, its weights as `weighting` says.
pub fn load<B: Backend>(backend: B, weighting: Weighting) -> Model<B> {
    let dir = root().join("models/demo");
    let config = ModelConfig::from_dir(&dir).unwrap();
    let stored = SafetensorsSource::open(&dir).unwrap();
    let source: Box<dyn TensorSource> = match weighting {
        Weighting::Bf16 => Box::new(stored),
        Weighting::Fp8 => Box::new(Fp8QuantizingSource::new(
            Box::new(stored),
            Fp8Quantization::qwen_default(),
        )),
        Weighting::DraftFp8 => Box::new(DraftFp8Source::new(
            Box::new(stored),
            Fp8Quantization::qwen_default(),
            config.tie_word_embeddings,
        )),
    };
    let weights = Weights::load(&backend, &config, source.as_ref(), true, &mut |_, _| {}).unwrap();
    Model::new(config, backend, weights)
}

/// The demo model (bf16) with `--speculative-token-map`: a draft head of the listed ids' rows.
pub fn load_with_token_map<B: Backend>(backend: B, ids: Vec<u32>) -> Model<B> {
    let dir = root().join("models/demo");
    let mut config = ModelConfig::from_dir(&dir).unwrap();
    let stored = SafetensorsSource::open(&dir).unwrap();
    let source = limit_draft_head(&mut config, Box::new(stored), ids);
    let weights = Weights::load(&backend, &config, &source, true, &mut |_, _| {}).unwrap();
    Model::new(config, backend, weights)
}

/// (content after reasoning, reasoning closed), as scripts/eval_demo_model.py splits replies.
pub fn split_reply(text: &str, thinking: bool) -> (String, bool) {
    let text = text.replace("<|im_end|>", "").replace("<|endoftext|>", "");
    if !thinking {
        return (text.trim().to_string(), true);
    }
    match text.split_once("</think>") {
        Some((_, content)) => (content.trim().to_string(), true),
        None => (String::new(), false),
    }
}

pub fn last_integer(text: &str) -> Option<i64> {
    let mut last = None;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = if i > 0 && bytes[i - 1] == b'-' {
                i - 1
            } else {
                i
            };
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            last = text[start..i].parse().ok();
        } else {
            i += 1;
        }
    }
    last
}

pub const CODE_HARNESS: &str = r#"
import json, sys
source, name = json.loads(sys.stdin.read())
namespace = {}
exec(source, namespace)
f = namespace[name]
def is_prime(n):
    return n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1))
failed = [n for n in range(-3, 200) if f(n) != is_prime(n)]
sys.exit(1 if failed else 0)
"#;

/// Runs the reply's ```python block against is_prime test cases; `None` when python3 is missing.
pub fn is_prime_function_passes(content: &str, function: &str) -> Option<bool> {
    let code = content
        .split_once("```python\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(code, _)| code)?;
    let mut child = std::process::Command::new("python3")
        .args(["-c", CODE_HARNESS])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    use std::io::Write;
    child
        .stdin
        .take()?
        .write_all(serde_json::json!([code, function]).to_string().as_bytes())
        .ok()?;
    Some(child.wait().ok()?.success())
}

/// One well-formed call or more naming offered functions with their required parameters, nothing else.
pub fn tool_calls_well_formed(content: &str, tools: &Value) -> bool {
    let tools = tools.as_array().cloned().unwrap_or_default();
    let split = parse_tool_calls(content, &ToolSchemas::from_tools(&tools), "call_");
    let offered: HashMap<&str, &Value> = tools
        .iter()
        .filter_map(|t| {
            Some((
                t["function"]["name"].as_str()?,
                &t["function"]["parameters"],
            ))
        })
        .collect();
    !split.calls.is_empty()
        && split.content.is_none()
        && split.calls.iter().all(|call| {
            let Some(schema) = offered.get(call.name.as_str()) else {
                return false;
            };
            let args: Value = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
            schema["required"].as_array().is_some_and(|req| {
                req.iter()
                    .all(|r| r.as_str().is_some_and(|k| args.get(k).is_some()))
            })
        })
}

/// Greedy replies of `model` through the engine to every held-out prompt (transformers' greedy
/// records, their replies and our tokens), with the usage summed over the requests.
pub fn run<B: Backend + 'static>(
    model: Model<B>,
    speculative: Option<SpecConfig>,
) -> (Vec<Value>, Vec<Vec<u32>>, Usage) {
    let greedy = jsonl(&root().join("tests/data/demo/hf_greedy.jsonl"));
    let engine = LocalEngine::spawn(model, engine_config(speculative));
    let receivers: Vec<_> = greedy
        .iter()
        .map(|g| {
            let request = GenerationRequest {
                prompt_ids: ids(&g["prompt_ids"]),
                sampling: SamplingParams::default(),
                max_new_tokens: ids(&g["reply_ids"]).len() + 8,
                stop_token_ids: vec![0, 2],
                disable_speculation: false,
            };
            engine.submit(request).unwrap().1
        })
        .collect();
    let mut total = Usage::default();
    let replies = receivers
        .into_iter()
        .map(|mut rx| read_reply(&mut rx, &mut total).unwrap_or_else(|message| panic!("{message}")))
        .collect();
    (greedy, replies, total)
}

/// A request's tokens, read to its end, its draft counts added to `total`; an error event's
/// message as the error.
pub fn read_reply(rx: &mut EventReceiver, total: &mut Usage) -> Result<Vec<u32>, String> {
    let mut tokens = Vec::new();
    while let Some(event) = rx.blocking_recv() {
        match event {
            EngineEvent::Token { id, .. } => tokens.push(id),
            EngineEvent::Finished { usage, .. } => {
                total.draft_tokens += usage.draft_tokens;
                total.accepted_draft_tokens += usage.accepted_draft_tokens;
            }
            EngineEvent::Error { message } => return Err(message),
        }
    }
    Ok(tokens)
}

/// Prefill chunk of the engine runs (`chunked_prefill_size`).
pub const CHUNK: usize = 512;
pub const BLOCK_SIZE: usize = 16;
/// Most requests in flight.
pub const MAX_RUNNING: usize = 48;
/// Draft steps of the MTP runs.
pub const MTP_STEPS: usize = 3;

/// The engine the demo runs use: every held-out prompt in flight 48 at a time, 512 tokens of KV
/// each, state slots for MTP k=3.
pub fn engine_config(speculative: Option<SpecConfig>) -> EngineConfig {
    EngineConfig {
        max_running_requests: MAX_RUNNING,
        num_kv_blocks: MAX_RUNNING * 512 / BLOCK_SIZE,
        block_size: BLOCK_SIZE,
        state_slots: MAX_RUNNING * (MTP_STEPS + 2),
        chunked_prefill_size: CHUNK,
        context_length: 1024,
        max_queued_requests: 1024,
        decode_log_interval: 0,
        speculative,
    }
}

pub fn mtp_k3() -> SpecConfig {
    SpecConfig {
        num_steps: MTP_STEPS,
        disable_batch_size: None,
        fault: DraftFault::None,
    }
}

/// Held-out task scores of `replies`: group -> (correct, scored); also whether python3 was missing
/// (then the generated is_prime functions were not run) and the reasoning-closed count.
pub struct Scores {
    pub groups: HashMap<&'static str, (usize, usize)>,
    pub python_missing: bool,
    pub thinking: usize,
    pub closed: usize,
}

impl Scores {
    pub fn total(&self) -> (usize, usize) {
        self.groups
            .values()
            .fold((0, 0), |(ok, n), (a, b)| (ok + a, n + b))
    }
}

pub fn score(greedy: &[Value], replies: &[Vec<u32>]) -> Scores {
    let tokenizer = Tokenizer::from_dir(&root().join("models/demo")).unwrap();
    let heldout: HashMap<String, Value> = jsonl(&root().join("tests/data/demo/heldout.jsonl"))
        .into_iter()
        .map(|r| (r["id"].as_str().unwrap().to_string(), r))
        .collect();
    let mut tally: HashMap<&'static str, (usize, usize)> = HashMap::new();
    let (mut thinking, mut closed) = (0, 0);
    let mut python_missing = false;
    for (g, reply) in greedy.iter().zip(replies) {
        let Some(record) = heldout.get(g["id"].as_str().unwrap()) else {
            continue;
        };
        let think = record["thinking"].as_bool().unwrap();
        let text = tokenizer.decode(reply, false).unwrap();
        let (content, is_closed) = split_reply(&text, think);
        if think {
            thinking += 1;
            closed += usize::from(is_closed);
        }
        let expected = &record["expected"];
        let (group, ok) = match record["group"].as_str().unwrap() {
            "add2" => (
                "add2",
                last_integer(&content) == expected["answer"].as_i64(),
            ),
            "sub2" => (
                "sub2",
                last_integer(&content) == expected["answer"].as_i64(),
            ),
            "prime" => (
                "prime",
                expected["is_prime"].as_bool()
                    == if content.starts_with("Yes") {
                        Some(true)
                    } else if content.starts_with("No") {
                        Some(false)
                    } else {
                        None
                    },
            ),
            "code_is_prime" => {
                match is_prime_function_passes(&content, expected["function"].as_str().unwrap()) {
                    Some(ok) => ("code_is_prime", ok),
                    None => {
                        python_missing = true;
                        continue;
                    }
                }
            }
            "tool_call" => (
                "tool_call_wellformed",
                tool_calls_well_formed(&content, &record["tools"]),
            ),
            _ => continue,
        };
        let entry = tally.entry(group).or_default();
        entry.0 += usize::from(ok);
        entry.1 += 1;
    }
    Scores {
        groups: tally,
        python_missing,
        thinking,
        closed,
    }
}

/// Accept length of MTP k=3: 1 + 3 x (accepted / drafted).
pub fn accept_length(usage: &Usage) -> f64 {
    usage.accepted_draft_tokens as f64 / usage.draft_tokens as f64 * 3.0 + 1.0
}

/// Issue 14's proof on the demo model: the FP8 run's held-out accuracy within 2 points of the bf16
/// run's and its MTP k=3 accept length within 5 % (each run: its replies and usage; the bf16
/// replies plain or speculative, which are equal, the usage from an MTP k=3 run).
pub fn assert_fp8_keeps_accuracy_and_acceptance(
    greedy: &[Value],
    (plain, bf16_usage): (&[Vec<u32>], &Usage),
    (fp8, fp8_usage): (&[Vec<u32>], &Usage),
) {
    let changed = plain.iter().zip(fp8).filter(|(a, b)| a != b).count();
    let bf16_scores = score(greedy, plain);
    let fp8_scores = score(greedy, fp8);
    let mut groups: Vec<_> = bf16_scores.groups.keys().copied().collect();
    groups.sort();
    for group in groups {
        let (a, n) = bf16_scores.groups[group];
        let (b, m) = fp8_scores.groups.get(group).copied().unwrap_or_default();
        println!("{group}: bf16 {a}/{n}, fp8 {b}/{m}");
    }
    let ((a, n), (b, m)) = (bf16_scores.total(), fp8_scores.total());
    let (bf16_rate, fp8_rate) = (a as f64 / n as f64, b as f64 / m as f64);
    let (bf16_accept, fp8_accept) = (accept_length(bf16_usage), accept_length(fp8_usage));
    println!(
        "held-out accuracy: bf16 {a}/{n} = {bf16_rate:.4}, fp8 {b}/{m} = {fp8_rate:.4}; \
         replies changed by fp8: {changed} of {}; MTP k=3 accept length: bf16 {bf16_accept:.3}, fp8 {fp8_accept:.3}",
        plain.len()
    );
    assert_eq!(n, m, "both runs score the same prompts");
    assert!(
        fp8_rate >= bf16_rate - 0.02,
        "fp8 held-out accuracy {fp8_rate:.4} is more than 2 points below bf16 {bf16_rate:.4}"
    );
    assert!(
        (fp8_accept / bf16_accept - 1.0).abs() <= 0.05,
        "fp8 accept length {fp8_accept:.3} is more than 5 % from bf16 {bf16_accept:.3}"
    );
}
