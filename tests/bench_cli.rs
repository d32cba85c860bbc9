//! `deltaserve bench` as a user runs it, on the bundled demo model and the cpu backend: the
//! speculative (MTP) mode commits k+1 tokens per step and reports positive throughputs, a model
//! without an MTP head is refused naming the flag, an FP8 draft model reads fewer bytes a draft,
//! `--profile` says the backend cannot profile, the kernel level forced with
//! `DELTASERVE_CPU_LEVEL` is the one reported, and sampled decode (`--temperature`) is reported and
//! its bad flags refused.

use serde_json::Value;
use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_deltaserve");

fn bench(extra: &[&str]) -> std::process::Output {
    bench_command(extra).output().unwrap()
}

/// A successful `bench --json` run's report.
fn bench_json(extra: &[&str]) -> Value {
    let out = bench(&[extra, &["--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn bench_command(extra: &[&str]) -> Command {
    let mut command = Command::new(BINARY);
    command
        .args(["bench", "--model-path", "demo", "--prefill-len", "16"])
        .args(["--decode-len", "4", "--warmup", "0", "--threads", "1"])
        .args(extra)
        .env_remove("DELTASERVE_CPU_LEVEL");
    command
}

#[test]
fn the_forced_cpu_kernel_level_is_reported_and_an_unknown_one_refused() {
    let out = bench_command(&["--backend", "cpu", "--json"])
        .env("DELTASERVE_CPU_LEVEL", "scalar")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["cpu_kernels"], "scalar", "{report}");

    let out = bench_command(&["--backend", "cpu", "--json"])
        .env("DELTASERVE_CPU_LEVEL", "avx3")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("DELTASERVE_CPU_LEVEL") && stderr.contains("scalar, avx2, avx512"),
        "{stderr}"
    );
}

fn positive(v: &Value, key: &str) -> f64 {
    let x = v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"));
    assert!(x.is_finite() && x > 0.0, "{key} = {x} in {v}");
    x
}

#[test]
fn speculative_bench_commits_k_plus_one_tokens_per_step() {
    let report = bench_json(&["--speculative-num-steps", "2", "--profile"]);
    positive(&report, "prefill_tokens_per_s");
    positive(&report, "decode_tokens_per_s");
    let spec = &report["speculative"];
    assert_eq!(spec["num_steps"], 2);
    assert_eq!(spec["tokens_per_step"], 3);
    assert_eq!(spec["steps"], 4);
    assert_eq!(spec["forced_acceptance"], true);
    positive(spec, "decode_tokens_per_s");
    let step = positive(spec, "step_ms_median");
    let verify = positive(spec, "verify_ms_median");
    let draft = positive(spec, "draft_ms_median");
    assert!(verify < step && draft < step, "{spec}");
    // The MTP head's k forwards are counted on top of the trunk's one read of its weights.
    let trunk = report["decode_weight_bytes_per_token"].as_u64().unwrap();
    let mtp = spec["mtp_forward_weight_bytes"].as_u64().unwrap();
    assert_eq!(
        spec["weight_bytes_per_step"].as_u64(),
        Some(trunk + 2 * mtp)
    );
    // The cpu backend cannot time ops: said, not faked.
    assert_eq!(report["profile_supported"], false);
    assert!(report["profile"].is_null());
}

/// `--speculative-draft-model-quantization fp8`: the MTP head's layer and its own output head are
/// FP8 (the cpu backend keeps the codes), so one MTP forward reads fewer bytes; the trunk's do not
/// change. A model without an MTP head refuses the flag, naming it.
#[test]
fn an_fp8_draft_model_reads_fewer_bytes_per_draft() {
    let mtp_bytes = |extra: &[&str]| {
        let report = bench_json(&[&["--speculative-num-steps", "2"], extra].concat());
        let trunk = report["decode_weight_bytes_per_token"].as_u64().unwrap();
        let mtp = report["speculative"]["mtp_forward_weight_bytes"]
            .as_u64()
            .unwrap();
        (trunk, mtp, report["draft_model_quantization"].clone())
    };
    let (trunk, bf16_mtp, bf16_named) = mtp_bytes(&[]);
    let (fp8_trunk, fp8_mtp, fp8_named) =
        mtp_bytes(&["--speculative-draft-model-quantization", "fp8"]);
    assert_eq!((bf16_named, fp8_named), (Value::Null, Value::from("fp8")));
    assert_eq!(trunk, fp8_trunk, "the trunk is not the draft model");
    assert!(
        fp8_mtp * 10 < bf16_mtp * 6,
        "an FP8 draft forward reads {fp8_mtp} bytes against {bf16_mtp} for bf16"
    );
    let out = Command::new(BINARY)
        .args(["bench", "--model-path"])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_next"))
        .args(["--speculative-draft-model-quantization", "fp8"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--speculative-draft-model-quantization") && stderr.contains("no MTP head"),
        "{stderr}"
    );
}

#[test]
fn plain_bench_has_no_speculative_section() {
    let report = bench_json(&[]);
    positive(&report, "decode_tokens_per_s");
    assert!(report["speculative"].is_null());
    assert!(report["profile_supported"].is_null());
}

#[test]
fn speculation_without_an_mtp_head_names_the_flag() {
    let dir = std::env::temp_dir().join(format!("bench-cli-no-mtp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/qwen3.5-0.8b/config.json"),
    )
    .unwrap();
    let config = config.replace(
        "\"mtp_num_hidden_layers\": 1",
        "\"mtp_num_hidden_layers\": 0",
    );
    assert!(config.contains("\"mtp_num_hidden_layers\": 0"));
    std::fs::write(dir.join("config.json"), config).unwrap();
    let out = Command::new(BINARY)
        .args(["bench", "--load-format", "dummy", "--model-path"])
        .arg(&dir)
        .args(["--speculative-num-steps", "3"])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--speculative-num-steps") && stderr.contains("no MTP head"),
        "{stderr}"
    );
}

/// `--temperature` (with `--top-k` / `--top-p`) samples the plain and batched decode steps' tokens
/// and the JSON says with what; speculative steps (greedy, forced acceptance) refuse it, and the
/// filters refuse to run without a temperature, each naming the flags.
#[test]
fn sampled_decode_is_reported_and_bad_sampling_flags_are_refused() {
    let flags = ["--temperature", "0.8", "--top-k", "20", "--top-p", "0.95"];
    let report = bench_json(&[&flags[..], &["--batch", "2"]].concat());
    positive(&report, "decode_tokens_per_s");
    let sampling = &report["decode_sampling"];
    assert_eq!(sampling["top_k"], 20, "{report}");
    assert!((sampling["temperature"].as_f64().unwrap() - 0.8).abs() < 1e-6);
    assert!((sampling["top_p"].as_f64().unwrap() - 0.95).abs() < 1e-6);
    let greedy = bench_json(&[]);
    assert_eq!(greedy["decode_sampling"], Value::Null);

    for (extra, named) in [
        (
            &["--temperature", "0.8", "--speculative-num-steps", "2"][..],
            ["--temperature", "--speculative-num-steps"],
        ),
        (&["--top-k", "5"][..], ["--top-k", "--temperature"]),
        (&["--temperature=-1"][..], ["--temperature", ">= 0"]),
        (
            &["--temperature", "1", "--top-p", "0"][..],
            ["--top-p", "(0, 1]"],
        ),
    ] {
        let out = bench(extra);
        assert!(!out.status.success(), "{extra:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            named.iter().all(|n| stderr.contains(n)),
            "{extra:?}: {stderr}"
        );
    }
}
