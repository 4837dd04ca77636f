//! `weir run FILE --set KEY=VALUE`: changing one key without editing the file.
//!
//! Overrides are applied to the TOML tree before anything is validated, so an overridden value is
//! checked exactly like one written in the file, and a problem with it is reported at its key.
//! Arrays of tables are addressed by name (`source.orders.path`, `transform.keep_completed.config.x`)
//! or by index (`transform.0.limits.memory`), since their position in the file is not a name users
//! think in.

use toml::{Table, Value};

use super::Problem;

/// Applies every override in order; each bad one becomes a problem at `--set <KEY>`.
pub(super) fn apply(root: &mut Table, overrides: &[String], problems: &mut Vec<Problem>) {
    for raw in overrides {
        let Some((key, text)) = raw.split_once('=') else {
            problems.push(Problem::new(
                format!("--set {raw}"),
                "expected KEY=VALUE, e.g. --set source.orders.path=data/in",
            ));
            continue;
        };
        let key = key.trim();
        let segments: Vec<&str> = key.split('.').map(str::trim).collect();
        if segments.iter().any(|s| s.is_empty()) {
            problems.push(Problem::new(
                format!("--set {key}"),
                "the key must be a dotted path such as query.trigger or source.orders.path",
            ));
            continue;
        }
        if let Err(message) = set(root, &segments, 0, parse_value(text)) {
            problems.push(Problem::new(format!("--set {key}"), message));
        }
    }
}

/// The value as TOML when it reads as one (`true`, `5`, `"x"`, `{ a = 1 }`), else the text itself.
fn parse_value(text: &str) -> Value {
    let document = format!("value = {text}");
    if let Ok(mut table) = document.parse::<Table>()
        && table.len() == 1
        && let Some(value) = table.remove("value")
    {
        return value;
    }
    Value::String(text.to_string())
}

/// Sets `segments[at..]` under `table`, creating missing tables on the way.
fn set(table: &mut Table, segments: &[&str], at: usize, value: Value) -> Result<(), String> {
    let walked = |upto: usize| segments[..=upto].join(".");
    let key = segments[at];
    if at + 1 == segments.len() {
        table.insert(key.to_string(), value);
        return Ok(());
    }
    if at == 0
        && matches!(key, "source" | "transform" | "table" | "function")
        && !table.contains_key(key)
    {
        return Err(format!("the file has no [[{key}]] to override"));
    }
    let entry = table
        .entry(key.to_string())
        .or_insert_with(|| Value::Table(Table::new()));
    match entry {
        Value::Table(inner) => set(inner, segments, at + 1, value),
        Value::Array(items) => {
            let selector = segments[at + 1];
            let index = select(items, key, selector)?;
            if at + 2 == segments.len() {
                items[index] = value;
                return Ok(());
            }
            match &mut items[index] {
                Value::Table(inner) => set(inner, segments, at + 2, value),
                other => Err(format!(
                    "{} is a {}, not a table",
                    walked(at + 1),
                    other.type_str()
                )),
            }
        }
        other => Err(format!(
            "{} is a {}, not a table",
            walked(at),
            other.type_str()
        )),
    }
}

/// The element of the array `array` that `selector` names: by its `name`, for transforms also by
/// the plugin's file stem (their default name), else by index.
fn select(items: &[Value], array: &str, selector: &str) -> Result<usize, String> {
    let names: Vec<Option<String>> = items.iter().map(|item| element_name(item, array)).collect();
    let matches: Vec<usize> = names
        .iter()
        .enumerate()
        .filter(|(_, n)| n.as_deref() == Some(selector))
        .map(|(i, _)| i)
        .collect();
    match matches.as_slice() {
        [index] => return Ok(*index),
        [_, _, ..] => {
            return Err(format!(
                "{} [[{array}]] tables are named {selector:?}: address one by its index instead",
                matches.len()
            ));
        }
        [] => {}
    }
    if let Ok(index) = selector.parse::<usize>()
        && index < items.len()
    {
        return Ok(index);
    }
    let known: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| n.clone().unwrap_or_else(|| i.to_string()))
        .collect();
    Err(format!(
        "no [[{array}]] named {selector:?} (known: {})",
        known.join(", ")
    ))
}

fn element_name(item: &Value, array: &str) -> Option<String> {
    if let Some(name) = item.get("name").and_then(Value::as_str) {
        return Some(name.to_string());
    }
    if array == "transform" {
        let plugin = item.get("plugin").and_then(Value::as_str)?;
        return std::path::Path::new(plugin)
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply_one(text: &str, set: &str) -> (Table, Vec<Problem>) {
        let mut table: Table = text.parse().unwrap();
        let mut problems = Vec::new();
        apply(&mut table, &[set.to_string()], &mut problems);
        (table, problems)
    }

    #[test]
    fn values_are_toml_when_they_parse() {
        assert_eq!(parse_value("true"), Value::Boolean(true));
        assert_eq!(parse_value("5"), Value::Integer(5));
        assert_eq!(parse_value("\"x y\""), Value::String("x y".into()));
        assert_eq!(
            parse_value("data/orders"),
            Value::String("data/orders".into())
        );
        assert_eq!(parse_value("30s"), Value::String("30s".into()));
        assert_eq!(parse_value(""), Value::String(String::new()));
        let Value::Table(t) = parse_value("{ a = 1 }") else {
            panic!("not a table")
        };
        assert_eq!(t.get("a"), Some(&Value::Integer(1)));
        // Text that would add a second key stays a string.
        assert_eq!(parse_value("1\nb = 2"), Value::String("1\nb = 2".into()));
    }

    #[test]
    fn creates_missing_tables() {
        let (table, problems) = apply_one("[sink]\nkind = \"plugin\"", "sink.config.x.y=3");
        assert!(problems.is_empty());
        assert_eq!(table["sink"]["config"]["x"]["y"], Value::Integer(3));
    }

    #[test]
    fn addresses_transforms_by_name_stem_and_index() {
        let text = "[[transform]]\nplugin = \"p/filter_rows.wasm\"\n[[transform]]\nname = \"b\"\nplugin = \"p/x.wasm\"";
        let (t, p) = apply_one(text, "transform.filter_rows.config.column=status");
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(
            t["transform"][0]["config"]["column"].as_str(),
            Some("status")
        );
        let (t, p) = apply_one(text, "transform.b.limits={ fuel = 5 }");
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(t["transform"][1]["limits"]["fuel"].as_integer(), Some(5));
        let (t, p) = apply_one(text, "transform.1.name=c");
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(t["transform"][1]["name"].as_str(), Some("c"));
    }

    #[test]
    fn bad_overrides_are_problems_at_their_key() {
        let text = "[query]\nname = \"q\"\n[[source]]\nname = \"orders\"";
        let (_, p) = apply_one(text, "source.nope.path=x");
        assert_eq!(
            p,
            vec![Problem::new(
                "--set source.nope.path",
                "no [[source]] named \"nope\" (known: orders)"
            )]
        );
        let (_, p) = apply_one(text, "query.name.x=1");
        assert_eq!(p[0].message, "query.name is a string, not a table");
        let (_, p) = apply_one(text, "no-equals-sign");
        assert_eq!(p[0].path, "--set no-equals-sign");
        let (_, p) = apply_one(text, "query..name=x");
        assert_eq!(p[0].path, "--set query..name");
        let (_, p) = apply_one(text, "transform.x.plugin=a.wasm");
        assert_eq!(p[0].message, "the file has no [[transform]] to override");
    }
}
