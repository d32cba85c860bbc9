//! Fuzz target: request bodies through JSON parsing, `ChatRequest::parse` / `CompletionRequest::parse`
//! under the default and under tight limits, then, as the routes do, the demo chat template, the
//! tokenizer and the token budget. Accepted requests must respect every limit; nothing may panic.

use deltaserve_api::error::ApiError;
use deltaserve_api::limits::MAX_STOP_STRING_BYTES;
use deltaserve_api::request::{
    ChatRequest, CompletionRequest, GenerationParams, PromptInput, ToolChoice,
};
use deltaserve_api::RequestLimits;
use deltaserve_text::{prompt_opens_reasoning, RenderOptions};
use serde_json::Value;

use crate::demo::demo;

/// Limits far below the defaults, so that fuzzed bodies reach every over-limit branch.
const TIGHT: RequestLimits = RequestLimits {
    max_messages: 3,
    max_prompt_tokens: Some(48),
    max_tokens_cap: 40,
    max_n: 2,
    max_top_logprobs: 2,
    max_stop_strings: 2,
};

pub fn run(data: &[u8]) {
    let Ok(body) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    for limits in [RequestLimits::default(), TIGHT] {
        match ChatRequest::parse(&body, &limits) {
            Ok(request) => check_chat(&request, &limits),
            Err(error) => check_error(&error),
        }
        match CompletionRequest::parse(&body, &limits) {
            Ok(request) => check_completion(&request, &limits),
            Err(error) => check_error(&error),
        }
    }
}

/// A refused request is a client error with a message.
fn check_error(error: &ApiError) {
    assert!(
        error.status.is_client_error(),
        "parse errors must be 4xx, got {} ({})",
        error.status,
        error.message
    );
    assert!(!error.message.is_empty(), "an error without a message");
}

/// What every accepted request must satisfy.
fn check_params(params: &GenerationParams, limits: &RequestLimits) {
    assert!(
        (1..=limits.max_n).contains(&params.n),
        "accepted n {} outside 1..={}",
        params.n,
        limits.max_n
    );
    if let Some(max_tokens) = params.max_tokens {
        assert!(
            (1..=limits.max_tokens_cap).contains(&max_tokens),
            "accepted max_tokens {max_tokens} over the cap {}",
            limits.max_tokens_cap
        );
    }
    assert!(params.stop.len() <= limits.max_stop_strings);
    assert!(params
        .stop
        .iter()
        .all(|s| !s.is_empty() && s.len() <= MAX_STOP_STRING_BYTES));
    if let Some(k) = params.logprobs {
        assert!(k <= limits.max_top_logprobs, "accepted logprobs {k}");
    }
    if let Some(t) = params.temperature {
        assert!(t >= 0.0, "accepted temperature {t}");
    }
    if let Some(p) = params.top_p {
        assert!(p > 0.0 && p <= 1.0, "accepted top_p {p}");
    }
    let defaults = demo().tokenizer.generation_defaults();
    for index in 0..params.n {
        let sampling = params.sampling(defaults, index);
        assert!(sampling.temperature >= 0.0 && sampling.top_p > 0.0);
    }
}

/// The token budget for a prompt of `prompt_tokens`: when granted it fits the context and the cap.
fn check_budget(params: &GenerationParams, prompt_tokens: usize, limits: &RequestLimits) {
    let demo = demo();
    let budget = params.token_budget(
        prompt_tokens,
        demo.context_length,
        limits,
        demo.tokenizer.generation_defaults(),
        "prompt",
    );
    match budget {
        Ok(budget) => {
            assert!(budget >= 1, "a zero budget was granted");
            assert!(
                prompt_tokens + budget <= demo.context_length,
                "prompt {prompt_tokens} + budget {budget} over the context {}",
                demo.context_length
            );
            if let Some(limit) = limits.prompt_limit(demo.context_length) {
                assert!(prompt_tokens <= limit);
            }
        }
        Err(error) => check_error(&error),
    }
}

fn check_chat(request: &ChatRequest, limits: &RequestLimits) {
    check_params(&request.params, limits);
    assert!((1..=limits.max_messages).contains(&request.messages.len()));
    assert!(request
        .messages
        .iter()
        .all(|m| matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool")));
    if request.tool_choice == ToolChoice::None {
        assert!(request.tools.is_empty(), "tools kept with tool_choice none");
    }
    let demo = demo();
    let with_tools = !request.tools.is_empty();
    let options = RenderOptions {
        tools: with_tools.then(|| request.tools.clone()),
        add_generation_prompt: true,
        kwargs: request.template_kwargs.clone(),
    };
    // Template errors are the client's (400) or the limits' (413); the route maps them, here they only
    // must not be panics.
    let Ok(prompt) = demo
        .template(with_tools)
        .render(&request.messages, &options)
    else {
        return;
    };
    prompt_opens_reasoning(&prompt);
    if let Ok(ids) = demo.tokenizer.encode(&prompt, false) {
        check_budget(&request.params, ids.len(), limits);
    }
}

fn check_completion(request: &CompletionRequest, limits: &RequestLimits) {
    check_params(&request.params, limits);
    assert!(!request.prompts.is_empty(), "a completion without prompts");
    let demo = demo();
    for prompt in &request.prompts {
        let tokens = match prompt {
            PromptInput::Text(text) => match demo.tokenizer.encode(text, true) {
                Ok(ids) => ids.len(),
                Err(_) => continue,
            },
            PromptInput::Ids(ids) => ids.len(),
        };
        check_budget(&request.params, tokens, limits);
    }
}
