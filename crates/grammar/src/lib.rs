//! Constrained decoding for deltaserve. A request's output format (a JSON schema, JSON object mode, a
//! regex, an EBNF grammar, or the tool-call syntax of the model's template) is compiled by the
//! `llguidance` crate against the model's own vocabulary; each choice then gets a
//! `TokenConstraint` the engine asks for a token mask before every position it samples and tells
//! every token it commits. This crate builds grammars and adapts llguidance to the engine; the
//! grammar engine itself (Earley parser, lexer, token trie, mask computation) is llguidance's.

mod ebnf;
mod tools;

use std::sync::Arc;

use deltaserve_engine::{TokenConstraint, TokenMask};
use deltaserve_text::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

pub use ebnf::gbnf_to_lark;
pub use tools::{ToolCallFormat, ToolGrammar, ToolMode};

/// A grammar the request asked for that cannot be used: the message says why (an unsupported
/// schema keyword, a syntax error, ...). The server answers it with 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// `response_format: {"type": "json_object"}`: any JSON object.
    JsonObject,
    /// `response_format: {"type": "json_schema", ...}`: JSON valid under the schema.
    JsonSchema(Value),
    /// SGLang's `regex`: the whole output matches the regular expression (Rust regex syntax).
    Regex(String),
    /// SGLang's `ebnf`: a GBNF grammar (`root ::= ...`, as xgrammar and llama.cpp write them), or a
    /// grammar in llguidance's Lark syntax when it has no `::=`.
    Ebnf(String),
    /// The output is tool calls in the template's syntax (or text and at most one call).
    Tools(ToolGrammar),
}

/// The model's vocabulary as llguidance sees it, and every grammar compiled for it. Built once per
/// server (building the token trie walks the whole vocabulary).
pub struct GrammarCompiler {
    factory: ParserFactory,
    think_end: Option<u32>,
    eos: Vec<u32>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field(
                "vocab_size",
                &self.factory.tok_env().tok_trie().vocab_size(),
            )
            .field("eos", &self.eos)
            .finish()
    }
}

/// llguidance's view of our tokenizer: the token trie, and encoding through the tokenizer itself.
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer.encode(text, false).unwrap_or_default()
        })
    }
}

/// The bytes of every token as llguidance wants them: byte-level pieces mapped back to bytes, and
/// special tokens marked as such. Added tokens written like tags (`<tool_call>`, `</think>`) count
/// as special even when the tokenizer does not flag them, so a grammar names them the same way for
/// every Qwen tokenizer and the model can only write them as the single token it was trained on.
fn token_bytes(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Vec<Vec<u8>>, GrammarError> {
    let json = tokenizer
        .to_json()
        .map_err(|e| GrammarError(e.to_string()))?;
    let mut bytes = llguidance::token_bytes_from_tokenizer_json(&json)
        .map_err(|e| GrammarError(format!("the vocabulary cannot be read for grammars: {e}")))?;
    if let Some(added) = json["added_tokens"].as_array() {
        for token in added {
            let (Some(id), Some(content)) = (token["id"].as_u64(), token["content"].as_str())
            else {
                continue;
            };
            let tag_like = content.starts_with('<') && content.ends_with('>') && content.len() > 2;
            let entry = bytes.get_mut(id as usize);
            if let Some(entry) = entry {
                if tag_like && entry.first() != Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
                    entry.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
                }
            }
        }
    }
    // Embedding rows past the tokenizer (padding) are special tokens no grammar names.
    while bytes.len() < vocab_size {
        let mut name = format!(".<[{}]>", bytes.len()).into_bytes();
        name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
        bytes.push(name);
    }
    for (id, entry) in bytes.iter_mut().enumerate() {
        // Ids the tokenizer leaves unassigned must not be empty (the trie needs a name for each).
        if entry.is_empty() {
            let mut name = format!(".<[{id}]>").into_bytes();
            name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            *entry = name;
        }
    }
    Ok(bytes)
}

impl GrammarCompiler {
    /// For `tokenizer` and a model whose logit rows have `vocab_size` entries. The grammar ends the
    /// output with one of the tokenizer's stop tokens.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab_size: usize) -> Result<Self, GrammarError> {
        let bytes = token_bytes(&tokenizer, vocab_size)?;
        let eos: Vec<u32> = tokenizer.stop_token_ids().to_vec();
        let Some(&first_eos) = eos.first() else {
            return Err(GrammarError(
                "the tokenizer has no end-of-sequence token to end a constrained output with"
                    .into(),
            ));
        };
        let info = TokRxInfo::new(bytes.len() as u32, first_eos);
        let mut trie = TokTrie::from(&info, &bytes);
        if eos.len() > 1 {
            trie = trie.with_eos_tokens(&eos);
        }
        let think_end = tokenizer.token_to_id("</think>");
        let env: TokEnv = Arc::new(Vocabulary { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| GrammarError(format!("cannot set up the grammar engine: {e}")))?;
        factory.quiet();
        Ok(Self {
            factory,
            think_end,
            eos,
        })
    }

