#!/usr/bin/env bash
# Builds Weir's Python example plugins into WebAssembly components:
#
#   plugins/python/build.sh OUT_DIR     # writes OUT_DIR/python_filter_rows.wasm, python_jsonl_sink.wasm,
#                                       # python_count_char.wasm, python_running_total.wasm,
#                                       # python_merge_sink.wasm
#
# componentize-py, pinned by hash in requirements.txt beside this script, is installed with pip
# into a virtual environment under ${WEIR_TOOLS_DIR:-$HOME/.cache/weir/tools} the first time
# (and again whenever requirements.txt changes). Each component is cached there by a
# hash of everything it is built from (the tool version, the WIT, the plugin, the SDK module and
# this script), so a second run only copies files.
set -euo pipefail


here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:?usage: build.sh OUT_DIR}"
tools="${WEIR_TOOLS_DIR:-$HOME/.cache/weir/tools}"
requirements="$here/requirements.txt"
requirements_hash="$(sha256sum "$requirements" | cut -d' ' -f1)"
venv="$tools/componentize-py-${requirements_hash:0:16}"
cache="$tools/components"

fail() { echo "plugins/python/build.sh: $*" >&2; exit 1; }
command -v sha256sum >/dev/null || fail "sha256sum is missing (coreutils)"
command -v flock >/dev/null || fail "flock is missing (util-linux)"
mkdir -p "$tools" "$cache" "$out"

# One installer at a time: cargo may run several build scripts that call this at once.
exec 9>"$tools/.python.lock"
flock 9

# A venv cannot be moved, so it is built in place; a stamp with the requirements' hash marks
# it complete, and a venv made from other requirements is never reused.
if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$requirements_hash" ]; then
  python="$(command -v python3 || true)"
  [ -n "$python" ] || fail "python3 is missing: install Python 3.10+ with the venv module (Debian: apt-get install python3 python3-venv)"
  echo "installing componentize-py (requirements.txt) into $venv" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv" || fail "python3 -m venv failed: install the venv module (Debian: apt-get install python3-venv)"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps \
    -r "$requirements" \
    || fail "pip could not install plugins/python/requirements.txt (is PyPI reachable?)"
  echo "$requirements_hash" >"$venv/.requirements.sha256"
fi

# name, world, module
plugins=(
  "filter_rows transform filter_rows"
  "jsonl_sink sink jsonl_sink"
  "count_char scalar-function count_char"
  "running_total stateful-transform running_total"
  "merge_sink merge-sink merge_sink"
)
for spec in "${plugins[@]}"; do
  read -r name world module <<<"$spec"
  hash="$(
    {
      echo "componentize-py world $world module $module"
      cat "$requirements" "$root/wit/weir.wit" "$here/$module.py" "$root/plugin-sdk/python/weir_plugin.py" "$here/build.sh"
    } | sha256sum | cut -c1-32
  )"
  built="$cache/python-$name-$hash.wasm"
  if [ ! -f "$built" ]; then
    echo "componentize-py: building $name ($world)" >&2
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    # Only the module and the SDK are on the path: the component holds nothing else.
    cp "$here/$module.py" "$root/plugin-sdk/python/weir_plugin.py" "$work/"
    "$venv/bin/componentize-py" --quiet -d "$root/wit" -w "$world" componentize \
      -p "$work" -o "$work/out.wasm" "$module" \
      || fail "componentize-py could not build $module.py"
    mv "$work/out.wasm" "$built"
    rm -rf "$work"
    trap - EXIT
  fi
  cp "$built" "$out/python_$name.wasm.tmp"
  mv "$out/python_$name.wasm.tmp" "$out/python_$name.wasm"
done
