//! The OpenAI routes over real HTTP against the scripted fake engine: exact response shapes of chat and
//! completions (whole and streamed), reasoning, tool calls, stop strings, n, logprobs, every error class.

mod common;

use common::{ids, tokenizer, FakeEngine, Script, TestServer, IM_END};
use deltaserve_engine::GenerationRequest;
use deltaserve_text::{ChatMessage, ChatTemplate, RenderOptions};
use serde_json::{json, Value};

const THINK_REPLY: &str = "Let me add 2 and 2.</think>\n\nThe answer is 4.<|im_end|>";

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// The prompt the fixture template renders for one user message.
fn rendered(text: &str, kwargs: Value) -> String {
    let template = ChatTemplate::from_tokenizer(&tokenizer(), false).unwrap();
    let options = RenderOptions {
        add_generation_prompt: true,
        kwargs: kwargs.as_object().cloned().unwrap_or_default(),
        ..RenderOptions::default()
    };
    template
        .render(&[ChatMessage::text("user", text)], &options)
        .unwrap()
}

fn assert_chat_head(body: &Value, object: &str) {
    assert!(
        body["id"].as_str().unwrap().starts_with("chatcmpl-"),
        "{body}"
    );
    assert_eq!(body["object"], object);
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(body["model"], "test-model");
}

#[tokio::test]
async fn chat_non_streaming_shape_reasoning_and_defaults() {
    let server = TestServer::start(FakeEngine::replying(THINK_REPLY)).await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"model": "test-model", "messages": user("What is 2+2?")}),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = reply.json();
    assert_chat_head(&body, "chat.completion");
    let keys: Vec<&str> = body
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        ["id", "object", "created", "model", "choices", "usage"]
    );
    let choice = &body["choices"][0];
    assert_eq!(body["choices"].as_array().unwrap().len(), 1);
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["logprobs"], Value::Null);
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": "The answer is 4.", "reasoning_content": "Let me add 2 and 2."})
    );

    let prompt = ids(&rendered("What is 2+2?", json!({})));
    let completion = ids(THINK_REPLY).len();
    let reasoning = ids("Let me add 2 and 2.").len();
    assert_eq!(
        body["usage"],
        json!({
            "prompt_tokens": prompt.len(),
            "completion_tokens": completion,
            "total_tokens": prompt.len() + completion,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        })
    );

    // What reached the engine: the rendered template, generation_config.json defaults, eos stop ids.
    let requests = server.engine.requests();
    let request = &requests[0];
    assert_eq!(request.prompt_ids, prompt);
    assert_eq!(request.sampling.temperature, 0.6);
    assert_eq!(request.sampling.top_p, 0.95);
    assert_eq!(request.sampling.top_k, 20);
    assert_eq!(request.sampling.seed, None);
    assert_eq!(request.sampling.logprobs, None);
    assert_eq!(request.stop_token_ids, vec![1493, 1491]);
    assert_eq!(request.max_new_tokens, 4096 - prompt.len());
}

#[tokio::test]
async fn request_fields_override_generation_config() {
    let server = TestServer::start(FakeEngine::replying(THINK_REPLY)).await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("hi"), "temperature": 0, "top_p": 0.5, "top_k": -1, "max_completion_tokens": 9,
                    "presence_penalty": 0.5, "repetition_penalty": 1.1, "seed": 42, "stop_token_ids": [7],
                    "ignore_eos": true, "disable_speculation": true, "some_unknown_field": [1, 2]}),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let request = &server.engine.requests()[0];
    assert_eq!(request.sampling.temperature, 0.0);
    assert_eq!(request.sampling.top_p, 0.5);
    assert_eq!(request.sampling.top_k, 0);
    assert_eq!(request.sampling.presence_penalty, 0.5);
    assert_eq!(request.sampling.repetition_penalty, 1.1);
    assert_eq!(request.sampling.seed, Some(42));
    assert_eq!(request.max_new_tokens, 9);
    assert!(request.disable_speculation);
    assert_eq!(
        request.stop_token_ids,
        vec![7],
        "ignore_eos drops the eos ids"
    );
}

