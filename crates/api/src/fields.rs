//! Typed reading of request JSON fields with OpenAI errors that name the field, what was expected and
//! what was found. JSON `null` reads as absent (clients send it for unset fields); unknown fields are
//! ignored. It knows nothing about what a field means.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// The top-level object of a request body.
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
}

/// A short description of a JSON value for error messages.
pub fn describe(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 60 {
        let cut: String = text.chars().take(57).collect();
        format!("{cut}...")
    } else {
        text
    }
}

fn wrong_type(name: &str, expected: &str, found: &Value) -> ApiError {
    ApiError::invalid(
        name,
        format!("`{name}` must be {expected}, found {}", describe(found)),
    )
}

impl<'a> Fields<'a> {
    /// The body must be a JSON object.
    pub fn of(body: &'a Value) -> Result<Self, ApiError> {
        match body {
            Value::Object(map) => Ok(Self { map }),
            other => Err(ApiError::bad_request(format!(
                "The request body must be a JSON object, found {}",
                describe(other)
            ))),
        }
    }

    /// The raw value, `None` when absent or null.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.get(name)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| wrong_type(name, "true or false", v))
            })
            .transpose()
    }

    pub fn string(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        self.get(name)
            .map(|v| v.as_str().ok_or_else(|| wrong_type(name, "a string", v)))
            .transpose()
    }

    pub fn float(&self, name: &str) -> Result<Option<f64>, ApiError> {
        self.get(name)
            .map(|v| {
                v.as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| wrong_type(name, "a number", v))
            })
            .transpose()
    }

    /// A number checked against an inclusive range.
    pub fn float_in(&self, name: &str, low: f64, high: f64) -> Result<Option<f64>, ApiError> {
        let value = self.float(name)?;
        if let Some(x) = value {
            if x < low || x > high {
                return Err(ApiError::invalid(
                    name,
                    format!("`{name}` must be between {low} and {high}, found {x}"),
                ));
            }
        }
        Ok(value)
    }

    pub fn int(&self, name: &str) -> Result<Option<i64>, ApiError> {
        self.get(name)
            .map(|v| match v {
                Value::Number(n) => n
                    .as_i64()
                    .or_else(|| {
                        n.as_f64()
                            .filter(|x| x.fract() == 0.0 && x.abs() < 9e15)
                            .map(|x| x as i64)
                    })
                    .ok_or_else(|| wrong_type(name, "an integer", v)),
                _ => Err(wrong_type(name, "an integer", v)),
            })
            .transpose()
    }

    /// An integer of at least `min`.
    pub fn count(&self, name: &str, min: i64) -> Result<Option<usize>, ApiError> {
        match self.int(name)? {
            None => Ok(None),
            Some(n) if n < min => Err(ApiError::invalid(
                name,
                format!("`{name}` must be at least {min}, found {n}"),
            )),
            Some(n) => usize::try_from(n)
                .map(Some)
                .map_err(|_| ApiError::invalid(name, format!("`{name}` is too large: {n}"))),
        }
    }

    pub fn object(&self, name: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
        self.get(name)
            .map(|v| {
                v.as_object()
                    .ok_or_else(|| wrong_type(name, "an object", v))
            })
            .transpose()
    }

    pub fn array(&self, name: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        self.get(name)
            .map(|v| v.as_array().ok_or_else(|| wrong_type(name, "an array", v)))
            .transpose()
    }

    /// A string or a list of strings (OpenAI's `stop`).
    pub fn string_or_list(&self, name: &str) -> Result<Vec<String>, ApiError> {
        let expected = "a string or an array of strings";
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| {
                    item.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| wrong_type(name, expected, item))
                })
                .collect(),
            Some(other) => Err(wrong_type(name, expected, other)),
        }
    }

    /// A list of token ids.
    pub fn token_ids(&self, name: &str) -> Result<Vec<u32>, ApiError> {
        let Some(items) = self.array(name)? else {
            return Ok(Vec::new());
        };
        items
            .iter()
            .map(|item| {
                item.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| {
                        wrong_type(name, "an array of token ids (non-negative integers)", item)
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn null_is_absent_and_types_are_checked() {
        let body = json!({"a": null, "t": "hot", "x": 0.5, "n": 3, "f": 2.0, "l": ["s", 1]});
        let f = Fields::of(&body).unwrap();
        assert_eq!(f.float("a").unwrap(), None);
        let err = f.float("t").unwrap_err();
        assert_eq!(err.param.as_deref(), Some("t"));
        assert!(err.message.contains("\"hot\""), "{}", err.message);
        assert_eq!(f.int("f").unwrap(), Some(2));
        assert!(f.int("x").is_err());
        assert_eq!(f.count("n", 1).unwrap(), Some(3));
        assert!(f.count("n", 4).unwrap_err().message.contains("at least 4"));
        assert!(f.string_or_list("l").is_err());
        assert!(f
            .float_in("x", 0.6, 1.0)
            .unwrap_err()
            .message
            .contains("0.5"));
        assert!(Fields::of(&json!([1])).is_err());
    }
}
