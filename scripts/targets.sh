#!/usr/bin/env bash
# Every performance target of the engine (`tests/bench/README.md`, "Where
# the targets stand") measured in one run, each marked met or missed:
#
#   instructions per call     scripts/instructions.sh (callgrind)
#   bytes per call's future   the example `future_sizes`
#   the doors over sockets    scripts/layer-instructions.sh (callgrind)
#   compile time              scripts/compile-time.sh (200 fns, interleaved)
#
#   bash scripts/targets.sh            all four (~15 minutes on 2 cores)
#   bash scripts/targets.sh --quick    without the compile time (~5 minutes)
#
# Needs valgrind. Prints the raw figures, then one line per target.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
quick=false
[ "${1:-}" = "--quick" ] && quick=true
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "== instructions per call (scripts/instructions.sh)"
bash scripts/instructions.sh | tee "$out/instr"
echo "== bytes per future (future_sizes)"
cargo run -q --release -p retries-bench --features examples --example future_sizes | tee "$out/sizes"
echo "== instructions per request over sockets (scripts/layer-instructions.sh)"
bash scripts/layer-instructions.sh | tee "$out/layers"
if ! $quick; then
    echo "== compile time (scripts/compile-time.sh)"
    bash scripts/compile-time.sh | tee "$out/compile"
fi

get() { awk -v k="$2" '$1 == k { print $2 }' "$out/$1"; }
# The instructions of the client whose name is exactly $1.
layer() { awk -v n="$1" '{ line = $0; sub(/ +[0-9]+ +[0-9.]+$/, "", line); if (line == n) print $(NF - 1) }' "$out/layers"; }
verdict() { # measured, target, "≤" test as awk expression of m and t
    if awk -v m="$1" -v t="$2" "BEGIN { exit !($3) }"; then echo met; else echo missed; fi
}
row() { printf '%-58s %-30s %s\n' "$1" "$2" "$3"; }

ready=$(get instr ready) breaker=$(get instr breaker) call=$(get instr call)
yield=$(get instr yield) hyield=$(get instr hand_yield)
once=$(get instr once) honce=$(get instr hand_once)
fut=$(get sizes retryable) hand=$(get sizes hand_loop) nested=$(get sizes retryable_nested)
bare=$(layer "hyper") ours=$(layer "hyper + retries RetryLayer") rt=$(layer "hyper + tower retry + timeout")
rq=$(layer "reqwest (no middleware)") mw=$(layer "reqwest + retries RetryMiddleware") rr=$(layer "reqwest + reqwest-retry")
tonic=$(layer "tonic channel") grpc=$(layer "tonic channel + retries RetryLayer::grpc")

echo
echo "== targets (one run, $(date -u +%Y-%m-%d))"
row "ready ≤ 120 instructions" "$ready" "$(verdict "$ready" 120 'm <= t')"
row "breaker, call within 30 of ready" "$breaker, $call" \
    "$(verdict "$(( (breaker > call ? breaker : call) - ready ))" 30 'm <= t')"
row "yield ≤ 1.0× its hand loop" "$yield / $hyield = $(awk -v a="$yield" -v b="$hyield" 'BEGIN { printf "%.2f×", a / b }')" \
    "$(verdict "$yield" "$hyield" 'm <= t')"
row "once ≤ 1.5× its hand loop" "$once / $honce = $(awk -v a="$once" -v b="$honce" 'BEGIN { printf "%.2f×", a / b }')" \
    "$(verdict "$once" "$(awk -v b="$honce" 'BEGIN { print 1.5 * b }')" 'm <= t')"
row "#[retryable] future ≤ 1.5× the hand loop's" "$fut B / $hand B = $(awk -v a="$fut" -v b="$hand" 'BEGIN { printf "%.2f×", a / b }')" \
    "$(verdict "$fut" "$(awk -v b="$hand" 'BEGIN { print 1.5 * b }')" 'm <= t')"
row "nested ≤ 2× #[retryable]" "$nested B = $(awk -v a="$nested" -v b="$fut" 'BEGIN { printf "%.2f×", a / b }')" \
    "$(verdict "$nested" "$((2 * fut))" 'm <= t')"
row "tower layer ≤ tower retry + timeout" "$(awk -v a="$ours" -v b="$bare" -v c="$rt" 'BEGIN { printf "%.3f× vs %.3f× bare", a / b, c / b }')" \
    "$(verdict "$ours" "$rt" 'm <= t')"
row "middleware ≤ reqwest-retry" "$(awk -v a="$mw" -v b="$rq" -v c="$rr" 'BEGIN { printf "%.3f× vs %.3f× bare", a / b, c / b }')" \
    "$(verdict "$mw" "$rr" 'm <= t')"
row "gRPC layer (no target of its own; × a bare channel)" "$(awk -v a="$grpc" -v b="$tonic" 'BEGIN { printf "%.3f×", a / b }')" "-"
if ! $quick; then
    rb=$(awk '/retryable \/ backon/ { sub(/×/, "", $4); print $4 }' "$out/compile")
    ri=$(awk '/retryable \/ instrument/ { sub(/×/, "", $4); print $4 }' "$out/compile")
    row "compile ≤ backon closures (200 fns)" "${rb}×" "$(verdict "$rb" 1.0 'm <= t')"
    row "compile ≤ #[instrument]" "${ri}×" "$(verdict "$ri" 1.0 'm <= t')"
fi
