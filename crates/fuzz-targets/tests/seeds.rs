//! Writes the hand-made seed inputs of every fuzz target into fuzz/corpus/<target>/seed-*. Ignored by
//! default: run `cargo test -p deltaserve-fuzz-targets --test seeds -- --ignored` to (re)create them
//! before fuzzing; the fuzzers and `cargo fuzz cmin` grow and prune the corpus from there.

use std::path::{Path, PathBuf};

use deltaserve_fuzz_targets::chunks::unshape;
use deltaserve_fuzz_targets::TARGETS;
use deltaserve_text::Tokenizer;
use serde_json::{json, Map, Value};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn write(target: &str, name: &str, data: &[u8]) {
    let dir = root().join("fuzz/corpus").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("seed-{name}")), data).unwrap();
}

fn request_seeds() {
    let user = json!([{"role": "user", "content": "What is 2+2? Answer briefly."}]);
    let tool = json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
        "days": {"type": "integer"}}, "required": ["city"]}}});
    let seeds = [
        (
            "chat-basic",
            json!({"model": "demo", "messages": user, "max_tokens": 16}),
        ),
        (
            "chat-all-fields",
            json!({"model": "demo", "messages": user, "max_completion_tokens": 7,
            "n": 2, "stop": ["END", "\n\n"], "seed": -3, "logprobs": true, "top_logprobs": 2,
            "stream": true, "stream_options": {"include_usage": true}, "enable_thinking": false,
            "chat_template_kwargs": {"enable_thinking": true}, "temperature": 0.7, "top_p": 0.9,
            "top_k": -1, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "repetition_penalty": 1.1, "ignore_eos": false, "skip_special_tokens": true,
            "disable_speculation": true, "separate_reasoning": false, "stop_token_ids": [2, 0],
            "response_format": {"type": "text"}, "min_tokens": 0, "user": "u"}),
        ),
        (
            "chat-tools",
            json!({"messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": null, "reasoning_content": "Look it up.",
             "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "get_weather",
             "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
            {"role": "tool", "tool_call_id": "c0", "content": "{\"temp\": 21}"},
            {"role": "developer", "content": "late system"}],
            "tools": [tool], "tool_choice": "auto", "max_tokens": 30}),
        ),
        (
            "chat-bad-limits",
            json!({"messages": user, "n": 100, "max_tokens": 1_000_000,
            "stop": ["a", "b", "c", "d"], "top_logprobs": 30, "logprobs": true}),
        ),
        (
            "chat-bad-types",
            json!({"messages": [{"role": "wizard", "content": 5}], "top_p": 0,
            "tool_choice": "required", "response_format": {"type": "json_object"}, "temperature": -1}),
        ),
        (
            "completion-text",
            json!({"model": "demo", "prompt": "Once upon a time", "max_tokens": 8,
            "echo": true, "logprobs": 2, "best_of": 1, "suffix": ""}),
        ),
        (
            "completion-ids",
            json!({"prompt": [[1, 2, 3], [4000000000u64]], "max_tokens": 4, "n": 2}),
        ),
        (
            "completion-list",
            json!({"prompt": ["a", "b"], "stop": "x", "stream": true}),
        ),
    ];
    for (name, body) in seeds {
        write("request_json", name, body.to_string().as_bytes());
    }
    write("request_json", "not-json", b"{\"messages\": [");
}