#[tokio::test]
async fn random_seed_seeds_requests_that_bring_none_reproducibly() {
    let mut seen = Vec::new();
    for _ in 0..2 {
        let server = TestServer::start_with(FakeEngine::replying(THINK_REPLY), |config| {
            config.random_seed = Some(7);
        })
        .await;
        for body in [
            json!({"messages": user("hi"), "n": 2}),
            json!({"messages": user("hi"), "seed": 42}),
        ] {
            let reply = server.post("/v1/chat/completions", &body).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
        }
        let seeds: Vec<Option<u64>> = server
            .engine
            .requests()
            .iter()
            .map(|r| r.sampling.seed)
            .collect();
        seen.push(seeds);
    }
    let (first, second) = (&seen[0], &seen[1]);
    assert_eq!(first[2], Some(42), "a request's own seed wins");
    assert!(first[0].is_some() && first[1].is_some() && first[0] != first[1]);
    let mut unseeded = second[..2].to_vec();
    unseeded.sort_unstable();
    let mut expected = first[..2].to_vec();
    expected.sort_unstable();
    assert_eq!(unseeded, expected, "the same seed gives the same seeds");
    let server = TestServer::start(FakeEngine::replying(THINK_REPLY)).await;
    server
        .post("/v1/chat/completions", &json!({"messages": user("hi")}))
        .await;
    assert_eq!(
        server.engine.requests()[0].sampling.seed,
        None,
        "without --random-seed the engine picks fresh seeds"
    );
}

#[tokio::test]
async fn chat_streaming_chunks_in_openai_format() {
    let server = TestServer::start(FakeEngine::replying(THINK_REPLY)).await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("What is 2+2?"), "stream": true, "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let events = reply.events();
    let id = events[0]["id"].as_str().unwrap().to_string();
    for event in &events {
        assert_chat_head(event, "chat.completion.chunk");
        assert_eq!(event["id"], id.as_str());
        assert!(
            event.as_object().unwrap().contains_key("usage"),
            "include_usage puts usage on every chunk"
        );
    }
    assert_eq!(
        events[0]["choices"],
        json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}])
    );
    let (mut reasoning, mut content) = (String::new(), String::new());
    let middle = &events[1..events.len() - 1];
    for (i, event) in middle.iter().enumerate() {
        let choice = &event["choices"][0];
        assert_eq!(choice["index"], 0);
        assert!(
            choice["delta"].get("role").is_none(),
            "only the first chunk has the role"
        );
        reasoning.push_str(choice["delta"]["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        let last = i == middle.len() - 1;
        assert_eq!(
            choice["finish_reason"],
            if last { json!("stop") } else { Value::Null }
        );
        assert_eq!(event["usage"], Value::Null);
    }
    assert_eq!(reasoning, "Let me add 2 and 2.");
    assert_eq!(content, "The answer is 4.");
    assert!(
        !reasoning.contains("think") && !content.contains('<'),
        "tags never leak"
    );
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], ids(THINK_REPLY).len());
    assert_eq!(
        last["usage"]["completion_tokens_details"]["reasoning_tokens"],
        ids("Let me add 2 and 2.").len()
    );
}

#[tokio::test]
async fn streaming_without_include_usage_has_no_usage_field() {
    let server = TestServer::start(FakeEngine::replying(THINK_REPLY)).await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("q"), "stream": true}),
        )
        .await;
    let events = reply.events();
    assert!(events.iter().all(|e| e.get("usage").is_none()));
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
}

