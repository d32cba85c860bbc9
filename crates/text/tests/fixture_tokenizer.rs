//! Checks deltaserve-text against the expectations scripts/make_test_tokenizer.py computed with HF
//! tokenizers / transformers (jinja2) for the fixture in tests/fixtures/tokenizer.

use std::path::{Path, PathBuf};

use deltaserve_text::{
    count_reasoning_tokens, parse_tool_calls, prompt_ids_open_reasoning, prompt_opens_reasoning,
    split_reasoning, ChatMessage, ChatTemplate, Detokenizer, ReasoningStream, RenderOptions,
    TemplateError, ThinkTokenIds, Tokenizer, TokenizerError, ToolCallStream, ToolSchemas,
};
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&fixture_dir()).expect("fixture tokenizer loads")
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("expected.json parses")
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("id list")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn encode_matches_hf() {
    let tok = tokenizer();
    let expected = expected();
    let cases = expected["encode"].as_array().unwrap();
    assert!(cases.len() >= 15);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text, false).unwrap();
        assert_eq!(got, ids(&case["ids"]), "ids of {text:?}");
        let tokens: Vec<String> = got.iter().map(|&id| tok.id_to_token(id).unwrap()).collect();
        let want: Vec<String> = serde_json::from_value(case["tokens"].clone()).unwrap();
        assert_eq!(tokens, want, "tokens of {text:?}");
    }
}

#[test]
fn decode_matches_hf() {
    let tok = tokenizer();
    let expected = expected();
    let cases = expected["decode"].as_array().unwrap();
    assert!(cases.len() >= 60);
    for case in cases {
        let skip = case["skip_special_tokens"].as_bool().unwrap();
        let got = tok.decode(&ids(&case["ids"]), skip).unwrap();
        assert_eq!(
            got,
            case["text"].as_str().unwrap(),
            "decode {:?} skip={skip}",
            case["ids"]
        );
    }
}

#[test]
fn special_tokens_vocab_and_generation_defaults() {
    let tok = tokenizer();
    let expected = expected();
    assert_eq!(
        tok.vocab_size() as u64,
        expected["vocab_size"].as_u64().unwrap()
    );
    let skipped = ids(&expected["skipped_ids"]);
    assert_eq!(skipped.len(), 3, "the ChatML control tokens");
    for (token, id) in expected["added_ids"].as_object().unwrap() {
        let id = id.as_u64().unwrap() as u32;
        assert_eq!(tok.token_to_id(token), Some(id), "{token}");
        assert_eq!(
            tok.is_special(id),
            skipped.contains(&id),
            "{token} special flag"
        );
    }
    assert!(!tok.is_special(tok.encode("Hello", false).unwrap()[0]));
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let eot = tok.token_to_id("<|endoftext|>").unwrap();
    assert_eq!(tok.stop_token_ids(), &[im_end, eot]);
    let g = tok.generation_defaults();
    assert_eq!(
        (g.temperature, g.top_p, g.top_k, g.min_p),
        (Some(0.6), Some(0.95), Some(20), Some(0.0))
    );
    assert_eq!(g.repetition_penalty, Some(1.0));
    assert_eq!(g.do_sample, Some(true));
    assert_eq!(g.eos_token_ids, vec![im_end, eot]);
    assert_eq!(
        tok.special_token_strings().eos_token.as_deref(),
        Some("<|im_end|>")
    );
    assert_eq!(
        tok.special_token_strings().pad_token.as_deref(),
        Some("<|endoftext|>")
    );
    let on_disk =
        std::fs::read_to_string(fixture_dir().join("../../../scripts/chat_template.jinja"))
            .unwrap();
    assert_eq!(tok.chat_template(), Some(on_disk.as_str()));
}

#[test]
fn template_renders_are_byte_identical_to_jinja2() {
    let tok = tokenizer();
    let expected = expected();
    let renders = expected["renders"].as_array().unwrap();
    let names: Vec<&str> = renders
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for required in [
        "plain_chat",
        "system_prompt",
        "multi_turn_reasoning",
        "tools_call_and_response",
        "thinking_disabled",
    ] {
        assert!(names.contains(&required), "fixture lacks {required}");
    }
    for case in renders {
        let name = case["name"].as_str().unwrap();
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let tools: Option<Vec<Value>> = serde_json::from_value(case["tools"].clone()).unwrap();
        let template = ChatTemplate::from_tokenizer(&tok, tools.is_some()).unwrap();
        let options = RenderOptions {
            tools,
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            kwargs: case["kwargs"].as_object().unwrap().clone(),
        };
        let text = template.render(&messages, &options).unwrap();
        assert_eq!(text, case["text"].as_str().unwrap(), "render {name}");
        assert_eq!(
            tok.encode(&text, false).unwrap(),
            ids(&case["ids"]),
            "ids of render {name}"
        );
    }
}