fn template_seeds() {
    let demo_config: Value = serde_json::from_slice(
        &std::fs::read(root().join("models/demo/tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    let demo = demo_config["chat_template"].as_str().unwrap().to_string();
    let qwen = std::fs::read_to_string(root().join("scripts/chat_template.jinja")).unwrap();
    let conversation = json!({
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "hi <think>"},
            {"role": "assistant", "content": "<think>r</think>answer", "tool_calls": [{"type": "function",
             "function": {"name": "f", "arguments": {"a": [1, {"b": null}], "s": "x"}}}]},
            {"role": "tool", "content": "result"},
            {"role": "tool", "content": [{"type": "text", "text": "more"}]},
            {"role": "user", "content": "again"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "kwargs": {"enable_thinking": false},
        "add_generation_prompt": true
    })
    .to_string();
    let hostile = [
        ("nested-loops", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
        ("big-output", "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}"),
        ("big-string", "{% set s = 'ab' * 1000000 %}{{ s|length }}{{ s.upper()|length }}"),
        ("recursion", "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}"),
        ("tojson-indent", "{{ messages | tojson(indent=4, sort_keys=true) }}{{ tools | tojson(separators=(',', ':')) }}"),
        ("strftime", "{{ strftime_now('%Y-%m-%d %H:%M:%S %a %b %j %% %e %Q') }}"),
        ("raise", "{% if messages|length > 1 %}{{ raise_exception('too many: ' ~ messages|length) }}{% endif %}"),
        ("namespace", "{% set ns = namespace(x=0) %}{% for m in messages %}{% set ns.x = ns.x + m.content|length %}{% endfor %}{{ ns.x }}{{ messages[0].content.split(' ')|join('|') }}"),
        ("methods", "{% for m in messages %}{{ m.content.strip().lstrip('a').rstrip().startswith('x') }}{{ m.role.title() }}{{ m.content.replace('a', 'bb') }}{{ m.content[::-1] }}{% endfor %}"),
        ("syntax-error", "{% if %}{{ }}{% endfor"),
        ("huge-range", "{% for i in range(10**9) %}x{% endfor %}"),
    ];
    write(
        "chat_template",
        "demo",
        format!("{demo}\0{conversation}").as_bytes(),
    );
    write(
        "chat_template",
        "qwen",
        format!("{qwen}\0{conversation}").as_bytes(),
    );
    write(
        "chat_template",
        "demo-plain-text",
        format!("{demo}\0<think>日本 😀</think>\n{{{{ x }}}}").as_bytes(),
    );
    for (name, source) in hostile {
        write(
            "chat_template",
            name,
            format!("{source}\0{conversation}").as_bytes(),
        );
    }
}

fn stream_seeds() {
    let weather = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";
    let outputs = [
        ("think-answer", 1, "Let me think.\n</think>\n\nThe answer is 4."),
        ("think-tag", 0, "<think>\nhmm\n</think>\n\nYes."),
        ("cut-off", 1, "Still thinking about </thi"),
        ("tool-in-think", 1, &format!("I should call it.\n\n{weather}")),
        ("two-calls", 0, &format!("Sure.\n{weather}\n{weather}\nDone")),
        ("typed-args", 0, "<tool_call>\n<function=get_weather>\n<parameter=detailed>\nTrue\n</parameter>\n<parameter=ratio>\n2.50\n</parameter>\n<parameter=opts>\n{\"a\": [1, null]}\n</parameter>\n<parameter=tags>\n[\"x\"]\n</parameter>\n<parameter=maybe>\nnull\n</parameter>\n<parameter=either>\nabc\n</parameter>\n</function>\n</tool_call>"),
        ("malformed", 2, "x <tool_call>oops</tool_call> y\n<tool_call><function=>x</function><tool_call>\n<function=a\nb>"),
        ("unterminated", 0, "<think>a</think>b<tool_call>\n<function=f>\n<parameter=n>\n7\n<parameter=m>\nx"),
        ("multibyte", 1, "日本 😀\n</think>\n\n答え 👍<tool_call><function=f>\u{3000}</function>"),
    ];
    for (name, flags, text) in outputs {
        write(
            "reasoning_tool_stream",
            &format!("{name}-whole"),
            &unshape(flags, &[], text),
        );
        write(
            "reasoning_tool_stream",
            &format!("{name}-small"),
            &unshape(flags, &[0, 1, 2, 3], text),
        );
        write(
            "reasoning_tool_stream",
            &format!("{name}-mixed"),
            &unshape(flags | 2, &[130, 5, 200], text),
        );
    }
}

fn detokenizer_seeds() {
    let tokenizer = Tokenizer::from_dir(&root().join("models/demo")).unwrap();
    let texts = [
        ("ascii", "Hello world, the answer is 4."),
        ("multibyte", "日本語 😀 é ñ 👍🏽 \u{3000}"),
        ("tags", "<think>\nhmm\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|>"),
    ];
    let words = |ids: &[u32]| -> Vec<u8> {
        ids.iter()
            .flat_map(|&id| (id as u16).to_le_bytes())
            .collect()
    };
    for (name, text) in texts {
        let ids = tokenizer.encode(text, false).unwrap();
        for flags in [0u8, 1, 2 | (3 << 2), 3 | (7 << 2)] {
            let mut data = vec![flags];
            data.extend(words(&ids));
            write("detokenizer", &format!("{name}-{flags}"), &data);
        }
    }
    // Out-of-vocabulary and far ids around a split character.
    let mut data = vec![0u8];
    data.extend([0xff, 0xff, 0x00, 0xff]);
    data.extend(words(&tokenizer.encode("日", false).unwrap()));
    write("detokenizer", "far-ids", &data);
}

/// A small valid file with real tensor names, dtypes and shapes from a fixture (the smallest tensors,
/// repacked), the fixture's full header over a cut data section, and hostile headers.
fn safetensors_seeds() {
    let real =
        std::fs::read(root().join("tests/fixtures/qwen3_next/model-00003-of-00003.safetensors"))
            .unwrap();
    let header_len = u64::from_le_bytes(real[..8].try_into().unwrap()) as usize;
    let header: Map<String, Value> = serde_json::from_slice(&real[8..8 + header_len]).unwrap();
    let mut cut = real[..8 + header_len].to_vec();
    cut.extend_from_slice(&[0u8; 64]);
    write("safetensors_header", "real-header-cut-data", &cut);

    let mut small: Vec<(&String, &Value, u64)> = header
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .map(|(name, entry)| {
            let offsets = &entry["data_offsets"];
            (
                name,
                entry,
                offsets[1].as_u64().unwrap() - offsets[0].as_u64().unwrap(),
            )
        })
        .collect();
    small.sort_by_key(|&(_, _, size)| size);
    let mut packed = Map::new();
    let mut offset = 0u64;
    for (name, entry, size) in small.into_iter().take(6) {
        let mut entry = entry.clone();
        entry["data_offsets"] = json!([offset, offset + size]);
        packed.insert(name.clone(), entry);
        offset += size;
    }
    packed.insert("__metadata__".into(), json!({"format": "pt"}));
    write(
        "safetensors_header",
        "real-small",
        &file(&Value::Object(packed).to_string(), offset as usize),
    );

    let hostile = [
        (
            "huge-shape",
            r#"{"a":{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,8]}}"#,
            8,
        ),
        (
            "overlap",
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#,
            8,
        ),
        (
            "reversed",
            r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}"#,
            4,
        ),
        (
            "unknown-dtype",
            r#"{"a":{"dtype":"Q4_K","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"F4","shape":[3],"data_offsets":[3,5]}}"#,
            5,
        ),
        (
            "past-end",
            r#"{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4000000000]}}"#,
            4,
        ),
        (
            "bad-types",
            r#"{"__metadata__":{"k":"v"},"a":{"dtype":7,"shape":"x","data_offsets":[-1]}}"#,
            0,
        ),
    ];
    for (name, header, data_len) in hostile {
        write("safetensors_header", name, &file(header, data_len));
    }
    let mut huge_len = u64::MAX.to_le_bytes().to_vec();
    huge_len.extend_from_slice(b"{}");
    write("safetensors_header", "huge-header-length", &huge_len);
    write("safetensors_header", "short", b"\x02\0\0");
}

fn file(header: &str, data_len: usize) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(0u8, data_len));
    bytes
}

#[test]
#[ignore = "writes fuzz/corpus; run by hand before fuzzing"]
fn write_seed_corpus() {
    request_seeds();
    template_seeds();
    stream_seeds();
    detokenizer_seeds();
    safetensors_seeds();
    for (name, run) in TARGETS {
        for entry in std::fs::read_dir(root().join("fuzz/corpus").join(name)).unwrap() {
            run(&std::fs::read(entry.unwrap().path()).unwrap());
        }
    }
}
