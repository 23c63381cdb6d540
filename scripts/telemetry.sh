#!/usr/bin/env bash
# The price of telemetry in instructions per call, counted by callgrind as
# `scripts/instructions.sh` counts `ready` (N and 2N calls, the difference
# divided by N): `tests/bench/examples/profile_telemetry.rs`, built without
# and with the engine's `metrics` feature, under each setting, beside a hand
# loop under `#[tracing::instrument(level = "info")]` and the same metrics
# reported by hand. Then what a subscriber at INFO receives for a
# first-time success, a retried call and one that gave up.
#
#   bash scripts/telemetry.sh          prints `setting subject instructions`
#                                      lines, the table of `tests/bench/README.md`
#                                      ("The price of telemetry") and the INFO lines
#   bash scripts/telemetry.sh --check  also fails if a figure of `retries`
#                                      is above its ceiling below, or if a
#                                      call's visibility at INFO changed
#
# Needs valgrind (Debian: `apt-get install valgrind`). About 2 minutes
# once built.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
check=false
[ "${1:-}" = "--check" ] && check=true

# Ceilings: about 10 % above the counts of 2026-12-06 on `main`
# (`tests/bench/README.md`, "The price of telemetry"), for the rows of
# `retries` (`SETTING.tracing`, `SETTING.metrics`); the hand loops are
# baselines.
declare -A ceiling=(
  [none.tracing]=263 [none.metrics]=292
  [fmt_info.tracing]=263 [fmt_info.metrics]=292
  [fmt_debug.tracing]=30500 [fmt_debug.metrics]=30600
  [otel_debug.tracing]=29000 [otel_debug.metrics]=29100
  [otel_info.tracing]=263 [otel_info.metrics]=291
  [registry.metrics]=3680
)
command -v valgrind >/dev/null || { echo "telemetry.sh: valgrind not found" >&2; exit 2; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
target="${CARGO_TARGET_DIR:-$root/target}/release/examples/profile_telemetry"
cargo build -q --release -p retries-bench --features examples --example profile_telemetry
cp "$target" "$out/tracing"
cargo build -q --release -p retries-bench --features examples,metrics --example profile_telemetry
cp "$target" "$out/metrics"

count() { # binary setting subject calls -> instructions
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$out/$1" "$4" "$2" "$3" 2>&1 |
    awk '/Collected/ { print $4 }'
}
per_call() { # binary setting subject -> instructions per call
  local n=20000
  case "$2" in fmt_debug | otel_debug | registry) n=2000 ;; esac
  local a b
  a=$(count "$1" "$2" "$3" "$n")
  b=$(count "$1" "$2" "$3" "$((2 * n))")
  echo $(((b - a) / n))
}

declare -A fig
for setting in none fmt_info fmt_debug otel_debug otel_info; do
  fig[$setting.tracing]=$(per_call tracing "$setting" retryable)
  fig[$setting.metrics]=$(per_call metrics "$setting" retryable)
  fig[$setting.hand]=$(per_call tracing "$setting" hand)
  for k in tracing metrics hand; do echo "$setting $k ${fig[$setting.$k]}"; done
done
fig[registry.metrics]=$(per_call metrics registry retryable)
fig[registry.hand]=$(per_call metrics registry hand_metrics)
echo "registry metrics ${fig[registry.metrics]}"
echo "registry hand_metrics ${fig[registry.hand]}"

echo
echo "| setting | \`#[retryable]\`, tracing only | with \`metrics\` compiled in | instrumented hand loop |"
echo "|---|---|---|---|"
label() {
  case "$1" in
    none) echo "no subscriber, no recorder" ;;
    fmt_info) echo "fmt at INFO" ;;
    fmt_debug) echo "fmt at DEBUG" ;;
    otel_debug) echo "OpenTelemetry layer at DEBUG (an exporter that drops)" ;;
    otel_info) echo "OpenTelemetry layer at INFO" ;;
  esac
}
for setting in none fmt_info fmt_debug otel_debug otel_info; do
  echo "| $(label "$setting") | ${fig[$setting.tracing]} | ${fig[$setting.metrics]} | ${fig[$setting.hand]} |"
done
echo "| a \`metrics\` \`Registry\` recorder, no subscriber | | ${fig[registry.metrics]} | ${fig[registry.hand]} for the same 7 metrics reported by hand |"

echo
echo "what a subscriber at INFO receives:"
"$out/metrics" 0 visible | tee "$out/visible"
echo
echo "what a subscriber at DEBUG receives for a first-time success (and the hand loop):"
"$out/metrics" 0 visible_debug

failed=0
if $check; then
  for k in "${!ceiling[@]}"; do
    if [ "${fig[$k]}" -gt "${ceiling[$k]}" ]; then
      echo "telemetry.sh: $k takes ${fig[$k]} instructions per call, above its ceiling ${ceiling[$k]}" >&2
      failed=1
    fi
  done
  expected="first_time_success nothing
retried_success INFO_event=1
gave_up WARN_event=1"
  if [ "$(cat "$out/visible")" != "$expected" ]; then
    echo "telemetry.sh: at INFO, expected:" >&2
    echo "$expected" >&2
    failed=1
  fi
fi
exit "$failed"