#[tokio::test]
async fn reply_cut_inside_reasoning_by_max_tokens() {
    let server = TestServer::start(FakeEngine::replying(THINK_REPLY)).await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("q"), "max_tokens": 4}),
        )
        .await;
    let body = reply.json();
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["message"]["content"], Value::Null);
    let reasoning = choice["message"]["reasoning_content"].as_str().unwrap();
    let expected = tokenizer().decode(&ids(THINK_REPLY)[..4], false).unwrap();
    assert_eq!(reasoning, expected.trim());
    assert_eq!(body["usage"]["completion_tokens"], 4);
    assert_eq!(
        body["usage"]["completion_tokens_details"]["reasoning_tokens"],
        4
    );

    // Streaming: the same split, nothing as content.
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("q"), "max_tokens": 4, "stream": true}),
        )
        .await;
    let events = reply.events();
    let streamed: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    assert_eq!(streamed, expected.trim());
    assert!(events.iter().all(|e| e["choices"][0]["delta"]["content"]
        .as_str()
        .unwrap_or("")
        .is_empty()));
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[tokio::test]
async fn thinking_disabled_by_kwargs_or_top_level_field() {
    let server = TestServer::start(FakeEngine::replying("Just 4.<|im_end|>")).await;
    for body in [
        json!({"messages": user("q"), "chat_template_kwargs": {"enable_thinking": false}}),
        json!({"messages": user("q"), "enable_thinking": false}),
    ] {
        let reply = server.post("/v1/chat/completions", &body).await;
        let body = reply.json();
        assert_eq!(body["choices"][0]["message"]["content"], "Just 4.");
        assert_eq!(
            body["choices"][0]["message"]["reasoning_content"],
            Value::Null
        );
        assert_eq!(
            body["usage"]["completion_tokens_details"]["reasoning_tokens"],
            0
        );
    }
    let expected = ids(&rendered("q", json!({"enable_thinking": false})));
    for request in server.engine.requests() {
        assert_eq!(request.prompt_ids, expected);
    }
    assert!(rendered("q", json!({"enable_thinking": false})).ends_with("<think>\n\n</think>\n\n"));
}

#[tokio::test]
async fn server_default_template_kwargs_sit_under_the_request_ones() {
    let server = TestServer::start_with(FakeEngine::replying("Just 4.<|im_end|>"), |config| {
        config.default_template_kwargs = json!({"enable_thinking": false})
            .as_object()
            .cloned()
            .unwrap();
    })
    .await;
    for body in [
        json!({"messages": user("q")}),
        json!({"messages": user("q"), "chat_template_kwargs": {"enable_thinking": true}}),
    ] {
        let reply = server.post("/v1/chat/completions", &body).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let requests = server.engine.requests();
    assert_eq!(
        requests[0].prompt_ids,
        ids(&rendered("q", json!({"enable_thinking": false})))
    );
    assert_eq!(
        requests[1].prompt_ids,
        ids(&rendered("q", json!({"enable_thinking": true})))
    );
}

#[tokio::test]
async fn every_served_model_name_is_accepted_the_first_is_reported() {
    let server = TestServer::start_with(FakeEngine::replying("Just 4.<|im_end|>"), |config| {
        config.model_name = "qwen3-next".into();
        config.model_aliases = vec!["qwen".into()];
    })
    .await;
    for name in ["qwen3-next", "qwen"] {
        let reply = server
            .post(
                "/v1/chat/completions",
                &json!({"model": name, "messages": user("q")}),
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.json()["model"], "qwen3-next");
        assert_eq!(server.get(&format!("/v1/models/{name}")).await.status, 200);
    }
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"model": "other", "messages": user("q")}),
        )
        .await;
    reply.error(404);
}

fn weather_tools() -> Value {
    json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                           "required": ["city"]}
        }
    }])
}

const CALL: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

