//! Python's text forms of template values: `repr()`/`str()` and `json.dumps(...)` with its exact spacing,
//! escaping and float formatting, so that minijinja prints what HF's jinja2 prints. Formatting only; the
//! template environment that uses it lives in chat_template.rs.

use std::fmt::Write as _;

use minijinja::value::{Value, ValueKind};

/// Options of Python's `json.dumps` that HF's `tojson` filter exposes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JsonOptions {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(unit)`: one item per line, each level indented by `unit`.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl JsonOptions {
    /// `json.dumps` defaults for the given indent: separators `", "`/`": "` on one line, `","`/`": "`
    /// when indenting (the trailing space would end up before each newline).
    pub fn python_defaults(ensure_ascii: bool, indent: Option<String>) -> Self {
        let item_separator = if indent.is_some() { "," } else { ", " };
        Self {
            ensure_ascii,
            indent,
            item_separator: item_separator.to_string(),
            key_separator: ": ".to_string(),
            sort_keys: false,
        }
    }
}

/// Why a value has no JSON form (Python raises `TypeError` for the same values).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("object of kind {kind} is not JSON serializable")]
pub(crate) struct NotJsonSerializable {
    pub kind: String,
}

/// `json.dumps(value, ensure_ascii=.., indent=.., separators=.., sort_keys=..)`.
pub(crate) fn json_dumps(
    value: &Value,
    options: &JsonOptions,
) -> Result<String, NotJsonSerializable> {
    let mut out = String::new();
    write_json(&mut out, value, options, 0)?;
    Ok(out)
}

fn write_json(
    out: &mut String,
    value: &Value,
    options: &JsonOptions,
    depth: usize,
) -> Result<(), NotJsonSerializable> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&json_number(value)),
        ValueKind::String => write_json_string(
            out,
            value.as_str().unwrap_or_default(),
            options.ensure_ascii,
        ),
        ValueKind::Seq => {
            let items = iterate(value)?;
            write_container(out, '[', ']', &items, options, depth, |out, item, depth| {
                write_json(out, item, options, depth)
            })?;
        }
        ValueKind::Map => {
            let mut pairs = Vec::new();
            for key in iterate(value)? {
                let item = value.get_item(&key).map_err(|_| not_serializable(&key))?;
                pairs.push((json_key(&key)?, item));
            }
            if options.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(
                out,
                '{',
                '}',
                &pairs,
                options,
                depth,
                |out, (key, item), depth| {
                    write_json_string(out, key, options.ensure_ascii);
                    out.push_str(&options.key_separator);
                    write_json(out, item, options, depth)
                },
            )?;
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    open: char,
    close: char,
    items: &[T],
    options: &JsonOptions,
    depth: usize,
    mut write_item: impl FnMut(&mut String, &T, usize) -> Result<(), NotJsonSerializable>,
) -> Result<(), NotJsonSerializable> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(unit) = &options.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(unit);
            }
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&options.item_separator);
        }
        newline(out, depth + 1);
        write_item(out, item, depth + 1)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

fn iterate(value: &Value) -> Result<Vec<Value>, NotJsonSerializable> {
    value
        .try_iter()
        .map(Iterator::collect)
        .map_err(|_| not_serializable(value))
}

/// Python converts str, int, float, bool and None keys to strings; anything else is a TypeError.
fn json_key(key: &Value) -> Result<String, NotJsonSerializable> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Number => Ok(json_number(key)),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        _ => Err(not_serializable(key)),
    }
}

fn not_serializable(value: &Value) -> NotJsonSerializable {
    NotJsonSerializable {
        kind: value.kind().to_string(),
    }
}

fn json_number(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(x) if x.is_nan() => "NaN".to_string(),
        Ok(x) if x.is_infinite() => if x > 0.0 { "Infinity" } else { "-Infinity" }.to_string(),
        Ok(x) => float_repr(x),
        Err(_) => value.to_string(),
    }
}

fn write_json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    // Writing to a String cannot fail.
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional for exponents in [-4, 16),
/// scientific (`1e+16`, `1.5e-05`) outside, always with a `.0` or an exponent.
pub(crate) fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    // Rust's `{:e}` prints the shortest round-trip digits, e.g. "-1.5e-5", "1e20", "0e0".
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exponent) {
        let point = exponent + 1;
        if point <= 0 {
            format!(
                "{sign}0.{}{digits}",
                "0".repeat(point.unsigned_abs() as usize)
            )
        } else {
            let point = point as usize;
            if digits.len() <= point {
                format!("{sign}{digits}{}.0", "0".repeat(point - digits.len()))
            } else {
                format!("{sign}{}.{}", &digits[..point], &digits[point..])
            }
        }
    } else {
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exponent.unsigned_abs())
    }
}

