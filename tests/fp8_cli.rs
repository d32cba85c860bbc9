//! Block-FP8 checkpoints from the command line, as a user runs them: `score` and `generate` on the
//! FP8 fixtures (tests/fixtures/qwen35_fp8, qwen3_next_fp8, made by scripts/make_fp8_fixture.py)
//! reproduce transformers' logits and greedy tokens on the reference and cpu backends; a bad
//! `quantization_config` or a scale of the wrong shape stops the command with a message naming the
//! file and the field or tensor; `--quantization fp8` quantizes a bf16 checkpoint at load.

use deltaserve_model::npy;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BINARY: &str = env!("CARGO_BIN_EXE_deltaserve");
/// The FP8 fixtures' expected logits come from transformers on the exactly dequantized weights
/// and deltaserve dequantizes exactly (the same single f32 rounding of code x scale), so only f32
/// compute noise is left: the golden tests' bound (crates/model/tests/golden.rs) applies; measured
/// at most 3.3e-4 on these fixtures (logit std 3).
const LOGIT_TOLERANCE: f32 = 2e-3;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn deltaserve(args: &[&str]) -> Output {
    Command::new(BINARY)
        .args(args)
        .env_remove("DELTASERVE_CPU_LEVEL")
        .output()
        .unwrap()
}