#[tokio::test]
async fn tool_calls_non_streaming() {
    let reply_text = format!("I need the weather.</think>\n\n{CALL}<|im_end|>");
    let server = TestServer::start(FakeEngine::replying(&reply_text)).await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("Weather in Paris?"), "tools": weather_tools()}),
        )
        .await;
    let body = reply.json();
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let message = &choice["message"];
    assert_eq!(message["content"], Value::Null);
    assert_eq!(message["reasoning_content"], "I need the weather.");
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Paris", "days": 3}));
    // The tools reached the template.
    let prompt = tokenizer()
        .decode(&server.engine.requests()[0].prompt_ids, false)
        .unwrap();
    assert!(
        prompt.contains("get_weather") && prompt.contains("# Tools"),
        "{prompt}"
    );
}

#[tokio::test]
async fn tool_call_inside_unterminated_think_block() {
    let reply_text = format!("I need the weather.\n{CALL}<|im_end|>");
    let server = TestServer::start(FakeEngine::replying(&reply_text)).await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("Weather?"), "tools": weather_tools()}),
        )
        .await;
    let body = reply.json();
    let message = &body["choices"][0]["message"];
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(message["reasoning_content"], "I need the weather.");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(
        body["usage"]["completion_tokens_details"]["reasoning_tokens"],
        ids("I need the weather.\n").len()
    );
}

#[tokio::test]
async fn tool_calls_streaming() {
    let reply_text = format!("Checking.</think>\n\n{CALL}<|im_end|>");
    let server = TestServer::start(FakeEngine::replying(&reply_text)).await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("Weather?"), "tools": weather_tools(), "stream": true}),
        )
        .await;
    let events = reply.events();
    let deltas: Vec<&Value> = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"].get("tool_calls"))
        .flat_map(|calls| calls.as_array().unwrap())
        .collect();
    assert!(!deltas.is_empty());
    assert_eq!(deltas[0]["index"], 0);
    assert!(deltas[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(deltas[0]["type"], "function");
    assert_eq!(deltas[0]["function"]["name"], "get_weather");
    let arguments: String = deltas
        .iter()
        .map(|d| d["function"]["arguments"].as_str().unwrap())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"city": "Paris", "days": 3})
    );
    let content: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(
        !content.contains("<tool_call>") && !content.contains("<function"),
        "{content:?}"
    );
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
}

#[tokio::test]
async fn tool_choice_none_hides_tools_and_parses_nothing() {
    let reply_text = format!("Hmm.</think>\n\n{CALL}<|im_end|>");
    let server = TestServer::start(FakeEngine::replying(&reply_text)).await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("Weather?"), "tools": weather_tools(), "tool_choice": "none"}),
        )
        .await;
    let body = reply.json();
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(body["choices"][0]["message"].get("tool_calls").is_none());
    assert!(body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains("<function=get_weather>"));
    let prompt = tokenizer()
        .decode(&server.engine.requests()[0].prompt_ids, false)
        .unwrap();
    assert!(!prompt.contains("get_weather"), "{prompt}");
}

const PLAIN: &str = "Alpha beta gamma delta epsilon";

/// Stop strings that no single token of PLAIN contains (so a match must span tokens).
fn spans_tokens(stop: &str) -> bool {
    let t = tokenizer();
    ids(PLAIN)
        .iter()
        .all(|&id| !t.decode(&[id], false).unwrap().contains(stop))
}

#[tokio::test]
async fn stop_strings_across_tokens_abort_the_engine_request() {
    assert!(spans_tokens("ta gam"));
    let server = TestServer::start(FakeEngine::replying(&format!("{PLAIN}<|im_end|>"))).await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("q"), "enable_thinking": false, "stop": ["nothing", "ta gam"]}),
        )
        .await;
    let body = reply.json();
    assert_eq!(body["choices"][0]["message"]["content"], "Alpha be");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let id = server.engine.ids()[0];
    assert!(
        server.engine.aborted().contains(&id),
        "the engine request is aborted on a stop string"
    );
    let used = body["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert!(
        used < ids(PLAIN).len(),
        "tokens after the stop are not counted: {used}"
    );

    // Streaming, string form of `stop`, via completions.
    let reply = server
        .post(
            "/v1/completions",
            &json!({"prompt": "Say it", "stop": "ta gam", "stream": true}),
        )
        .await;
    let events = reply.events();
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "Alpha be");
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    let id = server.engine.ids()[1];
    assert!(server.engine.wait_aborted(id).await);
}

