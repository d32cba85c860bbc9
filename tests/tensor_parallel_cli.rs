//! `--tp-size N` as a user runs it on the cpu backend (N in-process ranks): `score --logits-out`
//! with `--tp-size 2` equals `--tp-size 1` on every fixture (dense, MoE, Qwen3-Next fused layout,
//! tied head, value/key head ratios 2 and 3) but the block-FP8 ones, whose two-way split cuts a
//! 128 x 128 block and is refused naming the tensor, and with 2 and 4 on a shape that divides 4 ways
//! (`--load-format dummy`); `generate` on the demo model gives the same greedy tokens; `bench`
//! reports its `tp_size`; `doctor --tp-size 2` passes; a split that does not divide is refused
//! naming the config field.

use deltaserve_model::config::ModelConfig;
use deltaserve_model::npy;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_deltaserve");
/// Derived in crates/model/tests/tensor_parallel.rs: the split only changes where f32 sums are
/// cut; measured at most 2.4e-4 on the fixtures' logits.
const TP_TOLERANCE: f32 = 1e-3;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// `deltaserve ARGS` at the machine's own cpu level.
fn output(args: &[&str]) -> std::process::Output {
    Command::new(BINARY)
        .args(args)
        .env_remove("DELTASERVE_CPU_LEVEL")
        .output()
        .unwrap()
}

fn run(args: &[&str]) -> std::process::Output {
    let out = output(args);
    assert!(
        out.status.success(),
        "deltaserve {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `deltaserve ARGS` expected to fail; its stderr.
fn run_refused(args: &[&str]) -> String {
    let out = output(args);
    assert!(!out.status.success(), "deltaserve {} ran", args.join(" "));
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// `score --logits-out` of `tokens` with `--tp-size tp`; the logits, read back.
fn score_logits(model: &Path, extra: &[&str], tokens: &Path, tp: usize, tag: &str) -> Vec<f32> {
    let out_file =
        std::env::temp_dir().join(format!("tp-cli-{}-{tag}-{tp}.npy", std::process::id()));
    let tp = tp.to_string();
    let mut args = vec![
        "score",
        "--model-path",
        model.to_str().unwrap(),
        "--backend",
        "cpu",
        "--threads",
        "2",
        "--tokens",
        tokens.to_str().unwrap(),
        "--logits-out",
        out_file.to_str().unwrap(),
        "--tp-size",
        &tp,
    ];
    args.extend_from_slice(extra);
    run(&args);
    let (_, logits) = npy::read_f32(&out_file).unwrap();
    let _ = std::fs::remove_file(&out_file);
    logits
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn score_logits_split_equal_whole_on_every_fixture() {
    let fixtures = root().join("tests/fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected.json").is_file() && p.join("config.json").is_file())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 6);
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        let tokens =
            std::env::temp_dir().join(format!("tp-cli-{}-{name}.json", std::process::id()));
        std::fs::write(&tokens, expected["prefill_ids"].to_string()).unwrap();
        if ModelConfig::from_dir(&dir).unwrap().quantization.is_some() {
            // The block-FP8 fixtures' matrices lie inside one 128 x 128 block each: a two-way
            // split cuts it, and the command must say so instead of running dequantized.
            let stderr = run_refused(&[
                "score",
                "--model-path",
                dir.to_str().unwrap(),
                "--backend",
                "cpu",
                "--tokens",
                tokens.to_str().unwrap(),
                "--tp-size",
                "2",
            ]);
            assert!(
                stderr.contains("--tp-size 2")
                    && stderr.contains("cuts its [128, 128] scale blocks"),
                "{name}: {stderr}"
            );
            let _ = std::fs::remove_file(&tokens);
            continue;
        }
        let whole = score_logits(&dir, &[], &tokens, 1, &name);
        let split = score_logits(&dir, &[], &tokens, 2, &name);
        let diff = max_abs_diff(&whole, &split);
        println!("{name}: score --tp-size 2 vs 1: max |diff| = {diff:.2e}");
        assert!(diff <= TP_TOLERANCE, "{name}: {diff}");
        let _ = std::fs::remove_file(&tokens);
    }
}

#[test]
fn score_logits_split_two_and_four_ways_on_dummy_weights() {
    let dir = std::env::temp_dir().join(format!("tp-cli-four-way-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{
        "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
            "linear_num_key_heads": 4, "linear_num_value_heads": 12,
            "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48, "full_attention_interval": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.25},
            "mtp_num_hidden_layers": 1, "tie_word_embeddings": false,
            "eos_token_id": 0, "dtype": "bfloat16"
        }
    }"#,
    )
    .unwrap();
    let tokens = dir.join("tokens.json");
    let ids: Vec<u32> = (0..70u32).map(|i| (i * 97 + 13) % 512).collect();
    std::fs::write(&tokens, serde_json::to_string(&ids).unwrap()).unwrap();
    let dummy = ["--load-format", "dummy"];
    let whole = score_logits(&dir, &dummy, &tokens, 1, "four-way");
    for tp in [2, 4] {
        let split = score_logits(&dir, &dummy, &tokens, tp, "four-way");
        let diff = max_abs_diff(&whole, &split);
        println!("four-way shape (dummy bf16 weights): score --tp-size {tp} vs 1: max |diff| = {diff:.2e}");
        assert!(diff <= TP_TOLERANCE, "tp {tp}: {diff}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_generate_split_equals_whole_and_bad_splits_name_the_field() {
    let generate = |tp: &str| -> String {
        let out = run(&[
            "generate",
            "--backend",
            "cpu",
            "--threads",
            "2",
            "--prompt",
            "Compute 47 + 38.",
            "--max-tokens",
            "24",
            "--tp-size",
            tp,
        ]);
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let whole = generate("1");
    assert!(!whole.trim().is_empty());
    assert_eq!(generate("2"), whole);

    let tokens = std::env::temp_dir().join(format!("tp-cli-{}-three.json", std::process::id()));
    std::fs::write(&tokens, "[1, 2, 3]").unwrap();
    let stderr = run_refused(&[
        "score",
        "--backend",
        "cpu",
        "--tp-size",
        "4",
        "--tokens",
        tokens.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&tokens);
    assert!(
        stderr.contains("--tp-size 4") && stderr.contains("`linear_num_key_heads`"),
        "{stderr}"
    );
}

#[test]
fn bench_reports_its_tp_size() {
    let out = run(&[
        "bench",
        "--backend",
        "cpu",
        "--threads",
        "2",
        "--prefill-len",
        "16",
        "--decode-len",
        "4",
        "--warmup",
        "0",
        "--json",
        "--tp-size",
        "2",
    ]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["tp_size"], 2, "{report}");
    assert!(report["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn doctor_passes_on_the_demo_split_two_ways() {
    // Ops on rank 0's share of the weights, layers, logits and the canary through both ranks.
    let out = run(&[
        "doctor",
        "--backend",
        "cpu",
        "--threads",
        "2",
        "--tp-size",
        "2",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("checks passed"), "{stdout}");
    assert!(stdout.contains("verdict: ok"), "{stdout}");
}