/// Python's `str(value)` for the values a template prints: strings as they are, the rest as `repr`.
pub(crate) fn python_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => python_repr(value),
    }
}

/// Python's `repr(value)`: `None`, `True`, `1.0`, `'text'`, `[1, 'a']`, `{'k': 'v'}`.
pub(crate) fn python_repr(value: &Value) -> String {
    match value.kind() {
        ValueKind::None => "None".to_string(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.to_string(),
        ValueKind::Number if value.is_integer() => value.to_string(),
        ValueKind::Number => f64::try_from(value.clone())
            .map(float_repr)
            .unwrap_or_else(|_| value.to_string()),
        ValueKind::String => string_repr(value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            let items: Vec<String> = value
                .try_iter()
                .map(|it| it.map(|v| python_repr(&v)).collect())
                .unwrap_or_default();
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let items: Vec<String> = value
                .try_iter()
                .map(|it| {
                    it.map(|k| {
                        let v = value.get_item(&k).unwrap_or_default();
                        format!("{}: {}", python_repr(&k), python_repr(&v))
                    })
                    .collect()
                })
                .unwrap_or_default();
            format!("{{{}}}", items.join(", "))
        }
        _ => value.to_string(),
    }
}

fn string_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(json: &str, options: &JsonOptions) -> String {
        let value = Value::from_serialize(serde_json::from_str::<serde_json::Value>(json).unwrap());
        json_dumps(&value, options).unwrap()
    }

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are Python 3 `repr(float(x))`.
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (1.0 / 3.0, "0.3333333333333333"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.125, "123456789.125"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (-2.5e100, "-2.5e+100"),
            (5e-324, "5e-324"),
            (f64::INFINITY, "inf"),
        ];
        for (x, expected) in cases {
            assert_eq!(float_repr(x), expected, "repr({x:e})");
        }
    }

    #[test]
    fn json_dumps_matches_python_defaults() {
        let options = JsonOptions::python_defaults(false, None);
        // Python: json.dumps(v, ensure_ascii=False)
        assert_eq!(
            dumps(
                r#"{"b": [1, 2.0, true, null], "a": {"x": "é\n\"<&>\u0001"}}"#,
                &options
            ),
            "{\"b\": [1, 2.0, true, null], \"a\": {\"x\": \"é\\n\\\"<&>\\u0001\"}}"
        );
        assert_eq!(dumps("[]", &options), "[]");
        assert_eq!(dumps("{}", &options), "{}");
        assert_eq!(dumps("1e20", &options), "1e+20");
    }

    #[test]
    fn json_dumps_indent_sort_and_ascii() {
        // Python: json.dumps({"b": [1, {}], "a": "日😀"}, indent=2, sort_keys=True, ensure_ascii=True)
        let mut options = JsonOptions::python_defaults(true, Some("  ".to_string()));
        options.sort_keys = true;
        assert_eq!(
            dumps(r#"{"b": [1, {}], "a": "日😀"}"#, &options),
            "{\n  \"a\": \"\\u65e5\\ud83d\\ude00\",\n  \"b\": [\n    1,\n    {}\n  ]\n}"
        );
        // Python: json.dumps([1, [2]], separators=(",", ":"))
        let compact = JsonOptions {
            item_separator: ",".into(),
            key_separator: ":".into(),
            ..JsonOptions::python_defaults(false, None)
        };
        assert_eq!(
            dumps(r#"[1, [2], {"k": 3}]"#, &compact),
            "[1,[2],{\"k\":3}]"
        );
    }

    #[test]
    fn undefined_is_not_serializable() {
        let options = JsonOptions::python_defaults(false, None);
        assert!(json_dumps(&Value::UNDEFINED, &options).is_err());
    }

    #[test]
    fn repr_matches_python() {
        let value = Value::from_serialize(
            serde_json::json!([null, true, 1, 1.5, "it's", "a\"b'c", {"k": "v"}]),
        );
        assert_eq!(
            python_repr(&value),
            r#"[None, True, 1, 1.5, "it's", 'a"b\'c', {'k': 'v'}]"#
        );
        assert_eq!(python_str(&Value::from("plain")), "plain");
        assert_eq!(python_str(&Value::from(false)), "False");
    }
}