#[tokio::test]
async fn n_choices_with_consecutive_seeds() {
    let engine = FakeEngine::new(|request: &GenerationRequest| {
        let seed = request.sampling.seed.unwrap_or(0);
        Script::text(&format!("Reply {seed}<|im_end|>"))
    });
    let server = TestServer::start(engine).await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("q"), "n": 3, "seed": 7, "enable_thinking": false}),
        )
        .await;
    let body = reply.json();
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        assert_eq!(choice["message"]["content"], format!("Reply {}", 7 + i));
    }
    let seeds: Vec<Option<u64>> = server
        .engine
        .requests()
        .iter()
        .map(|r| r.sampling.seed)
        .collect();
    assert_eq!(seeds, [Some(7), Some(8), Some(9)]);
    let per_choice = ids("Reply 7<|im_end|>").len();
    assert_eq!(body["usage"]["completion_tokens"], 3 * per_choice);
    let prompt = server.engine.requests()[0].prompt_ids.len();
    assert_eq!(
        body["usage"]["prompt_tokens"], prompt,
        "the prompt is counted once"
    );

    // Streaming: every index gets a role chunk, its text, and a finish.
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("q"), "n": 2, "seed": 1, "enable_thinking": false, "stream": true}),
        )
        .await;
    let events = reply.events();
    for index in 0..2 {
        let of_index: Vec<&Value> = events
            .iter()
            .filter(|e| e["choices"][0]["index"] == index)
            .collect();
        assert_eq!(of_index[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = of_index
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, format!("Reply {}", 1 + index));
        assert_eq!(
            of_index.last().unwrap()["choices"][0]["finish_reason"],
            "stop"
        );
    }
}

#[tokio::test]
async fn chat_logprobs_in_openai_format() {
    let server = TestServer::start(FakeEngine::replying("Hello world<|im_end|>")).await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("q"), "enable_thinking": false, "logprobs": true, "top_logprobs": 2}),
        )
        .await;
    let body = reply.json();
    assert_eq!(server.engine.requests()[0].sampling.logprobs, Some(2));
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    let generated = ids("Hello world<|im_end|>");
    assert_eq!(content.len(), generated.len());
    let t = tokenizer();
    for (i, (entry, &id)) in content.iter().zip(&generated).enumerate() {
        let text = t.decode(&[id], false).unwrap();
        assert_eq!(entry["token"], text.as_str());
        assert_eq!(entry["bytes"], json!(text.as_bytes()));
        assert_eq!(
            entry["logprob"].as_f64().unwrap() as f32,
            -0.25 * (i as f32 + 1.0)
        );
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["token"], text.as_str());
        assert_eq!(
            top[1]["logprob"].as_f64().unwrap() as f32,
            -0.25 * (i as f32 + 1.0) - 1.0
        );
        assert!(top[1]["bytes"].is_array());
    }
    assert_eq!(content[3]["token"], " world");

    // Streaming: every token's logprob arrives once.
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("q"), "enable_thinking": false, "logprobs": true, "stream": true}),
        )
        .await;
    let streamed: Vec<Value> = reply
        .events()
        .iter()
        .filter_map(|e| e["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed.len(), generated.len());
    assert!(streamed.iter().all(|e| e["top_logprobs"] == json!([])));
}

#[tokio::test]
async fn speculative_counts_appear_in_usage() {
    let engine = FakeEngine::new(|_: &GenerationRequest| Script {
        draft_tokens: 12,
        accepted_draft_tokens: 9,
        ..Script::text("Ok.<|im_end|>")
    });
    let server = TestServer::start(engine).await;
    let body = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("q"), "enable_thinking": false}),
        )
        .await
        .json();
    assert_eq!(
        body["usage"]["spec_decoding"],
        json!({"draft_tokens": 12, "accepted_tokens": 9})
    );
}