#[test]
fn template_raise_exception_cases() {
    let tok = tokenizer();
    let template = ChatTemplate::from_tokenizer(&tok, false).unwrap();
    let expected = expected();
    for case in expected["render_errors"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let options = RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        };
        let err = template.render(&messages, &options).unwrap_err();
        assert_eq!(
            err,
            TemplateError::Raised {
                message: case["message"].as_str().unwrap().to_string()
            },
            "{}",
            case["name"]
        );
    }
}

#[test]
fn generation_prompt_modes_drive_the_reasoning_parser() {
    let tok = tokenizer();
    let template = ChatTemplate::from_tokenizer(&tok, false).unwrap();
    let messages = [ChatMessage::text("user", "Hi")];
    let mut options = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    let thinking = template.render(&messages, &options).unwrap();
    assert!(thinking.ends_with("<|im_start|>assistant\n<think>\n"));
    options
        .kwargs
        .insert("enable_thinking".into(), Value::Bool(false));
    let plain = template.render(&messages, &options).unwrap();
    assert!(plain.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));

    let tags = ThinkTokenIds::from_tokenizer(&tok).unwrap();
    assert!(prompt_opens_reasoning(&thinking));
    assert!(!prompt_opens_reasoning(&plain));
    assert!(prompt_ids_open_reasoning(
        &tok.encode(&thinking, false).unwrap(),
        &tags
    ));
    assert!(!prompt_ids_open_reasoning(
        &tok.encode(&plain, false).unwrap(),
        &tags
    ));
}

