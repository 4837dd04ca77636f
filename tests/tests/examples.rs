//! Every pipeline in `examples/` runs as written once `weir examples` has written the example
//! plugins and sample data beside it (what `bash scripts/demo.sh` does in the repository): each
//! is copied unchanged into a scratch folder, run with only its trigger made `available-now`
//! (and, for Kafka, the broker's address), and its sink must have written rows.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use weir_tests::kafka::{Broker, order_lines};
use weir_tests::{run_ok, weir};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

fn examples() -> Result<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    ensure!(files.len() >= 8, "the examples: {files:?}");
    Ok(files)
}

/// Rows (lines, or Parquet files' presence) the sink left under `dir`.
fn written(dir: &Path) -> Result<usize> {
    let mut n = 0;
    if !dir.exists() {
        return Ok(0);
    }
    for entry in walk(dir)? {
        let name = entry.to_string_lossy();
        if name.ends_with(".parquet") {
            n += 1;
        } else if name.ends_with(".json") || name.ends_with(".jsonl") {
            n += std::fs::read_to_string(&entry)?.lines().count();
        }
    }
    Ok(n)
}

fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(walk(&path)?);
        } else {
            out.push(path);
        }
    }
    Ok(out)
}

#[test]
fn every_example_runs_as_written() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let out = weir(
        EXE,
        &cache(),
        &["examples", "--dir", dir.path().to_str().context("path")?],
    )?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let broker = Broker::start()?;
    broker.create_topic("orders", 3)?;
    broker.create_topic("completed-orders", 1)?;
    broker.produce("orders", 3, &order_lines(&dir.path().join("data/orders"))?)?;
    let mut ran = Vec::new();
    for example in examples()? {
        let name = example
            .file_name()
            .context("name")?
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&example)?;
        let file = dir.path().join(&name);
        std::fs::write(&file, &text)?;
        let mut extra = vec!["--set".to_owned(), "query.trigger=available-now".to_owned()];
        let kafka = text.contains("kind = \"kafka\"");
        if kafka {
            for key in ["source.orders.bootstrap_servers", "sink.bootstrap_servers"] {
                extra.push("--set".to_owned());
                extra.push(format!("{key}={}", broker.bootstrap()));
            }
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        run_ok(EXE, &cache(), &file, &extra).with_context(|| format!("examples/{name}"))?;
        let table: toml::Table = text.parse()?;
        let rows = if kafka {
            let topic = table["sink"]["topic"].as_str().context("sink.topic")?;
            broker.read_all(topic, 1)?.len()
        } else {
            let path = table["sink"]
                .get("path")
                .and_then(|p| p.as_str())
                .unwrap_or("out");
            written(&dir.path().join(path))?
        };
        ensure!(rows > 0, "examples/{name} wrote nothing");
        ran.push(name);
    }
    ensure!(ran.len() >= 8, "{ran:?}");
    Ok(())
}
