#!/usr/bin/env bash
# The main job, on a fresh machine or any other: sets up what the build needs
# (scripts/setup.sh), builds the `weir` binary into the cargo target directory that
# `.ci/run` uses too, and runs `weir demo`: sample orders, a pipeline with two Wasm
# transforms and a Wasm foreachBatch sink, each batch's progress line, the result.
#
#   bash scripts/demo.sh [DEMO FLAGS]     # e.g. --dir /tmp/weir-demo (see `weir demo --help`)
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/setup.sh
weir_setup_build

cargo run --locked -p weir-host --bin weir -- demo "$@"
# The example plugins and sample data beside the pipelines of examples/ (git ignores them), so
# that each of those pipelines runs as written.
cargo run --locked -q -p weir-host --bin weir -- examples --dir examples
