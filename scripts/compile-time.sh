#!/usr/bin/env bash
# Compile time of `#[retryable]` against what a user would write instead, in
# one run: the same N async functions (default 200)
#
#   plain       no retries at all (the floor);
#   retryable   `#[retries::retryable(deadline = "2s", max_attempts = 3, idempotent)]`;
#   instrument  `#[tracing::instrument(skip_all)]` (another attribute on every fn);
#   backon      the body as a closure retried by backon (3 attempts, exponential,
#               tokio's sleep, a `when` on the error: no deadline, no budget);
#
# each built after its dependencies, in debug, without incremental compilation
# (with it, rebuilding an unchanged file reuses every query and measures
# little but cargo), in five interleaved rounds. Prints each best time and
# the ratios.
#
# With `--instructions`, each crate is instead compiled once with rustc
# under callgrind (through `RUSTC_WRAPPER`, for that crate alone), and the
# instructions rustc executed are printed: deterministic to about 0.1 %,
# where the wall time of the same build moves by 10 % on a shared machine
# (about 90 s a crate; valgrind needed), then where they went: the
# inclusive instructions of rustc's phases in each crate, read from
# callgrind's files with `callgrind_annotate` (`scripts/targets.sh` prints
# the phases where `retryable` and a peer differ under a target missed).
#
# With `--lines`, each crate is instead expanded (`-Zunpretty=expanded`,
# through `RUSTC_BOOTSTRAP=1` on the stable toolchain, as `cargo expand`
# does), formatted with rustfmt, and the lines each function adds are
# printed: every macro expanded, `#[retryable]`'s loop (a `macro_rules!` of
# the core's) included; backon's closures are what a user writes (seconds).
#
#   bash scripts/compile-time.sh [N]
#   bash scripts/compile-time.sh --instructions [N]
#   bash scripts/compile-time.sh --lines [N]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
instructions=false
lines=false
if [ "${1:-}" = "--instructions" ]; then instructions=true; shift; fi
if [ "${1:-}" = "--lines" ]; then lines=true; shift; fi
n="${1:-200}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

make_crate() { # name, extra dependency line, prelude, per-fn generator
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
tokio = { version = "1", features = ["time"] }
$2

[workspace]
TOML
  {
    echo '#![allow(dead_code)]'
    echo '#[derive(Debug, thiserror::Error, retries::Classify)]'
    echo 'pub enum E { #[error("r")] #[classify(not_executed)] Refused, #[error(transparent)] Stopped(#[from] retries::Stopped) }'
    echo "$3"
    for i in $(seq 1 "$n"); do
      "$4" "$i"
    done
  } > "$dir/src/lib.rs"
  # Lock to the project's versions; one target dir builds dependencies once.
  cp "$root/Cargo.lock" "$dir/Cargo.lock"
}

body() { echo "if y.is_empty() { return Err(E::Refused); } Ok(x + $1)"; }
fn_plain() { echo "pub async fn f$1(x: u64, y: &str) -> Result<u64, E> { $(body "$1") }"; }
fn_retryable() {
  echo '#[retries::retryable(deadline = "2s", max_attempts = 3, idempotent)]'
  fn_plain "$1"
}
fn_instrument() {
  echo '#[tracing::instrument(skip_all)]'
  fn_plain "$1"
}
fn_backon() {
  echo "pub async fn f$1(x: u64, y: &str) -> Result<u64, E> {"
  echo "    (|| async { $(body "$1") })"
  echo "        .retry(ExponentialBuilder::default().with_max_times(2))"
  echo "        .sleep(tokio::time::sleep)"
  echo "        .when(|e: &E| matches!(e, E::Refused))"
  echo "        .await"
  echo "}"
}

make_crate plain '' '' fn_plain
make_crate retryable '' '' fn_retryable
make_crate instrument 'tracing = "0.1"' '' fn_instrument
make_crate backon 'backon = { version = "1.6", default-features = false, features = ["std", "tokio-sleep"] }' \
  'use backon::{ExponentialBuilder, Retryable};' fn_backon

export CARGO_TARGET_DIR="$work/target"
variants="plain retryable instrument backon"
for c in $variants; do
  (cd "$work/$c" && cargo build -q 2>/dev/null || cargo build)   # dependencies
done