    /// Whether the vocabulary has `name` (e.g. `<tool_call>`) as a single special token.
    fn special_token(&self, name: &str) -> bool {
        self.factory
            .tok_env()
            .tok_trie()
            .get_special_token(name)
            .is_some()
    }

    /// Compiles `spec`; the error says what in it cannot be used.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        let top = match spec {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(with_json_style(json!({"type": "object"})))
            }
            GrammarSpec::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError(format!(
                        "a JSON schema must be an object, found {schema}"
                    )));
                }
                TopLevelGrammar::from_json_schema(with_json_style(schema.clone()))
            }
            GrammarSpec::Regex(regex) => TopLevelGrammar::from_regex(regex),
            GrammarSpec::Ebnf(text) => {
                let lark = if text.contains("::=") {
                    gbnf_to_lark(text)?
                } else {
                    text.clone()
                };
                TopLevelGrammar::from_lark(lark)
            }
            GrammarSpec::Tools(tools) => {
                TopLevelGrammar::from_lark(tools.to_lark(&|name| self.special_token(name))?)
            }
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| GrammarError(clean_error(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(GrammarError(clean_error(&error)));
        }
        Ok(Grammar {
            matcher,
            think_end: self.think_end,
            eos: self.eos.clone(),
        })
    }
}

/// JSON written as `{"a": 1, "b": [2, 3]}`: the separators models are trained on and no other
/// whitespace, so a weak model cannot wander off into blank lines. A schema's own `x-guidance`
/// options win.
fn with_json_style(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        let style =
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
        let entry = map
            .entry("x-guidance")
            .or_insert_with(|| Value::Object(Default::default()));
        if let (Value::Object(options), Value::Object(style)) = (entry, style) {
            for (key, value) in style {
                options.entry(key).or_insert(value);
            }
        }
    }
    schema
}

/// llguidance's messages can carry the whole grammar and parser state; the first line says what
/// is wrong.
fn clean_error(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message).trim();
    let first = first.strip_prefix("Error: ").unwrap_or(first);
    if first.chars().count() > 300 {
        let cut: String = first.chars().take(297).collect();
        format!("{cut}...")
    } else {
        first.to_string()
    }
}

/// A compiled grammar; each choice of a request takes its own constraint from it.
pub struct Grammar {
    matcher: Matcher,
    think_end: Option<u32>,
    eos: Vec<u32>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").finish_non_exhaustive()
    }
}

impl Grammar {
    /// A fresh constraint for one choice. With `starts_in_reasoning` (the prompt opened a think
    /// block) the output is free until the model writes `</think>`; the grammar applies after it.
    pub fn constraint(&self, starts_in_reasoning: bool) -> Box<dyn TokenConstraint> {
        Box::new(GrammarConstraint {
            matcher: self.matcher.clone(),
            reasoning: starts_in_reasoning && self.think_end.is_some(),
            think_end: self.think_end,
            eos: self.eos.clone(),
            ended: false,
        })
    }
}

struct GrammarConstraint {
    matcher: Matcher,
    /// Still inside the think block: nothing is constrained yet.
    reasoning: bool,
    think_end: Option<u32>,
    eos: Vec<u32>,
    /// An end-of-sequence token was committed (the grammar had finished).
    ended: bool,
}

impl TokenConstraint for GrammarConstraint {
    fn allowed(&mut self) -> Result<Option<TokenMask>, String> {
        if self.reasoning || self.ended {
            return Ok(None);
        }
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| clean_error(&e.to_string()))?;
        Ok(Some(TokenMask { words: mask.into() }))
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        if self.reasoning {
            if Some(token) == self.think_end {
                self.reasoning = false;
            }
            return Ok(());
        }
        if self.ended {
            return Ok(());
        }
        if self.eos.contains(&token) {
            // The mask offered it, so the grammar was complete; the engine stops here.
            self.ended = true;
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| clean_error(&e.to_string()))
    }

    fn allows_after(&mut self, drafts: &[u32], token: u32) -> Result<bool, String> {
        let Some(grammar_drafts) = self.grammar_part(drafts) else {
            return Ok(true);
        };
        let mut tokens = Vec::with_capacity(grammar_drafts.len() + 1);
        tokens.extend_from_slice(grammar_drafts);
        tokens.push(token);
        // Checks the tokens against the parser without consuming them (no copy of the matcher). A
        // stopped grammar answers 0 even for an end-of-sequence token: "not sure", and the caller
        // asks for the mask.
        let valid = self
            .matcher
            .validate_tokens(&tokens)
            .map_err(|e| clean_error(&e.to_string()))?;
        Ok(valid == tokens.len())
    }

    fn allowed_after(&mut self, drafts: &[u32]) -> Result<Option<TokenMask>, String> {
        let Some(grammar_drafts) = self.grammar_part(drafts) else {
            return Ok(None);
        };
        let mut probe = GrammarConstraint {
            matcher: self.matcher.clone(),
            reasoning: false,
            think_end: self.think_end,
            eos: Vec::new(),
            ended: false,
        };
        probe
            .matcher
            .consume_tokens(grammar_drafts)
            .map_err(|e| clean_error(&e.to_string()))?;
        probe.allowed()
    }
}

