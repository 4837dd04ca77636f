//! Replacing a running plugin by a new build, between batches.
//!
//! Operators ship a fixed plugin by overwriting its `.wasm` file; the query
//! must notice cheaply (this runs before every batch), and must never let a
//! build that downstream stages cannot read reach them. Two things live
//! here: [`PluginFile`], which notices a new build (stat first, hash only
//! when the file's size or modification time moved), and
//! [`check_output`], the rule for which declared output schemas may
//! replace which.
//!
//! # The compatibility rule
//! Everything downstream of a transform (the next transforms, the
//! watermark, the stateful operator, the sink) was opened with the old
//! build's declared output schema and keeps it until the query restarts. So
//! a new build is compatible when its declared output holds **every column
//! of the old one, by name, with the same data type, and not nullable where
//! the old one was not**. Columns the new build adds are dropped by the host
//! (a projection, no copy) until the next start, when downstream is opened
//! with the new schema; a column removed, retyped or made nullable is
//! refused, naming the column. A sink has no output, so any build that
//! accepts the sink's input and config replaces it.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use arrow_schema::Schema;
use sha2::{Digest, Sha256};

use super::error::PluginError;

/// A plugin's `.wasm` file, watched for new builds.
#[derive(Debug, Clone)]
pub struct PluginFile {
    name: String,
    path: PathBuf,
    /// The hash of the build that runs.
    sha256: String,
    /// Size and modification time when last looked at.
    seen: Option<(u64, SystemTime)>,
}

/// A build that differs from the one running.
#[derive(Debug, Clone)]
pub struct NewBuild {
    pub bytes: Vec<u8>,
    pub sha256: String,
}

impl PluginFile {
    /// Watches `path`, whose running build has hash `sha256`.
    pub fn new(name: &str, path: &Path, sha256: &str) -> Self {
        Self {
            name: name.to_owned(),
            path: path.to_owned(),
            sha256: sha256.to_owned(),
            seen: stat(path),
        }
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The plugin file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The hash of the build that runs.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The file's content when it holds another build than the running one.
    /// Without `force` the file is only read when its size or modification
    /// time changed since the last look (a `stat`, not a read, per batch);
    /// with `force` (an operator's explicit request) it is always hashed.
    ///
    /// # Errors
    /// [`PluginError::Read`] when the file changed but cannot be read (for
    /// instance while it is being replaced; the next look tries again).
    pub fn new_build(&mut self, force: bool) -> Result<Option<NewBuild>, PluginError> {
        let now = stat(&self.path);
        if !force && now == self.seen {
            return Ok(None);
        }
        let bytes = std::fs::read(&self.path).map_err(|source| PluginError::Read {
            plugin: self.name.clone(),
            path: self.path.clone(),
            source,
        })?;
        self.seen = now;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        if sha256 == self.sha256 {
            return Ok(None);
        }
        Ok(Some(NewBuild { bytes, sha256 }))
    }

    /// Records that the build with `sha256` runs now.
    pub fn adopted(&mut self, sha256: &str) {
        sha256.clone_into(&mut self.sha256);
    }
}

fn stat(path: &Path) -> Option<(u64, SystemTime)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

/// Checks the declared output of a new build (`new`) against the one
/// downstream was opened with (`old`); see the module docs. Returns, for
/// each old column, its index in the new output.
///
/// # Errors
/// Why the new build is incompatible, naming every offending column.
pub(crate) fn check_output(old: &Schema, new: &Schema) -> Result<Vec<usize>, String> {
    let mut projection = Vec::with_capacity(old.fields().len());
    let mut problems = Vec::new();
    for field in old.fields() {
        match new.index_of(field.name()) {
            Err(_) => problems.push(format!(
                "it no longer outputs column {} ({})",
                field.name(),
                field.data_type()
            )),
            Ok(i) => {
                let got = new.field(i);
                if got.data_type() != field.data_type() {
                    problems.push(format!(
                        "column {} changed type from {} to {}",
                        field.name(),
                        field.data_type(),
                        got.data_type()
                    ));
                } else if got.is_nullable() && !field.is_nullable() {
                    problems.push(format!(
                        "column {} became nullable (it was declared not null)",
                        field.name()
                    ));
                }
                projection.push(i);
            }
        }
    }
    if problems.is_empty() {
        Ok(projection)
    } else {
        Err(format!(
            "its output schema is incompatible with the running one, which downstream stages \
             were opened with: {}; restart the query (with a new checkpoint if state depends on \
             it) to change the schema",
            problems.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use arrow_schema::{DataType, Field};

    use super::*;

    fn schema(fields: &[(&str, DataType, bool)]) -> Schema {
        Schema::new(
            fields
                .iter()
                .map(|(n, t, null)| Field::new(*n, t.clone(), *null))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn the_same_columns_in_any_order_plus_new_ones_are_compatible() {
        let old = schema(&[("a", DataType::Int64, false), ("b", DataType::Utf8, true)]);
        let new = schema(&[
            ("c", DataType::Float64, true),
            ("b", DataType::Utf8, true),
            ("a", DataType::Int64, false),
        ]);
        assert_eq!(check_output(&old, &new), Ok(vec![2, 1]));
        assert_eq!(check_output(&old, &old), Ok(vec![0, 1]));
        // Narrowing nullability is fine: downstream accepted nulls it now never gets.
        let narrower = schema(&[("a", DataType::Int64, false), ("b", DataType::Utf8, false)]);
        assert_eq!(check_output(&old, &narrower), Ok(vec![0, 1]));
    }

    #[test]
    fn a_removed_retyped_or_newly_nullable_column_is_refused_by_name() {
        let old = schema(&[
            ("a", DataType::Int64, false),
            ("b", DataType::Utf8, true),
            ("c", DataType::Int32, false),
        ]);
        let new = schema(&[("a", DataType::Int64, true), ("b", DataType::Int64, true)]);
        let err = check_output(&old, &new).unwrap_err();
        assert!(
            err.contains("column a became nullable (it was declared not null)"),
            "{err}"
        );
        assert!(
            err.contains("column b changed type from Utf8 to Int64"),
            "{err}"
        );
        assert!(
            err.contains("it no longer outputs column c (Int32)"),
            "{err}"
        );
    }

    #[test]
    fn a_file_is_hashed_only_when_it_changed_and_then_only_reported_for_a_new_build() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.wasm");
        std::fs::write(&path, b"one").unwrap();
        let one = hex::encode(Sha256::digest(b"one"));
        let mut file = PluginFile::new("p", &path, &one);
        assert!(file.new_build(false).unwrap().is_none());
        assert!(file.new_build(true).unwrap().is_none(), "same content");
        std::fs::write(&path, b"two!").unwrap();
        let build = file.new_build(false).unwrap().expect("a new build");
        assert_eq!(build.bytes, b"two!");
        assert_eq!(build.sha256, hex::encode(Sha256::digest(b"two!")));
        // Not adopted (say, refused): a forced look reports it again, an unforced one does not.
        assert!(file.new_build(false).unwrap().is_none());
        assert!(file.new_build(true).unwrap().is_some());
        file.adopted(&build.sha256);
        assert!(file.new_build(true).unwrap().is_none());
        assert_eq!(file.sha256(), build.sha256);
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            file.new_build(false),
            Err(PluginError::Read { .. })
        ));
    }
}
