//! A plugin's metadata: its name, version, description and a JSON Schema of its `config`, in the
//! component's custom section `weir:metadata` (the SDK's `plugin_metadata!` puts it there).
//!
//! Why a custom section rather than an exported function: it is read without compiling or
//! running anything, so `weir validate` can check a pipeline's `config` against a plugin it
//! does not trust, and a component without the section is simply a plugin without metadata.
//! The section may sit in the component or in a core module nested in it (where a language's
//! linker leaves it); the first one found counts.

use serde::Deserialize;

/// The custom section's name.
pub const SECTION: &str = "weir:metadata";

/// What a plugin says of itself.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginMetadata {
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub description: String,
    /// A JSON Schema of its `config` (the keywords `spec::json_schema` checks).
    #[serde(default)]
    pub config_schema: Option<serde_json::Value>,
}

/// Reads the metadata of the component (or core module) `bytes`.
///
/// # Errors
/// A sentence when the binary is not WebAssembly, is cut short, or its section is not metadata.
pub fn read_metadata(bytes: &[u8]) -> Result<Option<PluginMetadata>, String> {
    let Some(raw) = find_section(bytes, SECTION, 0)? else {
        return Ok(None);
    };
    serde_json::from_slice(raw)
        .map(Some)
        .map_err(|e| format!("its {SECTION} section is not plugin metadata: {e}"))
}

/// Nested components and modules deeper than this are not searched.
const MAX_DEPTH: usize = 8;

/// The payload of the first custom section `name` in `bytes` or in the modules and components
/// nested in it.
fn find_section<'a>(bytes: &'a [u8], name: &str, depth: usize) -> Result<Option<&'a [u8]>, String> {
    if bytes.get(..4) != Some(b"\0asm") || bytes.len() < 8 {
        return Err("not a WebAssembly binary".into());
    }
    let component = bytes[4..8] != [1, 0, 0, 0];
    let mut at = 8;
    let mut nested = Vec::new();
    while at < bytes.len() {
        let id = bytes[at];
        at += 1;
        let size = leb_u32(bytes, &mut at)? as usize;
        let end = at
            .checked_add(size)
            .filter(|e| *e <= bytes.len())
            .ok_or("a section runs past the end of the binary")?;
        let payload = &bytes[at..end];
        if id == 0 {
            let mut p = 0;
            let len = leb_u32(payload, &mut p)? as usize;
            let section = payload
                .get(p..p + len)
                .ok_or("a custom section's name runs past its end")?;
            if section == name.as_bytes() {
                return Ok(Some(&payload[p + len..]));
            }
        } else if component && (id == 1 || id == 4) {
            // A nested core module (1) or component (4): searched after this level.
            nested.push(payload);
        }
        at = end;
    }
    if depth < MAX_DEPTH {
        for inner in nested {
            if let Some(found) = find_section(inner, name, depth + 1)? {
                return Ok(Some(found));
            }
        }
    }
    Ok(None)
}

fn leb_u32(bytes: &[u8], at: &mut usize) -> Result<u32, String> {
    let mut value: u32 = 0;
    for shift in (0..35).step_by(7) {
        let byte = *bytes.get(*at).ok_or("a section size runs past the end")?;
        *at += 1;
        value |= u32::from(byte & 0x7f)
            .checked_shl(shift)
            .ok_or("a section size is too large")?;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a section size is not LEB128".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn custom(name: &str, payload: &[u8]) -> Vec<u8> {
        let mut body = vec![u8::try_from(name.len()).unwrap()];
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(payload);
        let mut out = vec![0, u8::try_from(body.len()).unwrap()];
        out.extend(body);
        out
    }

    #[test]
    fn finds_the_section_in_a_nested_module() {
        let meta = br#"{"name":"x","version":"1","config_schema":{"type":"object"}}"#;
        let mut module = b"\0asm\x01\0\0\0".to_vec();
        module.extend(custom("other", b"zz"));
        module.extend(custom(SECTION, meta));
        let mut component = b"\0asm\x0d\0\x01\0".to_vec();
        component.push(1);
        component.push(u8::try_from(module.len()).unwrap());
        component.extend(&module);
        let m = read_metadata(&component).unwrap().unwrap();
        assert_eq!((m.name.as_str(), m.version.as_str()), ("x", "1"));
        assert!(m.config_schema.is_some());
        assert_eq!(read_metadata(b"\0asm\x0d\0\x01\0").unwrap(), None);
        assert!(read_metadata(b"nope").is_err());
        let mut cut = b"\0asm\x0d\0\x01\0".to_vec();
        cut.extend([0, 50, 1]);
        assert!(read_metadata(&cut).is_err());
    }

    #[test]
    fn the_filter_plugin_carries_its_metadata() {
        let m = read_metadata(crate::examples::FILTER_ROWS_WASM)
            .unwrap()
            .expect("filter_rows has metadata");
        assert_eq!(m.name, "filter_rows");
        assert!(m.config_schema.is_some());
    }
}