impl GrammarConstraint {
    /// The drafts the grammar sees, when the grammar holds after `drafts`: those after the think
    /// block ends. `None` while the output after them is free (still reasoning, or already ended).
    fn grammar_part<'a>(&self, drafts: &'a [u32]) -> Option<&'a [u32]> {
        if self.ended {
            return None;
        }
        let mut start = 0;
        let mut reasoning = self.reasoning;
        for (i, &draft) in drafts.iter().enumerate() {
            if reasoning {
                if Some(draft) == self.think_end {
                    reasoning = false;
                    start = i + 1;
                }
            } else if self.eos.contains(&draft) {
                return None;
            }
        }
        (!reasoning).then(|| &drafts[start..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn compiler() -> GrammarCompiler {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
        let tokenizer = Arc::new(Tokenizer::from_dir(&dir).unwrap());
        GrammarCompiler::new(tokenizer, 3584).unwrap()
    }

    /// Feeds `text` (tokenized by the demo tokenizer) through a constraint, checking each token was
    /// allowed; returns whether every token was.
    fn accepts(grammar: &Grammar, text: &str) -> bool {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
        let tokenizer = Tokenizer::from_dir(&dir).unwrap();
        let mut c = grammar.constraint(false);
        for id in tokenizer.encode(text, false).unwrap() {
            let mask = c.allowed().unwrap().unwrap();
            if !mask.allows(id) {
                return false;
            }
            c.commit(id).unwrap();
        }
        true
    }

    #[test]
    fn json_schema_masks_and_bad_schemas_are_errors() {
        let c = compiler();
        let g = c
            .compile(&GrammarSpec::JsonSchema(json!({
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"], "additionalProperties": false
            })))
            .unwrap();
        assert!(accepts(&g, r#"{"n": 12}"#));
        assert!(!accepts(&g, r#"{"m": 12}"#));
        let e = c
            .compile(&GrammarSpec::JsonSchema(json!({"type": "wizard"})))
            .unwrap_err();
        assert!(!e.0.is_empty());
        let object = c.compile(&GrammarSpec::JsonObject).unwrap();
        assert!(accepts(&object, r#"{"a": [1, {"b": null}], "c": "d"}"#));
        assert!(!accepts(&object, "[1]"));
        assert!(!accepts(&object, "{\n"), "no free whitespace");
        assert!(c.compile(&GrammarSpec::Regex("(".into())).is_err());
        let r = c
            .compile(&GrammarSpec::Regex("[0-9]+ apples".into()))
            .unwrap();
        assert!(accepts(&r, "12 apples"));
        assert!(!accepts(&r, "twelve apples"));
    }

    #[test]
    fn unsupported_schema_features_are_named() {
        let c = compiler();
        for (schema, named) in [
            (
                json!({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}),
                "if",
            ),
            (
                json!({"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}),
                "dependentSchemas",
            ),
            (
                json!({"type": "string", "format": "idn-email"}),
                "idn-email",
            ),
            (json!({"$ref": "http://example.com/x.json"}), "$ref"),
            (
                json!({"type": "array", "contains": {"type": "integer"}}),
                "contains",
            ),
            (
                json!({"type": "integer", "minimum": 5, "maximum": 1}),
                "minimum",
            ),
        ] {
            let error = c
                .compile(&GrammarSpec::JsonSchema(schema.clone()))
                .unwrap_err();
            assert!(error.0.contains(named), "{schema}: {}", error.0);
        }
    }

    #[test]
    fn gbnf_grammars_compile() {
        let c = compiler();
        let g = c
            .compile(&GrammarSpec::Ebnf(
                "root ::= \"yes\" | \"no\" digits\ndigits ::= [0-9]+".into(),
            ))
            .unwrap();
        assert!(accepts(&g, "no42"));
        assert!(!accepts(&g, "maybe"));
        assert!(c.compile(&GrammarSpec::Ebnf("root ::= (".into())).is_err());
    }

    fn weather() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"]}}}),
            json!({"type": "function", "function": {"name": "search", "parameters": {
                "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}),
        ]
    }

    #[test]
    fn tool_call_grammars_follow_the_template_syntax() {
        let c = compiler();
        let tools = |format, mode, parallel| {
            c.compile(&GrammarSpec::Tools(ToolGrammar {
                tools: weather(),
                format,
                mode,
                parallel,
            }))
            .unwrap()
        };
        let xml = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
        let required = tools(ToolCallFormat::Qwen3Coder, ToolMode::Required, true);
        assert!(accepts(&required, xml));
        assert!(accepts(&required, &format!("{xml}\n{xml}")));
        assert!(!accepts(&required, "Sure, let me look."));
        assert!(!accepts(
            &required,
            "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree"
        ));
        let single = tools(ToolCallFormat::Qwen3Coder, ToolMode::Required, false);
        assert!(!accepts(&single, &format!("{xml}\n{xml}")));
        let named = tools(
            ToolCallFormat::Qwen3Coder,
            ToolMode::Named("search".into()),
            true,
        );
        assert!(!accepts(&named, xml));
        assert!(accepts(
            &named,
            "<tool_call>\n<function=search>\n<parameter=query>\nrust <b>\n</parameter>\n</function>\n</tool_call>"
        ));
        let short = c
            .compile(&GrammarSpec::Tools(ToolGrammar {
                tools: vec![
                    json!({"type": "function", "function": {"name": "f", "parameters": {
                    "type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}}}}),
                ],
                format: ToolCallFormat::Qwen3Coder,
                mode: ToolMode::Required,
                parallel: false,
            }))
            .unwrap();
        let call = |v: &str| {
            format!("<tool_call>\n<function=f>\n<parameter=s>\n{v}\n</parameter>\n</function>\n</tool_call>")
        };
        assert!(accepts(&short, &call("abc")));
        assert!(!accepts(&short, &call("abcd")));
        let one = tools(ToolCallFormat::Qwen3Coder, ToolMode::AtMostOne, false);
        assert!(accepts(&one, &format!("Let me check.\n{xml}")));
        assert!(accepts(&one, "No call needed."));
        assert!(!accepts(&one, &format!("{xml}\n{xml}")));
        let hermes = tools(ToolCallFormat::Hermes, ToolMode::Required, true);
        assert!(accepts(
            &hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        ));
        assert!(!accepts(&hermes, "<tool_call>\n{\"name\": \"get_time\""));
    }

    #[test]
    fn reasoning_is_free_until_think_ends() {
        let c = compiler();
        let g = c.compile(&GrammarSpec::JsonObject).unwrap();
        let mut k = g.constraint(true);
        assert_eq!(k.allowed().unwrap(), None);
        k.commit(c.think_end.unwrap()).unwrap();
        assert!(k.allowed().unwrap().is_some());
    }

    #[test]
    fn drafts_are_checked_after_earlier_drafts_without_committing_them() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
        let tokenizer = Tokenizer::from_dir(&dir).unwrap();
        let c = compiler();
        let g = c
            .compile(&GrammarSpec::Regex(
                "(Yes|No), 91 is (not )?prime\\.".into(),
            ))
            .unwrap();
        let yes = tokenizer.encode("Yes, 91 is not prime.", false).unwrap();
        let no = tokenizer.encode("No", false).unwrap();
        let eos = c.eos[0];
        let mut k = g.constraint(false);
        // Each token of a valid answer is allowed after the ones before it, as drafts.
        for i in 0..yes.len() {
            assert!(k.allows_after(&yes[..i], yes[i]).unwrap(), "token {i}");
            let mask = k.allowed_after(&yes[..i]).unwrap().unwrap();
            assert!(mask.allows(yes[i]), "token {i}");
        }
        assert!(k.allows_after(&yes, eos).unwrap());
        assert!(!k.allows_after(&yes[..1], no[0]).unwrap());
        assert!(!k.allowed_after(&yes[..1]).unwrap().unwrap().allows(no[0]));
        // Nothing was committed: the constraint still starts at the beginning.
        assert!(k.allowed().unwrap().unwrap().allows(no[0]));

        // While reasoning, drafts are free; after a drafted `</think>` the grammar holds.
        let think_end = c.think_end.unwrap();
        let mut r = g.constraint(true);
        assert!(r.allows_after(&[], no[0]).unwrap());
        assert_eq!(r.allowed_after(&yes).unwrap(), None);
        assert!(r.allows_after(&[yes[0], think_end], no[0]).unwrap());
        assert!(!r.allows_after(&[think_end, yes[0]], no[0]).unwrap());
        let mask = r.allowed_after(&[think_end, yes[0]]).unwrap().unwrap();
        assert!(mask.allows(yes[1]) && !mask.allows(no[0]));
    }
}
