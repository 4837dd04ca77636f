//! Reading the Delta tables the tests write, twice: with Weir's own reader and with an
//! independent one, the Python `deltalake` package, so that a table only our own code can
//! read does not pass. `.ci/run` installs the Python reader; missing, it is a failure that
//! names the install step, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use serde_json::Value;

/// The Python that has `deltalake` and `pyarrow`: `$WEIR_DELTA_PYTHON` (set by `.ci/run`), else
/// the venv `.ci/run` creates under `$HOME/.cache/weir/venv`. Missing is a failure, not a skip.
pub fn python() -> Result<PathBuf> {
    const INSTALL: &str = "run `bash .ci/run`, or `source scripts/setup.sh; weir_setup_tests` \
        (either creates $HOME/.cache/weir/venv from the hash-pinned \
        scripts/requirements/deltalake.txt), or set WEIR_DELTA_PYTHON to a python that has \
        both packages";
    let python = match std::env::var_os("WEIR_DELTA_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME").context("HOME is not set")?;
            PathBuf::from(home).join(".cache/weir/venv/bin/python")
        }
    };
    let probe = Command::new(&python)
        .args(["-c", "import deltalake, pyarrow"])
        .output();
    match probe {
        Ok(out) if out.status.success() => Ok(python),
        Ok(out) => bail!(
            "{} cannot import deltalake and pyarrow ({}): {INSTALL}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => bail!(
            "no Python for the independent Delta reader at {} ({e}): {INSTALL}",
            python.display()
        ),
    }
}

/// What the Python `deltalake` package sees in the table.
const PY_READER: &str = r#"
import json, os, sys
import pyarrow as pa
from deltalake import DeltaTable
t = DeltaTable(sys.argv[1])
data = t.to_pyarrow_table()
cols = data.column_names
out = {
    "version": t.version(),
    "rows": data.num_rows,
    "columns": cols,
    "types": [str(f.type) for f in data.schema],
    "partition_columns": t.metadata().partition_columns,
    "txn": t.transaction_version(sys.argv[2]),
    "operations": [h.get("operation") for h in sorted(t.history(), key=lambda h: h["version"])],
}
for c in sys.argv[3:]:
    out[c] = data.column(c).to_pylist()
# Every row whole, in the form of weir_tests::canonical_rows: decimals as exact text,
# timestamps as microseconds since the epoch, dates as days since it.
def canonical(field, column):
    if pa.types.is_timestamp(field.type):
        column = column.cast(pa.timestamp("us", tz=field.type.tz)).cast(pa.int64())
    elif pa.types.is_date32(field.type):
        column = column.cast(pa.int32())
    elif pa.types.is_decimal(field.type):
        return [None if v is None else format(v, "f") for v in column.to_pylist()]
    return column.to_pylist()
values = [canonical(f, data.column(f.name)) for f in data.schema]
out["row_values"] = [dict(zip(cols, row)) for row in zip(*values)]
print(json.dumps(out, default=str))
sys.stdout.flush()
# Leave without interpreter finalisation: deltalake's runtime threads can
# abort the process there ("terminate called without an active exception"),
# after the answer is complete.
os._exit(0)
"#;

pub fn py_read(table: &Path, app_id: &str, columns: &[&str]) -> Result<Value> {
    let mut args = vec![app_id];
    args.extend_from_slice(columns);
    py_json(PY_READER, table, &args)
}

/// Runs the Python `script` (which has `deltalake`) with `table` and `args` as its arguments,
/// and parses the JSON it prints.
pub fn py_json(script: &str, table: &Path, args: &[&str]) -> Result<Value> {
    let python = python()?;
    let out = Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(table)
        .args(args)
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    ensure!(
        out.status.success(),
        "the Python deltalake reader failed on {}:\n{}",
        table.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Every row of the table, whole, as the Python reader ([`py_read`]'s answer `py`) sees it: in
/// the canonical form and order of [`crate::canonical_rows`].
pub fn py_rows(py: &Value) -> Result<Vec<Value>> {
    let rows = py["row_values"]
        .as_array()
        .context("the Python reader's answer has no row_values")?;
    Ok(crate::sort_rows(rows.clone()))
}

/// Every row of the table, whole, by our own reader, in the canonical form and order of
/// [`crate::canonical_rows`].
pub fn own_rows(table: &Path) -> Result<Vec<Value>> {
    let (_, batches) = weir_host::source::delta::read_table(table)?;
    crate::canonical_rows(&batches)
}

/// The table's rows by our own reader, as the values of an BIGINT column.
pub fn own_ids(table: &Path, column: &str) -> Result<Vec<i64>> {
    let (_, batches) = weir_host::source::delta::read_table(table)?;
    let mut ids = Vec::new();
    for b in &batches {
        let col = b
            .column_by_name(column)
            .with_context(|| format!("no column {column}"))?;
        ids.extend(col.as_primitive::<Int64Type>().iter().flatten());
    }
    ids.sort_unstable();
    Ok(ids)
}

/// The JSON actions of each commit file of the table, by version.
pub fn commits(table: &Path) -> Result<Vec<Vec<Value>>> {
    let mut out = Vec::new();
    for v in 0.. {
        let file = table.join(format!("_delta_log/{v:020}.json"));
        if !file.exists() {
            break;
        }
        let text = std::fs::read_to_string(&file)?;
        out.push(
            text.lines()
                .map(serde_json::from_str)
                .collect::<Result<Vec<Value>, _>>()?,
        );
    }
    Ok(out)
}

pub fn txn_of(actions: &[Value]) -> Option<(String, i64)> {
    actions.iter().find_map(|a| {
        let t = a.get("txn")?;
        Some((t["appId"].as_str()?.to_owned(), t["version"].as_i64()?))
    })
}
