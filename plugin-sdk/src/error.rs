//! A plugin's failure as a value (STYLE habit 4): the kind tells the host whether a retry can
//! help, and the row, when given, lets the host point at the offending input.

/// How the host should treat a [`PluginError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The plugin cannot process this batch; retrying will not help.
    Fatal,
    /// A transient failure (e.g. a remote service was down): the host may retry the batch.
    Retryable,
    /// The plugin's `config` was rejected.
    InvalidConfig,
    /// The batch did not have the shape the plugin needs (a missing column, a wrong type).
    InvalidInput,
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Fatal => "fatal",
            Self::Retryable => "retryable",
            Self::InvalidConfig => "invalid config",
            Self::InvalidInput => "invalid input",
        })
    }
}

/// An error a plugin returns to the host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}{}", row.map(|r| format!(" (row {r})")).unwrap_or_default())]
pub struct PluginError {
    /// How the host should treat it.
    pub kind: ErrorKind,
    /// What went wrong, for a human.
    pub message: String,
    /// The failing row of the batch, when one row is to blame.
    pub row: Option<u32>,
}

impl PluginError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            row: None,
        }
    }

    /// The plugin cannot process this batch; retrying will not help.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Fatal, message)
    }

    /// A transient failure: the host may retry the batch.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Retryable, message)
    }

    /// The plugin's configuration was rejected.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidConfig, message)
    }

    /// The batch did not have the shape the plugin needs.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    /// This error, blaming row `row` of the batch (rows past `u32::MAX` are reported as `u32::MAX`;
    /// a batch never has that many).
    #[must_use]
    pub fn at_row(mut self, row: usize) -> Self {
        self.row = Some(u32::try_from(row).unwrap_or(u32::MAX));
        self
    }
}

/// Deserialises a plugin's JSON `config` into its `Config` type. An empty string reads as `{}`.
///
/// # Errors
/// [`ErrorKind::InvalidConfig`] with serde's message, prefixed by the path of the offending key
/// (`map.canceled: invalid type: ...`) when there is one.
pub fn parse_config<C: serde::de::DeserializeOwned>(json: &str) -> Result<C, PluginError> {
    let json = if json.trim().is_empty() { "{}" } else { json };
    let mut de = serde_json::Deserializer::from_str(json);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            PluginError::invalid_config(format!("config: {inner}"))
        } else {
            PluginError::invalid_config(format!("config.{path}: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| PluginError::invalid_config(format!("config: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code, reason = "fields are only deserialised")]
    struct Config {
        column: String,
        #[serde(default)]
        map: std::collections::BTreeMap<String, String>,
    }

    #[test]
    fn config_errors_name_the_field() {
        let e = parse_config::<Config>(r#"{"column": 3}"#).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidConfig);
        assert!(
            e.message
                .starts_with("config.column: invalid type: integer `3`"),
            "{e}"
        );
        let e = parse_config::<Config>(r#"{"column": "a", "map": {"x": 1}}"#).unwrap_err();
        assert!(e.message.starts_with("config.map.x: invalid type"), "{e}");
        let e = parse_config::<Config>(r#"{"colum": "a"}"#).unwrap_err();
        assert!(e.message.contains("unknown field `colum`"), "{e}");
        let e = parse_config::<Config>("").unwrap_err();
        assert!(e.message.contains("missing field `column`"), "{e}");
    }

    #[test]
    fn display_names_kind_and_row() {
        let e = PluginError::invalid_input("bad amount").at_row(7);
        assert_eq!(e.to_string(), "invalid input: bad amount (row 7)");
        assert_eq!(e.row, Some(7));
    }
}