# The ratios of `retryable` to the others, from the associative array named
# $1, each printed with the awk format $2.
ratios() {
  local -n fig="$1"
  local line other target
  for line in "backon|target <= 1.0" "instrument|target <= 1.0" "plain|"; do
    other=${line%%|*} target=${line#*|}
    printf '%-23s %s×%s\n' "retryable / $other:" \
      "$(awk -v a="${fig[retryable]}" -v b="${fig[$other]}" -v f="$2" 'BEGIN { printf f, a / b }')" \
      "${target:+   ($target)}"
  done
}

# The lines of the crate `$1` once expanded and formatted.
expanded_lines() {
  (cd "$work/$1" && RUSTC_BOOTSTRAP=1 cargo rustc -q -- -Zunpretty=expanded 2>/dev/null) |
    rustfmt --edition 2024 --emit stdout 2>/dev/null | grep -c -v '^\s*$'
}

if $lines; then
  printf 'lines each async fn adds once every macro is expanded (rustfmt, blank lines not counted):\n'
  declare -A per_fn
  for c in $variants; do
    all=$(expanded_lines "$c")
    # The same crate without its functions: what every variant shares.
    cp "$work/$c/src/lib.rs" "$work/$c/lib.rs.all"
    awk '/^(#\[(retries|tracing)::|pub async fn)/ { exit } { print }' "$work/$c/lib.rs.all" > "$work/$c/src/lib.rs"
    none=$(expanded_lines "$c")
    mv "$work/$c/lib.rs.all" "$work/$c/src/lib.rs"
    per_fn[$c]=$(awk -v a="$all" -v b="$none" -v n="$n" 'BEGIN { printf "%.1f", (a - b) / n }')
    printf '  %-11s %6s\n' "$c" "${per_fn[$c]}"
  done
  exit 0
fi

if $instructions; then
  command -v valgrind >/dev/null || { echo "compile-time.sh: valgrind not found" >&2; exit 2; }
  # Runs rustc under callgrind for the crate named in $CT_CRATE only.
  cat > "$work/wrap.sh" <<'WRAP'
#!/usr/bin/env bash
rustc="$1"; shift
for a in "$@"; do
  if [ "$a" = "$CT_CRATE" ] && [ "${prev:-}" = "--crate-name" ]; then
    exec valgrind --tool=callgrind --callgrind-out-file="$CT_LOG.cg" --log-file="$CT_LOG" "$rustc" "$@"
  fi
  prev="$a"
done
exec "$rustc" "$@"
WRAP
  chmod +x "$work/wrap.sh"
  declare -A instr
  for c in $variants; do
    touch "$work/$c/src/lib.rs"
    (cd "$work/$c" && CARGO_INCREMENTAL=0 RUSTC_WRAPPER="$work/wrap.sh" CT_CRATE="$c" CT_LOG="$work/$c.log" cargo build -q)
    instr[$c]=$(awk '/Collected/ { print $4 }' "$work/$c.log")
  done
  printf 'a crate of %s async fns, debug build of the crate alone, not incremental: instructions rustc executed (callgrind):\n' "$n"
  for c in $variants; do printf '  %-11s %14d\n' "$c" "${instr[$c]}"; done
  ratios instr %.3f
  # Where rustc's instructions went, by the compiler's phases: each the
  # inclusive count of one of rustc's functions (`callgrind_annotate`), so
  # a phase includes the queries it forces and phases overlap; read down
  # a column for the differences between the crates, not across a row for
  # a total.
  phases=(
    "expansion (every macro)|<rustc_expand::expand::MacroExpander>::fully_expand_fragment"
    "  of which attribute macros run|proc_macro::bridge::client::Client<(proc_macro::TokenStream,proc_macro::TokenStream),proc_macro::TokenStream>::expand2::{{closure}}"
    "type checking|rustc_hir_typeck::typeck_with_inspect::{closure#0}"
    "borrow checking|<rustc_borrowck::root_cx::BorrowCheckRootCtxt>::do_mir_borrowck"
    "MIR built|rustc_mir_transform::mir_built"
    "drops elaborated, coroutines lowered|rustc_mir_transform::mir_drops_elaborated_and_const_checked"
    "MIR optimized|rustc_mir_transform::optimized_mir"
    "type layouts|rustc_ty_utils::layout::layout_of"
    "items to generate collected|rustc_monomorphize::partitioning::collect_and_partition_mono_items"
    "LLVM (code generation)|<rustc_codegen_llvm::LlvmCodegenBackend as rustc_codegen_ssa::traits::write::WriteBackendMethods>::codegen"
    "metadata written|rustc_metadata::rmeta::encoder::encode_metadata"
  )
  if command -v callgrind_annotate >/dev/null; then
    for c in $variants; do callgrind_annotate --inclusive=yes --threshold=100 "$work/$c.log.cg" > "$work/$c.incl" 2>/dev/null; done
    printf 'where they went (G instructions, inclusive; phases overlap):\n'
    printf '  %-38s' phase
    for c in $variants; do printf ' %10s' "$c"; done
    printf '\n'
    for p in "${phases[@]}"; do
      label=${p%%|*} fn=${p#*|}
      printf '  %-38s' "$label"
      for c in $variants; do
        awk -v f="???:$fn [" 'index($0, f) { v = $1; gsub(",", "", v); found = 1; printf " %10.3f", v / 1e9; exit } END { if (!found) printf " %10.3f", 0 }' "$work/$c.incl"
      done
      printf '\n'
    done
  fi
  exit 0
fi

build_once() { # crate -> seconds for rebuilding just that crate, once
  local dir="$work/$1" t0 t1
  touch "$dir/src/lib.rs"
  t0=$(date +%s.%N)
  (cd "$dir" && CARGO_INCREMENTAL=0 cargo build -q)
  t1=$(date +%s.%N)
  awk "BEGIN { print $t1 - $t0 }"
}

# Interleaved rounds: each round builds every variant once, so that a slow
# stretch of a shared machine falls on all of them, not on one; each
# variant's best round is kept.
declare -A secs
for _ in 1 2 3 4 5; do
  for c in $variants; do
    t=$(build_once "$c")
    if [ -z "${secs[$c]:-}" ] || awk "BEGIN { exit !($t < ${secs[$c]}) }"; then secs[$c]=$t; fi
  done
done
printf 'a crate of %s async fns, debug build of the crate alone, not incremental (best of 5 interleaved rounds):\n' "$n"
for c in $variants; do printf '  %-11s %6.2f s\n' "$c" "${secs[$c]}"; done
ratios secs %.2f
