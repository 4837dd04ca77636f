//! The part of JSON Schema that plugins' config schemas use, checked against a pipeline's
//! `config` by `weir validate` (see `plugin::metadata`).
//!
//! Why not a JSON Schema crate: a config is a small TOML table and its schema a few lines; the
//! keywords checked here are those that describe such tables (`type`, `enum`, `const`,
//! `properties`, `required`, `additionalProperties`, `items`, `minItems`, `maxItems`, `minimum`,
//! `maximum`, `minLength`, `maxLength`, `anyOf`). Other keywords are ignored, as JSON Schema
//! ignores unknown ones, so a schema using more is checked less, never wrongly refused.

use serde_json::Value;

/// Every way `value` (at key path `path`) breaks `schema`: (path, message).
pub fn check(schema: &Value, value: &Value, path: &str, out: &mut Vec<(String, String)>) {
    let Some(schema) = schema.as_object() else {
        return; // `true`, or a schema this checker cannot read: anything goes.
    };
    if let Some(types) = schema.get("type") {
        let allowed: Vec<&str> = match types {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !allowed.is_empty() && !allowed.iter().any(|t| is_type(value, t)) {
            out.push((
                path.to_owned(),
                format!(
                    "is {}, the plugin takes {}",
                    kind(value),
                    allowed.join(" or ")
                ),
            ));
            return;
        }
    }
    if let Some(Value::Array(options)) = schema.get("enum")
        && !options.contains(value)
    {
        let list: Vec<String> = options.iter().map(Value::to_string).collect();
        out.push((
            path.to_owned(),
            format!("is {value}, the plugin takes one of {}", list.join(", ")),
        ));
    }
    if let Some(c) = schema.get("const")
        && c != value
    {
        out.push((path.to_owned(), format!("is {value}, the plugin takes {c}")));
    }
    if let Some(Value::Array(any)) = schema.get("anyOf") {
        let fits = any.iter().any(|s| {
            let mut inner = Vec::new();
            check(s, value, path, &mut inner);
            inner.is_empty()
        });
        if !fits {
            out.push((
                path.to_owned(),
                format!("{value} fits none of the forms the plugin takes"),
            ));
        }
    }
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            if let Some(Value::Array(required)) = schema.get("required") {
                for key in required.iter().filter_map(Value::as_str) {
                    if !map.contains_key(key) {
                        out.push((join(path, key), "is required by the plugin".to_owned()));
                    }
                }
            }
            for (key, v) in map {
                let at = join(path, key);
                match properties.and_then(|p| p.get(key)) {
                    Some(s) => check(s, v, &at, out),
                    None => match schema.get("additionalProperties") {
                        Some(Value::Bool(false)) => {
                            let known: Vec<&str> = properties
                                .map(|p| p.keys().map(String::as_str).collect())
                                .unwrap_or_default();
                            out.push((
                                at,
                                format!(
                                    "is not a key the plugin takes (it takes: {})",
                                    known.join(", ")
                                ),
                            ));
                        }
                        Some(s @ Value::Object(_)) => check(s, v, &at, out),
                        _ => {}
                    },
                }
            }
        }
        Value::Array(items) => {
            bound(
                schema,
                "minItems",
                "maxItems",
                items.len() as f64,
                path,
                "items",
                out,
            );
            if let Some(s) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    check(s, v, &format!("{path}[{i}]"), out);
                }
            }
        }
        Value::String(s) => {
            bound(
                schema,
                "minLength",
                "maxLength",
                s.chars().count() as f64,
                path,
                "characters",
                out,
            );
        }
        Value::Number(n) => {
            if let Some(x) = n.as_f64() {
                bound(schema, "minimum", "maximum", x, path, "", out);
            }
        }
        _ => {}
    }
}

fn bound(
    schema: &serde_json::Map<String, Value>,
    min: &str,
    max: &str,
    x: f64,
    path: &str,
    unit: &str,
    out: &mut Vec<(String, String)>,
) {
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    };
    if let Some(lo) = schema.get(min).and_then(Value::as_f64)
        && x < lo
    {
        out.push((
            path.to_owned(),
            format!("has {x}{unit}, the plugin takes at least {lo}"),
        ));
    }
    if let Some(hi) = schema.get(max).and_then(Value::as_f64)
        && x > hi
    {
        out.push((
            path.to_owned(),
            format!("has {x}{unit}, the plugin takes at most {hi}"),
        ));
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn is_type(value: &Value, t: &str) -> bool {
    match t {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "number" => value.is_number(),
        "integer" => value.as_i64().is_some() || value.as_u64().is_some(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => true,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "a table",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problems(schema: &Value, value: &Value) -> Vec<String> {
        let mut out = Vec::new();
        check(schema, value, "config", &mut out);
        out.into_iter().map(|(p, m)| format!("{p}: {m}")).collect()
    }

    #[test]
    fn reports_each_problem_with_its_key() {
        let schema = json!({
            "type": "object",
            "properties": {
                "column": {"type": "string", "minLength": 1},
                "op": {"enum": ["eq", "ne"]},
                "limit": {"type": "integer", "minimum": 1, "maximum": 10},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}
            },
            "required": ["column", "op"],
            "additionalProperties": false
        });
        assert!(problems(&schema, &json!({"column": "status", "op": "eq"})).is_empty());
        let got = problems(
            &schema,
            &json!({"column": "", "op": "like", "limit": 11, "tags": ["a", 2, "c"], "x": 1}),
        );
        assert_eq!(
            got,
            [
                "config.column: has 0 characters, the plugin takes at least 1",
                "config.limit: has 11, the plugin takes at most 10",
                "config.op: is \"like\", the plugin takes one of \"eq\", \"ne\"",
                "config.tags: has 3 items, the plugin takes at most 2",
                "config.tags[1]: is a number, the plugin takes string",
                "config.x: is not a key the plugin takes (it takes: column, limit, op, tags)",
            ]
        );
        assert_eq!(
            problems(&schema, &json!({})),
            [
                "config.column: is required by the plugin",
                "config.op: is required by the plugin"
            ]
        );
        assert_eq!(problems(&json!(true), &json!(5)), Vec::<String>::new());
        assert_eq!(
            problems(
                &json!({"anyOf": [{"type": "string"}, {"type": "array"}]}),
                &json!(1)
            ),
            ["config: 1 fits none of the forms the plugin takes"]
        );
    }
}
