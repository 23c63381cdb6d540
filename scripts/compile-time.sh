#!/usr/bin/env bash
# Compile time of `#[retryable]`: a crate with 200 annotated async functions
# against the same crate without the attribute, both built after their
# dependencies, in debug, without incremental compilation (with it, rebuilding
# an unchanged file reuses every query and measures little but cargo: the
# earlier figures of this script, 0.49 s against 0.11 s, were that). Prints
# both times (best of 5) and the ratio.
#
#   bash scripts/compile-time.sh [N]      (N functions, default 200)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
n="${1:-200}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

make_crate() { # name, attribute line
  local dir="$work/$1"
  mkdir -p "$dir/src"
  cat > "$dir/Cargo.toml" <<TOML
[package]
name = "$1"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
retries = { path = "$root" }
thiserror = "2"

[workspace]
TOML
  {
    echo '#![allow(dead_code)]'
    echo '#[derive(Debug, thiserror::Error, retries::Classify)]'
    echo 'pub enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }'
    for i in $(seq 1 "$n"); do
      echo "$2"
      echo "pub async fn f$i(x: u64, y: &str) -> Result<u64, E> { if y.is_empty() { return Err(E::Refused); } Ok(x + $i) }"
    done
  } > "$dir/src/lib.rs"
  # Share one target dir so dependencies are built once, and lock to the project's versions.
  cp "$root/Cargo.lock" "$dir/Cargo.lock"
}

make_crate plain ''
make_crate annotated '#[retries::retryable(deadline = "2s", max_attempts = 3, idempotent)]'

export CARGO_TARGET_DIR="$work/target"
for c in plain annotated; do
  (cd "$work/$c" && cargo build -q 2>/dev/null || cargo build)   # dependencies
done

time_build() { # crate -> seconds for rebuilding just that crate
  local dir="$work/$1" best=""
  for _ in 1 2 3 4 5; do
    touch "$dir/src/lib.rs"
    local t0 t1
    t0=$(date +%s.%N)
    (cd "$dir" && CARGO_INCREMENTAL=0 cargo build -q)
    t1=$(date +%s.%N)
    local t
    t=$(awk "BEGIN { print $t1 - $t0 }")
    if [ -z "$best" ] || awk "BEGIN { exit !($t < $best) }"; then best=$t; fi
  done
  echo "$best"
}

plain=$(time_build plain)
annotated=$(time_build annotated)
printf 'crate with %s async fns, debug build of the crate alone, not incremental (best of 5):\n' "$n"
printf '  without the attribute: %.2f s\n' "$plain"
printf '  with #[retryable]:     %.2f s\n' "$annotated"
printf '  ratio:                 %.2f×\n' "$(awk "BEGIN { print $annotated / $plain }")"
