//! Exactly-once under crashes: the `weir` process is killed with SIGKILL at
//! each phase of a batch, restarted, and must leave exactly the output of an
//! uninterrupted run: no row lost, none duplicated.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

use anyhow::Result;
use weir_tests::{
    Workspace, jsonl_plugin_sink, lines, log_ids, orders_pipeline, run_killed_at, run_ok, weir,
};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

const FILES: usize = 5;

#[test]
fn a_crash_at_any_phase_of_a_batch_loses_and_duplicates_nothing() -> Result<()> {
    let ws = Workspace::new(FILES, 400)?;
    std::fs::create_dir_all(ws.path().join("out/reference"))?;
    let reference_file = ws.pipeline(
        "reference.toml",
        &orders_pipeline("reference", "permissive", &jsonl_plugin_sink("reference")),
    )?;
    run_ok(EXE, &cache(), &reference_file, &[])?;
    let reference = lines(&ws.path().join("out/reference/orders.jsonl"))?;
    // Every valid completed order, whatever its spelling, once.
    assert_eq!(reference.len() as u64, ws.orders.by_status[0]);
    assert!(
        reference
            .iter()
            .all(|l| l.contains(r#""status":"completed""#))
    );

    for phase in ["after-offsets", "in-transform", "in-sink", "before-commit"] {
        let tag = phase;
        let out_dir = ws.path().join("out").join(tag);
        std::fs::create_dir_all(&out_dir)?;
        let file = ws.pipeline(
            &format!("{tag}.toml"),
            &orders_pipeline(tag, "permissive", &jsonl_plugin_sink(tag)),
        )?;
        let failpoint = format!("{phase}@2");
        run_killed_at(EXE, &cache(), &file, &failpoint)?;
        let checkpoint = ws.path().join("checkpoints").join(tag);
        assert_eq!(
            log_ids(&checkpoint.join("offsets"))?,
            vec![0, 1, 2],
            "{phase}"
        );
        assert_eq!(log_ids(&checkpoint.join("commits"))?, vec![0, 1], "{phase}");
        let partial = lines(&out_dir.join("orders.jsonl"))?;
        assert!(
            partial.len() < reference.len() && reference.starts_with(&partial),
            "{phase}: the output after the crash must be a prefix of the full output"
        );
        if phase == "in-sink" {
            // The sink was killed half-way through writing batch 2: some of
            // its rows are on disk, beyond what batches 0 and 1 wrote.
            let sidecar = std::fs::read_to_string(out_dir.join("orders.jsonl.batches"))?;
            assert!(sidecar.contains('1'), "sidecar after batch 1: {sidecar}");
        }

        run_ok(EXE, &cache(), &file, &[])?;
        let recovered = lines(&out_dir.join("orders.jsonl"))?;
        assert_eq!(
            recovered.len(),
            reference.len(),
            "{phase}: row count after recovery"
        );
        assert_eq!(recovered, reference, "{phase}: rows after recovery");
        assert_eq!(
            log_ids(&checkpoint.join("commits"))?,
            (0..FILES as u64).collect::<Vec<_>>(),
            "{phase}"
        );
    }
    Ok(())
}

#[test]
fn a_replayed_batch_replaces_its_file_in_the_files_sink() -> Result<()> {
    let ws = Workspace::new(3, 300)?;
    let sink =
        |tag: &str| format!("[sink]\nkind = \"files\"\npath = \"out/{tag}\"\nformat = \"json\"\n");
    let reference_file = ws.pipeline(
        "reference.toml",
        &orders_pipeline("reference", "drop", &sink("reference")),
    )?;
    run_ok(EXE, &cache(), &reference_file, &[])?;
    let crash_file = ws.pipeline(
        "crash.toml",
        &orders_pipeline("crash", "drop", &sink("crash")),
    )?;
    let crashed = weir(
        EXE,
        &cache(),
        &[
            "run",
            crash_file.to_str().unwrap_or_default(),
            "--failpoint",
            "before-commit@1",
        ],
    )?;
    assert_eq!(crashed.status.signal(), Some(9));
    // Batch 1's file exists although the batch is not committed...
    let batch1 = "batch-00000000000000000001.json";
    assert!(ws.path().join("out/crash").join(batch1).is_file());
    run_ok(EXE, &cache(), &crash_file, &[])?;
    // ...and the replay rewrote it with the same rows, not a second copy.
    for b in 0..3u64 {
        let name = format!("batch-{b:020}.json");
        let expected = std::fs::read(ws.path().join("out/reference").join(&name))?;
        let got = std::fs::read(ws.path().join("out/crash").join(&name))?;
        assert_eq!(got, expected, "{name}");
    }
    let files = std::fs::read_dir(ws.path().join("out/crash"))?.count();
    assert_eq!(files, 3, "one file per batch and no leftovers");
    Ok(())
}

#[test]
fn a_committed_batch_is_not_run_again_and_new_files_are_picked_up() -> Result<()> {
    let ws = Workspace::new(2, 200)?;
    std::fs::create_dir_all(ws.path().join("out/q"))?;
    let file = ws.pipeline(
        "q.toml",
        &orders_pipeline("q", "drop", &jsonl_plugin_sink("q")),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    let first = lines(&ws.path().join("out/q/orders.jsonl"))?;
    run_ok(EXE, &cache(), &file, &[])?;
    assert_eq!(
        lines(&ws.path().join("out/q/orders.jsonl"))?,
        first,
        "nothing new, nothing written"
    );
    assert_eq!(
        log_ids(&ws.path().join("checkpoints/q/offsets"))?,
        vec![0, 1]
    );

    // A new file arrives: only it is read, in batch 2.
    let more = tempfile::tempdir()?;
    let extra = weir_host::examples::write_orders(
        more.path(),
        weir_tests::OrdersSpec {
            files: 1,
            lines_per_file: 100,
            seed: 99,
            malformed_every: 0,
        },
    )?;
    std::fs::copy(
        more.path().join("orders-00000.json"),
        ws.path().join("data/orders/late-arrival.json"),
    )?;
    run_ok(EXE, &cache(), &file, &[])?;
    let after = lines(&ws.path().join("out/q/orders.jsonl"))?;
    assert_eq!(after.len(), first.len() + extra.by_status[0] as usize);
    assert_eq!(
        log_ids(&ws.path().join("checkpoints/q/commits"))?,
        vec![0, 1, 2]
    );
    Ok(())
}