#[tokio::test]
async fn completions_non_streaming_and_streaming() {
    let server = TestServer::start(FakeEngine::replying(&format!("{PLAIN}<|im_end|>"))).await;
    let reply = server
        .post(
            "/v1/completions",
            &json!({"model": "test-model", "prompt": "Greek letters:", "max_tokens": 50}),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = reply.json();
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], "test-model");
    assert_eq!(
        body["choices"],
        json!([{"index": 0, "text": PLAIN, "logprobs": null, "finish_reason": "stop"}])
    );
    let prompt = tokenizer().encode("Greek letters:", true).unwrap();
    assert_eq!(server.engine.requests()[0].prompt_ids, prompt);
    assert_eq!(body["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(body["usage"]["completion_tokens"], ids(PLAIN).len() + 1);

    let reply = server
        .post(
            "/v1/completions",
            &json!({"prompt": [[5, 6, 7], [8, 9]], "stream": true, "stream_options": {"include_usage": true}}),
        )
        .await;
    let events = reply.events();
    for event in &events {
        assert_eq!(event["object"], "text_completion");
        assert!(event["id"].as_str().unwrap().starts_with("cmpl-"));
    }
    for index in 0..2 {
        let text: String = events
            .iter()
            .filter(|e| e["choices"][0]["index"] == index)
            .filter_map(|e| e["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(text, PLAIN);
    }
    let usage = &events.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"], 5);
    assert_eq!(usage["completion_tokens"], 2 * (ids(PLAIN).len() + 1));
    let prompts: Vec<Vec<u32>> = server.engine.requests()[1..]
        .iter()
        .map(|r| r.prompt_ids.clone())
        .collect();
    assert_eq!(prompts, [vec![5, 6, 7], vec![8, 9]]);
}

#[tokio::test]
async fn completions_logprobs_and_echo() {
    let server = TestServer::start(FakeEngine::replying("Hello world<|im_end|>")).await;
    let body = server
        .post("/v1/completions", &json!({"prompt": "Say:", "logprobs": 1}))
        .await
        .json();
    let logprobs = &body["choices"][0]["logprobs"];
    assert_eq!(
        logprobs["tokens"],
        json!(["H", "ell", "o", " world", "<|im_end|>"])
    );
    assert_eq!(logprobs["token_logprobs"][3].as_f64().unwrap() as f32, -1.0);
    assert_eq!(logprobs["top_logprobs"][3], json!({" world": -1.0}));
    assert_eq!(logprobs["text_offset"], json!([0, 1, 4, 5, 11]));
    let body = server
        .post("/v1/completions", &json!({"prompt": "Say:", "echo": true}))
        .await
        .json();
    assert_eq!(body["choices"][0]["text"], "Say:Hello world");
}

#[tokio::test]
async fn models_route() {
    let server = TestServer::start(FakeEngine::replying("x")).await;
    let body = server.get("/v1/models").await.json();
    assert_eq!(body["object"], "list");
    let card = &body["data"][0];
    assert_eq!(card["id"], "test-model");
    assert_eq!(card["object"], "model");
    assert_eq!(card["owned_by"], "deltaserve");
    assert_eq!(card["max_model_len"], 4096);
    assert_eq!(
        server.get("/v1/models/test-model").await.json()["id"],
        "test-model"
    );
    server.get("/v1/models/other").await.error(404);
}

#[tokio::test]
async fn error_classes() {
    let server = TestServer::start_with(
        FakeEngine::with_context(|_| Script::text("Hi<|im_end|>"), 100),
        |config| {
            config.max_body_bytes = 4096;
        },
    )
    .await;
    let chat = "/v1/chat/completions";

    let error = server
        .post_raw(chat, b"{\"messages\": [".to_vec())
        .await
        .error(400);
    assert_eq!(error["type"], "invalid_request_error");
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("not valid JSON"));

    let cases = [
        (
            json!({"messages": user("q"), "temperature": "warm"}),
            "temperature",
        ),
        (
            json!({"messages": user("q"), "temperature": -1}),
            "temperature",
        ),
        (json!({"messages": user("q"), "top_p": 0.0}), "top_p"),
        (json!({"messages": user("q"), "n": 0}), "n"),
        (
            json!({"messages": user("q"), "max_tokens": 0}),
            "max_tokens",
        ),
        (
            json!({"messages": user("q"), "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (json!({"messages": "hello"}), "messages"),
        (
            json!({"messages": user("q"), "stop_token_ids": [99999]}),
            "stop_token_ids",
        ),
        (
            json!({"messages": user("q"), "response_format": {"type": "yaml"}}),
            "response_format",
        ),
    ];
    for (body, param) in cases {
        let error = server.post(chat, &body).await.error(400);
        assert_eq!(error["param"], param, "{body}");
    }
    let error = server
        .post("/v1/completions", &json!({"prompt": "q", "logprobs": 30}))
        .await
        .error(400);
    assert_eq!(error["param"], "logprobs");

    let error = server
        .post(chat, &json!({"model": "gpt-4", "messages": user("q")}))
        .await
        .error(404);
    assert_eq!(error["param"], "model");
    assert_eq!(error["code"], "model_not_found");

    // Prompt + max_tokens over the context length (100): both numbers named.
    let prompt_len = ids(&rendered("q", json!({}))).len();
    let error = server
        .post(chat, &json!({"messages": user("q"), "max_tokens": 95}))
        .await
        .error(400);
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(&prompt_len.to_string())
            && message.contains("95")
            && message.contains("100"),
        "{message}"
    );
    assert_eq!(error["code"], "context_length_exceeded");
    assert_eq!(error["param"], "max_tokens");

    let big = json!({"messages": user(&"x".repeat(5000))});
    let error = server.post(chat, &big).await.error(413);
    assert!(error["message"].as_str().unwrap().contains("4096"));

    server
        .engine
        .queue_full
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let reply = server.post(chat, &json!({"messages": user("q")})).await;
    let error = reply.error(429);
    assert_eq!(error["code"], "queue_full");
    assert_eq!(reply.headers.get("retry-after").unwrap(), "1");
    server
        .engine
        .queue_full
        .store(false, std::sync::atomic::Ordering::SeqCst);

    server.get("/v1/nothing").await.error(404);
    server.get(chat).await.error(405);
    assert!(
        server.engine.requests().is_empty(),
        "no invalid request reached the engine"
    );
}

#[tokio::test]
async fn unavailable_while_loading() {
    let state = std::sync::Arc::new(deltaserve_api::AppState::new(
        deltaserve_api::ServerConfig::new("test-model"),
        tokenizer(),
    ));
    let engine = FakeEngine::replying("x");
    let server = TestServer::serve(state, engine).await;
    let reply = server
        .post("/v1/chat/completions", &json!({"messages": user("q")}))
        .await;
    let error = reply.error(503);
    assert!(error["message"].as_str().unwrap().contains("loading"));
    assert!(reply.headers.contains_key("retry-after"));
}

#[tokio::test]
async fn engine_error_is_a_500_or_a_stream_error_event() {
    let engine = FakeEngine::new(|_: &GenerationRequest| Script {
        error: Some("device lost".into()),
        ..Script::text("Par")
    });
    let server = TestServer::start(engine).await;
    let error = server
        .post("/v1/chat/completions", &json!({"messages": user("q")}))
        .await
        .error(500);
    assert!(error["message"].as_str().unwrap().contains("device lost"));
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("q"), "stream": true}),
        )
        .await;
    let events = reply.events();
    assert!(events.iter().any(|e| e["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("device lost"))));
}

#[test]
fn fixture_eos_is_im_end() {
    assert_eq!(ids("<|im_end|>"), [IM_END]);
}
