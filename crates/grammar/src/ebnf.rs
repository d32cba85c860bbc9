//! SGLang's `ebnf` field holds GBNF (`root ::= "a" item* | [0-9]+`, as xgrammar and llama.cpp write
//! grammars). llguidance reads a Lark dialect, so this rewrites one notation into the other, token by
//! token: rule definitions, string literals, character classes, `.`, groups, alternatives and the
//! repetitions `* + ? {m,n}`. It does not interpret the grammar; llguidance compiles the result.

use std::collections::HashMap;

use crate::GrammarError;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Define,
    /// The literal's text, escapes resolved.
    Literal(String),
    /// A character class as written, brackets included.
    Class(String),
    Any,
    Punct(char),
    /// `{m}`, `{m,}`, `{m,n}` as written.
    Repeat(String),
}

fn error(message: impl Into<String>) -> GrammarError {
    GrammarError(format!("ebnf: {}", message.into()))
}

fn escape(chars: &mut std::iter::Peekable<std::str::Chars>) -> Result<char, GrammarError> {
    let c = chars
        .next()
        .ok_or_else(|| error("a grammar ends inside an escape"))?;
    let hex = |chars: &mut std::iter::Peekable<std::str::Chars>, n: usize| {
        let digits: String = (0..n).filter_map(|_| chars.next()).collect();
        u32::from_str_radix(&digits, 16)
            .ok()
            .and_then(char::from_u32)
            .ok_or_else(|| error(format!("bad escape \\{c}{digits}")))
    };
    Ok(match c {
        'n' => '\n',
        't' => '\t',
        'r' => '\r',
        '0' => '\0',
        'x' => hex(chars, 2)?,
        'u' => hex(chars, 4)?,
        'U' => hex(chars, 8)?,
        other => other,
    })
}

fn lex(text: &str) -> Result<Vec<Tok>, GrammarError> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '#' => while chars.next().is_some_and(|c| c != '\n') {},
            ':' => {
                let op: String = chars.by_ref().take(3).collect();
                if op != "::=" {
                    return Err(error(format!("expected `::=`, found {op:?}")));
                }
                out.push(Tok::Define);
            }
            '"' | '\'' => {
                let quote = c;
                chars.next();
                let mut literal = String::new();
                loop {
                    match chars.next() {
                        None => return Err(error("an unterminated string literal")),
                        Some('\\') => literal.push(escape(&mut chars)?),
                        Some(c) if c == quote => break,
                        Some(c) => literal.push(c),
                    }
                }
                out.push(Tok::Literal(literal));
            }
            '[' => {
                let mut class = String::new();
                loop {
                    match chars.next() {
                        None => return Err(error("an unterminated character class")),
                        Some('\\') => {
                            class.push('\\');
                            class.push(
                                chars
                                    .next()
                                    .ok_or_else(|| error("an unterminated character class"))?,
                            );
                        }
                        Some(']') if class.len() > 1 => {
                            class.push(']');
                            break;
                        }
                        Some(c) => class.push(c),
                    }
                }
                out.push(Tok::Class(class));
            }
            '{' => {
                let mut repeat = String::new();
                for c in chars.by_ref() {
                    repeat.push(c);
                    if c == '}' {
                        break;
                    }
                }
                let inner = repeat.trim_start_matches('{').trim_end_matches('}');
                if !repeat.ends_with('}')
                    || inner.is_empty()
                    || !inner
                        .chars()
                        .all(|c| c.is_ascii_digit() || c == ',' || c == ' ')
                {
                    return Err(error(format!("a bad repetition {repeat:?}")));
                }
                out.push(Tok::Repeat(repeat.replace(' ', "")));
            }
            '.' => {
                chars.next();
                out.push(Tok::Any);
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                chars.next();
                out.push(Tok::Punct(c));
            }
            c if c.is_alphanumeric() || c == '_' || c == '-' => {
                let mut name = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_alphanumeric() || c == '_' || c == '-' {
                        name.push(c);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push(Tok::Name(name));
            }
            other => return Err(error(format!("unexpected character {other:?}"))),
        }
    }
    Ok(out)
}

/// A GBNF grammar in llguidance's Lark syntax; `root` becomes `start`.
pub fn gbnf_to_lark(text: &str) -> Result<String, GrammarError> {
    let tokens = lex(text)?;
    // Lark rule names are lower case; GBNF names may not be. Map each to a distinct one.
    let mut names: HashMap<String, String> = HashMap::new();
    for pair in tokens.windows(2) {
        if let [Tok::Name(name), Tok::Define] = pair {
            let lark = if name == "root" {
                "start".to_string()
            } else {
                let clean: String = name
                    .to_lowercase()
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                    .collect();
                format!("r_{clean}_{}", names.len())
            };
            if names.insert(name.clone(), lark).is_some() {
                return Err(error(format!("the rule {name:?} is defined twice")));
            }
        }
    }
    if !names.contains_key("root") {
        return Err(error("the grammar has no `root` rule"));
    }
    let mut out = String::new();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Tok::Name(name) if tokens.get(i + 1) == Some(&Tok::Define) => {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&names[name]);
                out.push(':');
                i += 2;
                continue;
            }
            _ if out.is_empty() => {
                return Err(error("the grammar must start with a rule definition"))
            }
            Tok::Name(name) => {
                let lark = names
                    .get(name)
                    .ok_or_else(|| error(format!("the rule {name:?} is used but never defined")))?;
                out.push(' ');
                out.push_str(lark);
            }
            Tok::Define => return Err(error("`::=` without a rule name")),
            Tok::Literal(literal) => {
                out.push(' ');
                out.push_str(&serde_json::to_string(literal).unwrap_or_default());
            }
            Tok::Class(class) => {
                out.push_str(" /");
                out.push_str(&class.replace('/', "\\/"));
                out.push('/');
            }
            Tok::Any => out.push_str(" /(?s:.)/"),
            Tok::Punct(c @ ('(' | '|')) => {
                out.push(' ');
                out.push(*c);
            }
            Tok::Punct(c) => out.push(*c),
            Tok::Repeat(repeat) => out.push_str(repeat),
        }
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_rules_literals_classes_and_repetitions() {
        let lark = gbnf_to_lark(
            "# answer\nroot ::= \"yes\" | \"no\\n\" Digits{1,3}\nDigits ::= [0-9] (\",\" [0-9])*",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: \"yes\" | \"no\\n\" r_digits_1{1,3}\nr_digits_1: /[0-9]/ ( \",\" /[0-9]/)*"
        );
        assert!(gbnf_to_lark("item ::= \"a\"").is_err(), "no root");
        assert!(gbnf_to_lark("root ::= missing").is_err());
        assert!(gbnf_to_lark("root ::= \"a").is_err());
    }
}
