//! Errors of the command line as a user meets them. The exit status convention of the checking
//! commands (src/check_outcome.rs): 0 clean, 1 a problem found, 2 the check could not run; `doctor`
//! and `smoke` finding problems (status 1) are exercised on the real demo model by
//! tests/founding_failure.rs, here `lint-output` in all three cases and `smoke` and `doctor` failing
//! to run. And a `--model-path` that is no directory is said to be one, by every command.

use std::io::Write;
use std::process::{Command, Output, Stdio};

const BINARY: &str = env!("CARGO_BIN_EXE_deltaserve");

fn lint(stdin: &str) -> Output {
    let mut child = Command::new(BINARY)
        .args(["lint-output", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn run(args: &[&str]) -> Output {
    Command::new(BINARY).args(args).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn lint_output_exits_0_clean_1_degenerate_2_unreadable() {
    let clean = lint("The sum of 47 and 38 is 85, since 40 + 30 = 70 and 7 + 8 = 15.");
    assert_eq!(clean.status.code(), Some(0), "{}", stderr(&clean));

    let looping = lint(&"=".repeat(230));
    assert_eq!(looping.status.code(), Some(1), "{}", stderr(&looping));
    let verdict: serde_json::Value = serde_json::from_slice(&looping.stdout).unwrap();
    assert_eq!(verdict["degenerate"], true, "{verdict}");

    let missing = run(&["lint-output", "/nonexistent/replies.jsonl"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing).contains("/nonexistent/replies.jsonl"),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn smoke_exits_2_when_the_suite_cannot_run() {
    let bad_url = run(&["smoke", "--url", "ftp://127.0.0.1:30000"]);
    assert_eq!(bad_url.status.code(), Some(2), "{}", stderr(&bad_url));
    assert!(stderr(&bad_url).contains("--url"), "{}", stderr(&bad_url));

    let zero = run(&["smoke", "--url", "http://127.0.0.1:1", "--max-tokens", "0"]);
    assert_eq!(zero.status.code(), Some(2), "{}", stderr(&zero));
    assert!(stderr(&zero).contains("--max-tokens"), "{}", stderr(&zero));
}

#[test]
fn doctor_exits_2_when_it_cannot_load_the_model() {
    let out = run(&["doctor", "--model-path", "/nonexistent/model"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--model-path /nonexistent/model: no such directory"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_missing_model_directory_is_called_missing() {
    let file = std::env::temp_dir().join(format!("deltaserve-not-a-dir-{}", std::process::id()));
    std::fs::write(&file, b"").unwrap();
    let file_arg = file.display().to_string();
    for (command, path, expected) in [
        (
            "serve",
            "/nonexistent/model",
            "--model-path /nonexistent/model: no such directory",
        ),
        (
            "chat",
            "/nonexistent/model",
            "--model-path /nonexistent/model: no such directory",
        ),
        (
            "generate",
            "/nonexistent/model",
            "--model-path /nonexistent/model: no such directory",
        ),
        ("serve", file_arg.as_str(), "not a directory"),
    ] {
        let mut args = vec![command, "--model-path", path];
        match command {
            "chat" => args.push("hello"),
            "generate" => args.extend(["--prompt", "hello"]),
            _ => {}
        }
        let out = run(&args);
        assert!(!out.status.success(), "{command} {path}");
        assert!(
            stderr(&out).contains(expected),
            "{command} --model-path {path}: {}",
            stderr(&out)
        );
    }
    let out = run(&["serve", "--tokenizer-path", "/nonexistent/tok"]);
    assert!(
        stderr(&out).contains("--tokenizer-path /nonexistent/tok: no such directory"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_file(&file);
}
