//! Turns one tokenized prompt and the request's generation fields into running engine requests (one per
//! choice): token budget against the context length, stop ids (eos unless `ignore_eos`, plus
//! `stop_token_ids`), per-choice seeds. Shared by chat and completions; no response shaping here.

use std::sync::Arc;
use std::time::Instant;

use deltaserve_engine::{GenerationRequest, SamplingParams, SharedEngine};
use deltaserve_grammar::Grammar;
use deltaserve_text::ThinkTokenIds;

use crate::error::ApiError;
use crate::generation::{ChoiceRun, ChoiceSpec};
use crate::request::GenerationParams;
use crate::state::AppState;

/// A tokenized prompt ready to submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    /// Whether the prompt ends inside an open think block (output starts in reasoning).
    pub opens_reasoning: bool,
}

/// Compiles the request's output grammar (`params.grammar`, or `tools` for a forced tool call);
/// errors are 400s naming the field that asked for it.
pub fn compile_grammar(
    state: &AppState,
    engine: &SharedEngine,
    spec: &deltaserve_grammar::GrammarSpec,
    field: &str,
) -> Result<Arc<Grammar>, ApiError> {
    let compiler = state.grammar_compiler(engine.vocab_size())?;
    compiler.compile(spec).map(Arc::new).map_err(|e| {
        ApiError::invalid(
            field,
            format!("`{field}` cannot be used as an output grammar: {e}"),
        )
    })
}

/// Submits `params.n` choices of `prompt`; their sampling uses choice indices `first_index..`.
/// `prompt_field` names the request field blamed when the prompt is too long. Under `grammar` each
/// choice is constrained by it (after the think block when the prompt opens one).
#[allow(clippy::too_many_arguments)]
pub fn start_choices(
    state: &AppState,
    engine: &SharedEngine,
    params: &GenerationParams,
    prompt: &Prompt,
    first_index: usize,
    arrival: Instant,
    prompt_field: &str,
    grammar: Option<&Grammar>,
) -> Result<Vec<ChoiceRun>, ApiError> {
    if prompt.ids.is_empty() {
        return Err(ApiError::invalid(
            prompt_field,
            format!("`{prompt_field}` is empty (0 tokens)"),
        ));
    }
    let tokenizer = &state.tokenizer;
    let vocab = tokenizer.vocab_size().max(engine.vocab_size());
    if let Some(&bad) = prompt.ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::invalid(
            prompt_field,
            format!(
                "token id {bad} in `{prompt_field}` is outside the vocabulary ({vocab} tokens)"
            ),
        ));
    }
    if let Some(&bad) = params
        .stop_token_ids
        .iter()
        .find(|&&id| id as usize >= vocab)
    {
        return Err(ApiError::invalid(
            "stop_token_ids",
            format!("`stop_token_ids` contains {bad}, outside the vocabulary ({vocab} tokens)"),
        ));
    }
    let defaults = tokenizer.generation_defaults();
    let budget = params.token_budget(
        prompt.ids.len(),
        engine.context_length(),
        &state.config.limits,
        defaults,
        prompt_field,
    )?;
    let mut stop_token_ids: Vec<u32> = if params.ignore_eos {
        Vec::new()
    } else {
        tokenizer.stop_token_ids().to_vec()
    };
    for &id in &params.stop_token_ids {
        if !stop_token_ids.contains(&id) {
            stop_token_ids.push(id);
        }
    }
    let reasoning_tags =
        ThinkTokenIds::from_tokenizer(tokenizer).map(|tags| (tags, prompt.opens_reasoning));
    (0..params.n)
        .map(|i| {
            let sampling = params.sampling(defaults, first_index + i);
            let spec = ChoiceSpec {
                request: GenerationRequest {
                    prompt_ids: prompt.ids.clone(),
                    sampling: SamplingParams {
                        seed: sampling.seed.or_else(|| state.default_seed()),
                        ..sampling
                    },
                    max_new_tokens: budget,
                    stop_token_ids: stop_token_ids.clone(),
                    disable_speculation: params.disable_speculation,
                },
                stop_strings: params.stop.clone(),
                skip_special_tokens: params.skip_special_tokens,
                reasoning_tags,
                watch: state.watch_spec(prompt.opens_reasoning),
                timeout: state.config.request_timeout,
                cut: state.shutdown_cut.subscribe(),
            };
            let constraint = grammar.map(|g| g.constraint(prompt.opens_reasoning));
            ChoiceRun::start(
                engine.clone(),
                Arc::clone(tokenizer),
                spec,
                constraint,
                arrival,
            )
            .map_err(|e| {
                let error = ApiError::from_submit(e);
                if error.status == 400 {
                    error.with_param(prompt_field)
                } else {
                    error
                }
            })
        })
        .collect()
}
