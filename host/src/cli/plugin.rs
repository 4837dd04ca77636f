//! `weir plugin inspect FILE`: what a component is before anyone runs it: its hash, the Weir
//! world it implements, its metadata (name, version, description, config schema) and every
//! import and export.

use std::path::Path;
use std::process::ExitCode;

use sha2::{Digest, Sha256};

use super::{complain, say};
use crate::plugin::{PluginMetadata, read_metadata};

/// What the inspection found.
#[derive(Debug, serde::Serialize)]
struct Inspection {
    file: String,
    sha256: String,
    bytes: usize,
    world: Option<&'static str>,
    metadata: Option<Metadata>,
    imports: Vec<String>,
    exports: Vec<String>,
}

#[derive(Debug, serde::Serialize)]
struct Metadata {
    name: String,
    version: String,
    description: String,
    config_schema: Option<serde_json::Value>,
}

impl From<PluginMetadata> for Metadata {
    fn from(m: PluginMetadata) -> Self {
        Self {
            name: m.name,
            version: m.version,
            description: m.description,
            config_schema: m.config_schema,
        }
    }
}

/// The Weir world a component's exports and imports make it.
fn world(imports: &[String], exports: &[String]) -> Option<&'static str> {
    let exports_ = |i: &str| {
        exports
            .iter()
            .any(|e| e.starts_with(&format!("weir:plugin/{i}@")))
    };
    let imports_ = |i: &str| {
        imports
            .iter()
            .any(|e| e.starts_with(&format!("weir:plugin/{i}@")))
    };
    if exports_("transformer") {
        Some(if imports_("keyed-state") {
            "stateful-transform"
        } else {
            "transform"
        })
    } else if exports_("writer") {
        Some(if imports_("delta-merge") {
            "merge-sink"
        } else {
            "sink"
        })
    } else if exports_("scalar") {
        Some("scalar-function")
    } else if exports_("query-events") {
        Some("listener")
    } else {
        None
    }
}

fn inspection(file: &Path) -> Result<Inspection, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read it: {e}"))?;
    let metadata = read_metadata(&bytes)?.map(Metadata::from);
    let engine = wasmtime::Engine::default();
    let component = wasmtime::component::Component::from_binary(&engine, &bytes)
        .map_err(|e| format!("not a WebAssembly component: {e:#}"))?;
    let ty = component.component_type();
    let imports: Vec<String> = ty.imports(&engine).map(|(n, _)| n.to_owned()).collect();
    let exports: Vec<String> = ty.exports(&engine).map(|(n, _)| n.to_owned()).collect();
    Ok(Inspection {
        file: file.display().to_string(),
        sha256: hex::encode(Sha256::digest(&bytes)),
        bytes: bytes.len(),
        world: world(&imports, &exports),
        metadata,
        imports,
        exports,
    })
}

pub(super) fn inspect(file: &Path, json: bool) -> ExitCode {
    let found = match inspection(file) {
        Ok(found) => found,
        Err(e) => {
            complain(&format!("{}: {e}", file.display()));
            return ExitCode::from(1);
        }
    };
    if json {
        match serde_json::to_string_pretty(&found) {
            Ok(text) => say(&text),
            Err(e) => {
                complain(&e.to_string());
                return ExitCode::from(1);
            }
        }
        return ExitCode::SUCCESS;
    }
    let mut text = format!(
        "{}\n  sha256   {}\n  size     {} bytes\n  world    {}\n",
        found.file,
        found.sha256,
        found.bytes,
        found.world.map_or(
            "none of Weir's (weir:plugin@0.1.0)".to_owned(),
            |w| format!("{w} (weir:plugin@0.1.0)")
        ),
    );
    match &found.metadata {
        Some(m) => {
            text.push_str(&format!("  name     {} {}\n", m.name, m.version));
            if !m.description.is_empty() {
                text.push_str(&format!("  about    {}\n", m.description));
            }
            if let Some(schema) = &m.config_schema {
                let pretty = serde_json::to_string_pretty(schema).unwrap_or_default();
                text.push_str(&format!(
                    "  config   {}\n",
                    pretty.replace('\n', "\n           ")
                ));
            }
        }
        None => text.push_str("  metadata none (weir_plugin_sdk::plugin_metadata! adds it)\n"),
    }
    text.push_str(&format!(
        "  imports  {}\n",
        found.imports.join("\n           ")
    ));
    text.push_str(&format!(
        "  exports  {}",
        found.exports.join("\n           ")
    ));
    say(&text);
    ExitCode::SUCCESS
}