fn succeed(args: &[&str]) -> Output {
    let out = deltaserve(args);
    assert!(
        out.status.success(),
        "deltaserve {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A fresh directory under the system temp dir, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("fp8-cli-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn expected(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `score --logits-out` of the fixture's prefill ids; the logits, read back.
fn score_logits(model: &Path, backend: &str, extra: &[&str], tag: &str) -> Vec<f32> {
    let scratch = Scratch::new();
    let tokens = scratch.path().join("tokens.json");
    std::fs::write(&tokens, expected(model)["prefill_ids"].to_string()).unwrap();
    let logits = scratch.path().join(format!("{tag}.npy"));
    let mut args = vec![
        "score",
        "--model-path",
        model.to_str().unwrap(),
        "--backend",
        backend,
        "--threads",
        "2",
        "--tokens",
        tokens.to_str().unwrap(),
        "--logits-out",
        logits.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    succeed(&args);
    npy::read_f32(&logits).unwrap().1
}

#[test]
fn score_and_generate_on_fp8_checkpoints_match_transformers() {
    for name in ["qwen35_fp8", "qwen3_next_fp8"] {
        let dir = fixture(name);
        let (_, theirs) = npy::read_f32(&dir.join("prefill_logits.npy")).unwrap();
        for backend in ["reference", "cpu"] {
            let ours = score_logits(&dir, backend, &[], name);
            let diff = max_abs_diff(&ours, &theirs);
            println!("{name} on {backend}: score logits vs transformers: max |diff| = {diff:.2e}");
            assert!(diff <= LOGIT_TOLERANCE, "{name} on {backend}: {diff}");
        }

        let expected = expected(&dir);
        let ids = |key: &str| -> Vec<String> {
            expected[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.to_string())
                .collect()
        };
        let prompt = ids("greedy_prompt_ids").join(",");
        let want = ids("greedy_tokens");
        let max_tokens = want.len().to_string();
        let out = succeed(&[
            "generate",
            "--model-path",
            dir.to_str().unwrap(),
            "--backend",
            "cpu",
            "--threads",
            "2",
            "--prompt-ids",
            &prompt,
            "--max-tokens",
            &max_tokens,
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            stdout.trim(),
            want.join(","),
            "{name}: greedy tokens differ from transformers'"
        );
    }
}

/// A copy of the qwen35_fp8 fixture in a temporary directory, with `edit` applied to config.json
/// and `patch_header` to the safetensors header text (which must keep its length).
fn broken_copy(edit: impl Fn(&mut Value), patch_header: impl Fn(&str) -> String) -> Scratch {
    let src = fixture("qwen35_fp8");
    let dir = Scratch::new();
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let mut file = std::fs::read(src.join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(file[8..8 + header_len].to_vec()).unwrap();
    let patched = patch_header(&header);
    assert_eq!(
        patched.len(),
        header.len(),
        "the patch must keep the header length"
    );
    file[8..8 + header_len].copy_from_slice(patched.as_bytes());
    std::fs::write(dir.path().join("model.safetensors"), file).unwrap();
    dir
}

fn refused(dir: &Path, needles: &[&str]) {
    let scratch = Scratch::new();
    let tokens = scratch.path().join("tokens.json");
    std::fs::write(&tokens, "[1, 2, 3]").unwrap();
    let out = deltaserve(&[
        "score",
        "--model-path",
        dir.to_str().unwrap(),
        "--backend",
        "cpu",
        "--threads",
        "2",
        "--tokens",
        tokens.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "expected {needle:?} in:\n{stderr}");
    }
}

#[test]
fn unsupported_fp8_variants_are_refused_naming_the_file_and_field() {
    let same = |h: &str| h.to_string();
    let dir = broken_copy(|c| c["quantization_config"]["fmt"] = "e5m2".into(), same);
    refused(
        dir.path(),
        &["config.json", "quantization_config.fmt", "`e5m2`"],
    );
    let dir = broken_copy(
        |c| c["quantization_config"]["weight_block_size"] = serde_json::json!([64, 64]),
        same,
    );
    refused(
        dir.path(),
        &[
            "config.json",
            "quantization_config.weight_block_size",
            "[64, 64]",
        ],
    );

    // in_proj_qkv [160, 64] has a [2, 1] scale grid; a [1, 2] grid holds as many bytes but
    // cuts the matrix into the wrong tiles.
    let scale = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight_scale_inv";
    let dir = broken_copy(
        |_| {},
        |h| {
            let at = h.find(&format!("\"{scale}\"")).expect("scale in header");
            let (head, tail) = h.split_at(at);
            let shape = tail.find("\"shape\":[2,1]").expect("shape [2,1]");
            format!(
                "{head}{}\"shape\":[1,2]{}",
                &tail[..shape],
                &tail[shape + "\"shape\":[2,1]".len()..]
            )
        },
    );
    refused(
        dir.path(),
        &[
            scale,
            "model.safetensors",
            "expected shape [2, 1], found [1, 2]",
        ],
    );
    // e5m2 codes in the weights themselves.
    let weight = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight\"";
    let dir = broken_copy(
        |_| {},
        |h| {
            let at = h.find(weight).expect("weight in header");
            let (head, tail) = h.split_at(at);
            format!("{head}{}", tail.replacen("F8_E4M3", "F8_E5M2", 1))
        },
    );
    refused(
        dir.path(),
        &["layers.0.linear_attn.in_proj_qkv.weight", "F8_E5M2"],
    );
}

#[test]
fn quantization_fp8_flag_quantizes_a_bf16_checkpoint_at_load() {
    // The qwen35_bf16 fixture with --quantization fp8 computes with exactly the weights of the
    // qwen35_fp8 fixture (the same recipe made it, with f32 scales): the same logits, bit for bit.
    let quantized = score_logits(
        &fixture("qwen35_bf16"),
        "cpu",
        &["--quantization", "fp8"],
        "online",
    );
    let stored = score_logits(&fixture("qwen35_fp8"), "cpu", &[], "stored");
    let plain = score_logits(&fixture("qwen35_bf16"), "cpu", &[], "plain");
    println!(
        "qwen35_bf16 --quantization fp8 vs qwen35_fp8: max |diff| = {:.2e}; vs bf16: {:.2e}",
        max_abs_diff(&quantized, &stored),
        max_abs_diff(&quantized, &plain)
    );
    assert!(
        quantized == stored,
        "--quantization fp8 differs from the FP8 checkpoint"
    );
    assert!(
        max_abs_diff(&quantized, &plain) > 1e-2,
        "nothing was quantized"
    );
    // On a checkpoint that is already FP8 the flag changes nothing.
    let again = score_logits(
        &fixture("qwen35_fp8"),
        "cpu",
        &["--quantization", "fp8"],
        "again",
    );
    assert!(again == stored);
}

#[test]
fn dummy_weights_of_an_fp8_config_are_block_fp8() {
    // `--load-format dummy` on an FP8 checkpoint's config generates what the checkpoint would hold:
    // the generated weights quantized with its scheme. The two fixtures' configs differ only in
    // `quantization_config`, whose list keeps the same modules unconverted as --quantization fp8.
    let dummy = ["--load-format", "dummy"];
    let fp8_config = score_logits(&fixture("qwen35_fp8"), "cpu", &dummy, "fp8-config");
    let quantized = score_logits(
        &fixture("qwen35_bf16"),
        "cpu",
        &["--load-format", "dummy", "--quantization", "fp8"],
        "quantized",
    );
    let plain = score_logits(&fixture("qwen35_bf16"), "cpu", &dummy, "plain");
    assert!(
        fp8_config == quantized,
        "dummy weights of the FP8 config differ from quantized dummy weights: max |diff| = {:.2e}",
        max_abs_diff(&fp8_config, &quantized)
    );
    assert!(
        max_abs_diff(&fp8_config, &plain) > 1e-3,
        "the FP8 config's dummy weights were not quantized"
    );
}
