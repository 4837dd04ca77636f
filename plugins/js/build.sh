#!/usr/bin/env bash
# Builds Weir's JavaScript example plugins into WebAssembly components:
#
#   plugins/js/build.sh OUT_DIR     # writes OUT_DIR/js_filter_rows.wasm, js_jsonl_sink.wasm,
#                                   # js_running_total.wasm, js_merge_sink.wasm
#
# componentize-js and its dependencies, pinned by package.json and package-lock.json beside
# this script, are installed with `npm ci` under ${WEIR_TOOLS_DIR:-$HOME/.cache/weir/tools}
# the first time (keyed by the lock file's hash). Each component is cached there by a hash of
# everything it is built from, so a second run only copies files.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:?usage: build.sh OUT_DIR}"
tools_root="${WEIR_TOOLS_DIR:-$HOME/.cache/weir/tools}"
cache="$tools_root/components"

fail() { echo "plugins/js/build.sh: $*" >&2; exit 1; }
command -v sha256sum >/dev/null || fail "sha256sum is missing (coreutils)"
command -v flock >/dev/null || fail "flock is missing (util-linux)"
command -v node >/dev/null || fail "node is missing: install Node.js 18+ (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null || fail "npm is missing: install it (Debian: apt-get install npm)"

lock_hash="$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-16)"
tools="$tools_root/componentize-js-$lock_hash"
mkdir -p "$tools_root" "$cache" "$out"

# One installer at a time: cargo may run several build scripts that call this at once.
exec 9>"$tools_root/.js.lock"
flock 9

if [ ! -f "$tools/node_modules/@bytecodealliance/componentize-js/package.json" ]; then
  echo "installing componentize-js (npm ci) into $tools" >&2
  rm -rf "$tools.partial"
  mkdir -p "$tools.partial"
  cp "$here/package.json" "$here/package-lock.json" "$tools.partial/"
  (cd "$tools.partial" && npm ci --no-audit --no-fund --loglevel=error >&2) \
    || fail "npm ci could not install componentize-js (is the npm registry reachable?)"
  rm -rf "$tools"
  mv "$tools.partial" "$tools"
fi

# name, world, WIT folder, then the SDK modules it imports (staged beside it)
plugins=(
  "filter_rows transform $root/wit weir-plugin.js"
  "jsonl_sink sink-with-files $here/wit weir-plugin.js weir-files.js"
  "running_total stateful-transform $root/wit weir-plugin.js weir-state.js"
  "merge_sink merge-sink $root/wit weir-plugin.js weir-merge.js"
)
for spec in "${plugins[@]}"; do
  read -r name world wit sdk <<<"$spec"
  read -r -a sdk <<<"$sdk"
  sdk_paths=("${sdk[@]/#/$root/plugin-sdk/js/}")
  hash="$(
    {
      echo "componentize-js $lock_hash world $world"
      cat "$root/wit/weir.wit" "$here/$name.js" "${sdk_paths[@]}" "$here/build.sh" "$here/build.mjs"
      [ "$wit" = "$root/wit" ] || cat "$wit"/*.wit "$wit"/deps/*.wit
    } | sha256sum | cut -c1-32
  )"
  built="$cache/js-$name-$hash.wasm"
  if [ ! -f "$built" ]; then
    echo "componentize-js: building $name ($world)" >&2
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    # componentize-js resolves imports inside the source's folder only: stage the plugin
    # with the SDK modules beside it, and the WIT with weir.wit among its dependencies.
    mkdir -p "$work/src"
    cp "$here/$name.js" "${sdk_paths[@]}" "$work/src/"
    if [ "$wit" != "$root/wit" ]; then
      cp -r "$wit" "$work/wit"
      cp "$root/wit/weir.wit" "$work/wit/deps/weir.wit"
      wit="$work/wit"
    fi
    node "$here/build.mjs" "$tools" "$work/src/$name.js" "$wit" "$world" "$work/out.wasm" >&2 \
      || fail "componentize-js could not build $name.js"
    mv "$work/out.wasm" "$built"
    rm -rf "$work"
    trap - EXIT
  fi
  cp "$built" "$out/js_$name.wasm.tmp"
  mv "$out/js_$name.wasm.tmp" "$out/js_$name.wasm"
done
