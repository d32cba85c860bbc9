//! Command-line spellings clap cannot express, rewritten before parsing, and only after the `serve`
//! word: vLLM's two-letter short flags (`-tp 2`), its underscore spellings (`--max_model_len`) and its
//! dotted speculative keys (`--speculative-config.method mtp`), which become one
//! `--speculative-config` JSON object.

use std::ffi::OsString;

/// vLLM's multi-letter short flags and the long flags they stand for.
const SHORT_SPELLINGS: [(&str, &str); 3] = [
    ("-tp", "--tensor-parallel-size"),
    ("-dp", "--data-parallel-size"),
    ("-pp", "--pipeline-parallel-size"),
];

const DOTTED_SPECULATIVE: &str = "--speculative-config.";

/// `argv` with the arguments of `deltaserve serve` rewritten; any other subcommand (and every argument
/// that is not valid UTF-8) is kept as it is.
pub fn normalize(argv: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut args = argv.into_iter();
    let mut out: Vec<OsString> = args.by_ref().take(2).collect();
    if out.get(1).is_none_or(|subcommand| subcommand != "serve") {
        out.extend(args);
        return out;
    }
    let mut dotted = serde_json::Map::new();
    let mut rest = args.peekable();
    while let Some(arg) = rest.next() {
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if let Some((_, long)) = SHORT_SPELLINGS.iter().find(|(short, _)| *short == text) {
            out.push(OsString::from(*long));
            continue;
        }
        let Some(name) = text.strip_prefix("--") else {
            out.push(arg);
            continue;
        };
        let (name, inline_value) = match name.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (name, None),
        };
        let name = format!("--{}", name.replace('_', "-"));
        if let Some(key) = text
            .split('=')
            .next()
            .and_then(|n| n.strip_prefix(DOTTED_SPECULATIVE))
        {
            let value = inline_value.or_else(|| rest.next().and_then(|v| v.into_string().ok()));
            dotted.insert(key.to_string(), json_scalar(value.unwrap_or_default()));
            continue;
        }
        out.push(OsString::from(match inline_value {
            Some(value) => format!("{name}={value}"),
            None => name,
        }));
    }
    if !dotted.is_empty() {
        out.push(OsString::from("--speculative-config"));
        out.push(OsString::from(
            serde_json::Value::Object(dotted).to_string(),
        ));
    }
    out
}

/// A dotted key's value as JSON: numbers and booleans as themselves, anything else as a string.
fn json_scalar(value: String) -> serde_json::Value {
    match serde_json::from_str::<serde_json::Value>(&value) {
        Ok(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => v,
        _ => serde_json::Value::String(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(line: &str) -> String {
        normalize(line.split_whitespace().map(OsString::from))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn serve_arguments_are_rewritten() {
        assert_eq!(
            run("deltaserve serve m -tp 1 --max_model_len=4096 --gpu_memory_utilization 0.9"),
            "deltaserve serve m --tensor-parallel-size 1 --max-model-len=4096 --gpu-memory-utilization 0.9"
        );
        assert_eq!(
            run("deltaserve bench serve --max_x -tp"),
            "deltaserve bench serve --max_x -tp"
        );
    }

    #[test]
    fn dotted_speculative_keys_become_one_json_object() {
        assert_eq!(
            run("deltaserve serve m --speculative-config.method mtp --speculative-config.num_speculative_tokens=2 --port 1"),
            r#"deltaserve serve m --port 1 --speculative-config {"method":"mtp","num_speculative_tokens":2}"#
        );
    }
}
