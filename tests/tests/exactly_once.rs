//! Exactly-once under crashes: the `weir` process is killed with SIGKILL at
//! each phase of the first batch and of a later one, restarted, and must leave
//! exactly the output of an uninterrupted run: no row lost, none duplicated,
//! every row whole. The uninterrupted run's row count is the generator's.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

use anyhow::Result;
use weir_host::failpoint::Phase;
use weir_tests::{
    Workspace, commit_ids, jsonl_plugin_sink, lines, offset_ids, orders_pipeline, run_killed_at,
    run_ok, weir,
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

    // Batch 0 (the sink's first write, nothing before it) and batch 2 (after two).
    for killed in [0u64, 2] {
        for (phase, _) in Phase::ALL {
            let tag = format!("{phase}-{killed}");
            let out_dir = ws.path().join("out").join(&tag);
            std::fs::create_dir_all(&out_dir)?;
            let file = ws.pipeline(
                &format!("{tag}.toml"),
                &orders_pipeline(&tag, "permissive", &jsonl_plugin_sink(&tag)),
            )?;
            run_killed_at(EXE, &cache(), &file, &format!("{phase}@{killed}"))?;
            let checkpoint = ws.path().join("checkpoints").join(&tag);
            assert_eq!(
                offset_ids(&checkpoint)?,
                (0..=killed).collect::<Vec<_>>(),
                "{tag}"
            );
            assert_eq!(
                commit_ids(&checkpoint)?,
                (0..killed).collect::<Vec<_>>(),
                "{tag}"
            );
            let partial = lines(&out_dir.join("orders.jsonl"))?;
            assert!(
                partial.len() < reference.len() && reference.starts_with(&partial),
                "{tag}: the output after the crash must be a prefix of the full output"
            );
            let sidecar = out_dir.join("orders.jsonl.batches");
            if phase == "in-sink" {
                // The sink was killed half-way through writing the batch: the sidecar names
                // the batch before it (none for batch 0).
                if killed == 0 {
                    assert!(!sidecar.exists(), "{tag}: a sidecar before any batch");
                } else {
                    let text = std::fs::read_to_string(&sidecar)?;
                    let last = killed - 1;
                    assert!(
                        text.starts_with(&format!("{last} ")),
                        "{tag}: sidecar after batch {last}: {text}"
                    );
                }
            }

            run_ok(EXE, &cache(), &file, &[])?;
            let recovered = lines(&out_dir.join("orders.jsonl"))?;
            assert_eq!(
                recovered.len(),
                reference.len(),
                "{tag}: row count after recovery"
            );
            assert_eq!(recovered, reference, "{tag}: rows after recovery");
            assert_eq!(
                commit_ids(&checkpoint)?,
                (0..FILES as u64).collect::<Vec<_>>(),
                "{tag}"
            );
        }
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
    // Every valid order, once (the generator's count, not the reference run's).
    assert_eq!(
        weir_tests::sorted_output(&ws.path().join("out/reference"))?.len() as u64,
        ws.orders.by_status[0]
    );
    // The first batch and a later one.
    for killed in [0u64, 1] {
        let tag = format!("crash{killed}");
        let crash_file = ws.pipeline(
            &format!("{tag}.toml"),
            &orders_pipeline(&tag, "drop", &sink(&tag)),
        )?;
        let crashed = weir(
            EXE,
            &cache(),
            &[
                "run",
                crash_file.to_str().unwrap_or_default(),
                "--failpoint",
                &format!("before-commit@{killed}"),
            ],
        )?;
        assert_eq!(crashed.status.signal(), Some(9));
        let out = ws.path().join("out").join(&tag);
        // The killed batch's file exists although the batch is not committed...
        let killed_file = format!("batch-{killed:020}.json");
        assert!(out.join(&killed_file).is_file(), "{tag}");
        run_ok(EXE, &cache(), &crash_file, &[])?;
        // ...and the replay rewrote it with the same rows, not a second copy.
        for b in 0..3u64 {
            let name = format!("batch-{b:020}.json");
            let expected = std::fs::read(ws.path().join("out/reference").join(&name))?;
            let got = std::fs::read(out.join(&name))?;
            assert_eq!(got, expected, "{tag}: {name}");
        }
        let files = std::fs::read_dir(&out)?.count();
        assert_eq!(files, 3, "{tag}: one file per batch and no leftovers");
    }
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
    assert_eq!(offset_ids(&ws.path().join("checkpoints/q"))?, vec![0, 1]);

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
    assert_eq!(commit_ids(&ws.path().join("checkpoints/q"))?, vec![0, 1, 2]);
    Ok(())
}
