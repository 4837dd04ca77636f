#!/usr/bin/env bash
# Writes host/hot-functions.txt: the functions of weir-bench that the benchmark's queries run,
# which release builds of weir and weir-bench place together at the start of their code
# (host/build_link.rs). Most names are the same in both (the weir-host library's); a name that
# differs is only left out of the group.
#
# Why: the executables hold over 100 MB of code (DataFusion, wasmtime, deltalake, RocksDB, ...)
# and a query runs a few MB of it, scattered; the kernel maps code in blocks (read-ahead, large
# folios), so 51 MB of the attribution join's resident set was code, most of it not run
# (BENCHMARKS.md §8.3).
#
# How: runs the benchmark's queries on small seeded inputs under valgrind's callgrind, which
# records every function executed, and keeps those of the executable, sorted. The list names
# mangled symbols of the release build; a symbol that changes later is only left out of the
# group, so regenerate the list after large changes (about 10 minutes):
#
#   PYTHON=<python with numpy> benches/hot_functions.sh
#
# Needs valgrind, and numpy for ../shared/bench/gen_orders.py. Not part of the build or CI: the
# list is an input of the build, like Cargo.lock.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${WEIR_SHARED:-$root/../shared}"
python="${PYTHON:-python3}"
command -v valgrind >/dev/null || { echo "hot_functions.sh: valgrind is not installed" >&2; exit 1; }
[ -f "$shared/bench/gen_orders.py" ] || { echo "hot_functions.sh: no $shared/bench/gen_orders.py" >&2; exit 1; }

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${WEIR_CACHE_DIR:-$HOME/.cache/weir}/target}"
# shellcheck source=../scripts/setup.sh
source "$root/scripts/setup.sh"
weir_setup_build
(cd "$root" && cargo build --release --locked -p weir-benches)
bench="$CARGO_TARGET_DIR/release/weir-bench"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# 300,000 orders in 30 files: enough rows for memtable flushes, compactions and join eviction.
"$python" "$shared/bench/gen_orders.py" --rows 300000 --files 30 --out "$work/data/orders" --seed 42
"$python" "$root/benches/gen_clicks.py" --orders "$work/data/orders" --out "$work/data/clicks" --seed 42

profile() {
    local name="$1"
    shift
    valgrind --tool=callgrind --trace-children=yes --demangle=no --dump-instr=no --dump-line=no \
        --callgrind-out-file="$work/callgrind.$name.%p" "$bench" "$@" --work "$work/run-$name" \
        >/dev/null 2>"$work/$name.log" || { cat "$work/$name.log" >&2; exit 1; }
}
profile revenue stateful --input "$work/data/orders" --query revenue --runs 1
profile dedup stateful --input "$work/data/orders" --query dedup --dedup-keys order_id --runs 1
profile dedup-composite stateful --input "$work/data/orders" --query dedup \
    --dedup-keys order_id,customer_id --runs 1
profile dedup-string stateful --input "$work/data/orders" --query dedup --dedup-keys session_id --runs 1
profile join stateful --input "$work/data/orders" --query join --runs 1
profile attribution stateful --input "$work/data/orders" --clicks "$work/data/clicks" \
    --query attribution --runs 1
profile pipeline pipeline --input "$work/data/orders" --runs 1

"$python" - "$work" "$root/host/hot-functions.txt" <<'EOF'
"""The functions callgrind saw run in weir-bench, one mangled name a line, sorted."""
import glob, re, sys

work, out = sys.argv[1], sys.argv[2]
names = set()
for path in glob.glob(f"{work}/callgrind.*"):
    lines = open(path, errors="replace").read().split("\n")
    objects, functions = {}, {}
    # Names are given once, at their first mention (ob=/cob=, fn=/cfn=), then by number.
    for line in lines:
        m = re.match(r"^c?ob=\((\d+)\) (.*)$", line)
        if m:
            objects[m.group(1)] = m.group(2)
        m = re.match(r"^c?fn=\((\d+)\) (.*)$", line)
        if m:
            functions[m.group(1)] = m.group(2)
    current = None
    for line in lines:
        m = re.match(r"^ob=\((\d+)\)", line)
        if m:
            current = objects[m.group(1)]
        m = re.match(r"^fn=\((\d+)\)", line)
        if m and current and current.endswith("/weir-bench"):
            # callgrind marks recursion depth with 'N; addresses name code without a symbol.
            name = re.sub(r"'\d+$", "", functions[m.group(1)])
            if not name.startswith("0x") and not name.startswith("("):
                names.add(name)
with open(out, "w") as f:
    f.write("".join(n + "\n" for n in sorted(names)))
print(f"{out}: {len(names)} functions")
EOF
# How many of the names the release weir-bench has (the others would go unplaced, silently).
nm --defined-only "$bench" | awk '{print $3}' | sort -u >"$work/symbols"
echo "$(comm -12 "$work/symbols" "$root/host/hot-functions.txt" | wc -l) of them in $bench"