#[test]
fn separate_chat_template_file_wins_and_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("deltaserve-text-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(fixture_dir().join(name), dir.join(name)).unwrap();
    }
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{{ messages[0].content }}!",
    )
    .unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.chat_template(), Some("{{ messages[0].content }}!"));
    let text = ChatTemplate::from_tokenizer(&tok, false)
        .unwrap()
        .render(
            &[ChatMessage::text("user", "hey")],
            &RenderOptions::default(),
        )
        .unwrap();
    assert_eq!(text, "hey!");

    std::fs::write(dir.join("generation_config.json"), r#"{"top_p": "high"}"#).unwrap();
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(
        matches!(err, TokenizerError::Field { ref field, .. } if field == "top_p"),
        "{err}"
    );
    assert!(err.to_string().contains("generation_config.json"), "{err}");

    std::fs::write(dir.join("tokenizer_config.json"), "{not json").unwrap();
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(matches!(err, TokenizerError::Json { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");

    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(matches!(err, TokenizerError::TokenizerJson { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();

    let err = Tokenizer::from_dir(Path::new("/nonexistent/model")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/model"), "{err}");
}

/// Feeds ids one at a time; returns the pieces and checks the concatenation against `decode`.
fn detokenize(tok: &Tokenizer, ids: &[u32], skip: bool) -> Vec<String> {
    let mut detok = Detokenizer::new(skip);
    let mut pieces: Vec<String> = ids.iter().map(|&id| detok.step(tok, id).unwrap()).collect();
    pieces.push(detok.finish(tok).unwrap());
    assert!(!detok.has_pending());
    let whole = tok.decode(ids, skip).unwrap();
    assert_eq!(pieces.concat(), whole, "ids {ids:?} skip={skip}");
    if !whole.contains('\u{FFFD}') {
        for piece in &pieces {
            assert!(
                !piece.contains('\u{FFFD}'),
                "piece {piece:?} of {whole:?} has a replacement char"
            );
        }
    }
    pieces
}

#[test]
fn detokenizer_matches_decode_on_fixture_cases() {
    let tok = tokenizer();
    let expected = expected();
    for case in expected["decode"].as_array().unwrap() {
        let skip = case["skip_special_tokens"].as_bool().unwrap();
        let pieces = detokenize(&tok, &ids(&case["ids"]), skip);
        assert_eq!(pieces.concat(), case["text"].as_str().unwrap());
    }
}

#[test]
fn detokenizer_holds_back_split_multibyte_characters() {
    let tok = tokenizer();
    for text in [
        "Emoji: 😀 🚀 👍🏽 🇫🇷 ✨ 🦀",
        "日本語のテキストと中文文本。",
        "Café naïve",
        "ωμέγα 😀x",
    ] {
        let ids = tok.encode(text, false).unwrap();
        let pieces = detokenize(&tok, &ids, false);
        assert_eq!(pieces.concat(), text);
        // Some character spans several byte tokens, so some steps must have held text back.
        assert!(
            ids.len() > text.chars().count() / 2,
            "{text:?} is not split over byte tokens"
        );
        assert!(
            pieces.iter().any(String::is_empty),
            "{text:?}: nothing was held back"
        );
        for (i, piece) in pieces.iter().enumerate() {
            assert!(
                text.contains(piece.as_str()),
                "piece {i} {piece:?} is not part of {text:?}"
            );
        }
    }
    // Special tokens are emitted as text, or skipped; the think tags are not special (as in Qwen).
    let ids = tok
        .encode("<|im_start|><think>\nok\n</think>\n\n😀<|im_end|>", false)
        .unwrap();
    assert_eq!(
        detokenize(&tok, &ids, false).concat(),
        "<|im_start|><think>\nok\n</think>\n\n😀<|im_end|>"
    );
    assert_eq!(
        detokenize(&tok, &ids, true).concat(),
        "<think>\nok\n</think>\n\n😀"
    );
}

#[test]
fn detokenizer_on_random_id_sequences() {
    let tok = tokenizer();
    let vocab = tok.vocab_size() as u64;
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    let mut with_fffd = 0;
    let mut multibyte = 0;
    for round in 0..600 {
        let len = 1 + next() % 24;
        // Every other sequence draws only single-byte tokens (the first 256 ids of the byte-level
        // vocabulary), which split and complete multi-byte characters in every possible way.
        let range = if round % 2 == 0 { vocab } else { 256 };
        let ids: Vec<u32> = (0..len).map(|_| (next() % range) as u32).collect();
        multibyte += usize::from(
            tok.decode(&ids, false)
                .unwrap()
                .chars()
                .any(|c| c != '\u{FFFD}' && c.len_utf8() > 1),
        );
        for skip in [false, true] {
            let pieces = detokenize(&tok, &ids, skip);
            with_fffd += usize::from(pieces.concat().contains('\u{FFFD}'));
        }
    }
    assert!(
        with_fffd > 100,
        "random ids rarely produced broken UTF-8 ({with_fffd}); the test is too weak"
    );
    assert!(
        multibyte > 20,
        "random byte ids rarely completed a character ({multibyte})"
    );
}

#[test]
fn detokenizer_with_context_does_not_repeat_the_context() {
    let tok = tokenizer();
    let prompt = tok.encode("Hello world", false).unwrap();
    let output = tok.encode(" and more 😀", false).unwrap();
    let mut detok = Detokenizer::with_context(&tok, false, &prompt[prompt.len() - 2..]).unwrap();
    let mut text = detok.step_all(&tok, &output).unwrap();
    text.push_str(&detok.finish(&tok).unwrap());
    assert_eq!(text, " and more 😀");
}

#[test]
fn reasoning_tokens_are_counted_from_ids() {
    let tok = tokenizer();
    let tags = ThinkTokenIds::from_tokenizer(&tok).unwrap();
    let reasoning_ids = tok.encode("First, 2 + 2 = 4.\n", false).unwrap();
    let output = "First, 2 + 2 = 4.\n</think>\n\nFour.";
    let ids = tok.encode(output, false).unwrap();
    assert_eq!(
        count_reasoning_tokens(&ids, &tags, true),
        reasoning_ids.len()
    );
    assert!(reasoning_ids.len() > 5);
    let split = split_reasoning(output, true);
    assert_eq!(split.reasoning.as_deref(), Some("First, 2 + 2 = 4."));
    assert_eq!(count_reasoning_tokens(&ids, &tags, false), 0);
}

/// Prompt -> generated ids -> detokenizer -> reasoning -> tool calls, streamed id by id, against the
/// non-streaming parse of the decoded output.
#[test]
fn streaming_pipeline_over_token_ids() {
    let tok = tokenizer();
    let tools = vec![
        serde_json::json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}),
    ];
    let prompt = ChatTemplate::from_tokenizer(&tok, true)
        .unwrap()
        .render(
            &[ChatMessage::text("user", "Weather in 東京?")],
            &RenderOptions {
                tools: Some(tools.clone()),
                add_generation_prompt: true,
                ..RenderOptions::default()
            },
        )
        .unwrap();
    let forced = prompt_opens_reasoning(&prompt);
    assert!(forced);
    let output = "The user wants weather 🌦.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n東京\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call><|im_end|>";
    let ids = tok.encode(output, false).unwrap();
    let schemas = ToolSchemas::from_tools(&tools);

    let mut detok = Detokenizer::new(true);
    let mut reasoning_stream = ReasoningStream::new(forced);
    let mut tool_stream = ToolCallStream::new(schemas.clone(), "call_");
    let (mut reasoning, mut content, mut arguments, mut name) =
        (String::new(), String::new(), String::new(), None);
    let mut feed = |text: &str, end: bool, reasoning_stream: &mut ReasoningStream| {
        let mut delta = reasoning_stream.push(text);
        if end {
            let rest = reasoning_stream.finish();
            delta.reasoning.push_str(&rest.reasoning);
            delta.content.push_str(&rest.content);
        }
        reasoning.push_str(&delta.reasoning);
        let mut tool_delta = tool_stream.push(&delta.content);
        if end {
            let rest = tool_stream.finish();
            tool_delta.content.push_str(&rest.content);
            tool_delta.tool_calls.extend(rest.tool_calls);
        }
        content.push_str(&tool_delta.content);
        for chunk in tool_delta.tool_calls {
            if let Some(n) = chunk.name {
                name = Some(n);
            }
            arguments.push_str(&chunk.arguments);
        }
    };
    for &id in &ids {
        let text = detok.step(&tok, id).unwrap();
        feed(&text, false, &mut reasoning_stream);
    }
    let tail = detok.finish(&tok).unwrap();
    feed(&tail, true, &mut reasoning_stream);

    let decoded = tok.decode(&ids, true).unwrap();
    let split = split_reasoning(&decoded, forced);
    let calls = parse_tool_calls(split.content.as_deref().unwrap_or(""), &schemas, "call_");
    assert_eq!(
        split.reasoning.as_deref(),
        Some("The user wants weather 🌦.")
    );
    assert_eq!(reasoning, "The user wants weather 🌦.");
    assert_eq!(calls.content.as_deref(), Some("Checking."));
    assert_eq!(content, "Checking.");
    assert_eq!(calls.calls.len(), 1);
    assert_eq!(name.as_deref(), Some("get_weather"));
    assert_eq!(arguments, r#"{"city":"東京","days":3}"#);
    assert_eq!(calls.calls[0].arguments, arguments);
}

/// Jinja features that HF chat templates use, each rendered by transformers' jinja2 environment.
/// KNOWN_DIFFERENCES lists the snippets where minijinja is known to differ, with the reason; the test
/// checks those still differ so the list stays honest.
#[test]
fn jinja_features_render_like_transformers() {
    const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
        (
            "dict_filters",
            "minijinja has no tuples: printed (key, value) pairs show as ['k', 'v']",
        ),
        (
            "py_dict_methods",
            "minijinja has no tuples: printed (key, value) pairs show as ['k', 'v']",
        ),
        (
            "concat_python_values",
            "`~` formats floats >= 1e16 positionally (Python: 1e+20); printing them is exact",
        ),
    ];
    let tok = tokenizer();
    let expected = expected();
    let context = expected["feature_context"].as_object().unwrap().clone();
    let cases = expected["feature_renders"].as_array().unwrap();
    let mut mismatches = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let source = case["template"].as_str().unwrap();
        let template = ChatTemplate::new(source)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .with_special_tokens(tok.special_token_strings());
        let options = RenderOptions {
            kwargs: context.clone(),
            ..RenderOptions::default()
        };
        let got = template.render(&[], &options);
        let want = case["text"].as_str();
        let same = match (&got, want) {
            (Ok(text), Some(want)) => text == want,
            (Err(_), None) => true,
            _ => false,
        };
        let known = KNOWN_DIFFERENCES.iter().any(|(n, _)| *n == name);
        if same == known {
            mismatches.push(format!(
                "{name} (known difference: {known}):\n  jinja2:    {:?}\n  minijinja: {got:?}",
                want.map(String::from)
                    .unwrap_or_else(|| case["error"].to_string())
            ));
        }
    }
    assert!(cases.len() >= 25);
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn an_operator_template_replaces_every_model_template() {
    let tok = tokenizer().with_chat_template("{{ messages[0].content }}?".to_string());
    assert_eq!(tok.chat_template(), Some("{{ messages[0].content }}?"));
    assert_eq!(
        tok.chat_template_for(true),
        Some("{{ messages[0].content }}?")
    );
    assert_eq!(tok.chat_template_named("tool_use"), None);
}
