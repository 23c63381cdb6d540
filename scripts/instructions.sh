#!/usr/bin/env bash
# Instructions per call, counted by callgrind (stable run to run, unlike
# nanoseconds on a shared machine), for each mode of
# `tests/bench/examples/profile_ready.rs`: the call is run N and 2N times and
# the difference divided by N, so start-up and the runtime's construction
# cancel out. Then the tower layer's work per request in process
# (`layer_profile`, no network: its service answers at once, so that the
# layer's own work is what is left of the count).
#
#   bash scripts/instructions.sh            print `mode instructions` lines
#   bash scripts/instructions.sh --check    also fail if a mode exceeds its
#                                           ceiling below (a regression guard)
#
# Needs valgrind (Debian: `apt-get install valgrind`).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
check=false
[ "${1:-}" = "--check" ] && check=true

command -v valgrind >/dev/null || { echo "instructions.sh: valgrind not found" >&2; exit 2; }
cargo build -q --release -p retries-bench --features examples --example profile_ready --example layer_profile
bin="${CARGO_TARGET_DIR:-$root/target}/release/examples/profile_ready"
layer_bin="${CARGO_TARGET_DIR:-$root/target}/release/examples/layer_profile"
n=50000

count() { # mode calls -> instructions
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$2" "$1" 2>&1 |
    awk '/Collected/ { print $4 }'
}

# Ceilings: about 10 % above the counts of 2026-12-05 on `main` after issue
# 60 put the operator's overrides on the call's path (ready 190, ready_ctl
# 531, breaker 214, call 225, yield 1,056, once 976; before it, 185, —,
# 207, 221, 1,052, 970; `tests/bench/README.md`, "Operator control"), so
# that a real regression fails and a toolchain's small shifts do not.
# 2026-12-05: issue 58's last `unsafe` site went to `scoped-tls` (ready
# 232, call 336, yield 1,242, once 1,170) and issue 63's rate limit added a
# branch on `None` (ready 234, call 340, yield 1,244, once 1,192): the
# ceilings are 10 % above the first of those.
# `ready_ctl` is `ready` with an override installed for another call name.
# The peers and the hand loops have none: they are baselines.
# 2026-12-06: `layer` (the layer in process, per request, its service
# answering at once) 4,643, after issue 64's cut of the quota authority's
# scan (4,868 before): its ceiling 10 % above. Then 4,148 (issue 64's
# second session: the replayed body boxed smaller, the quota authority
# worked out only when needed, one clock read for the time left, no
# look-up in a request without headers): the ceiling follows. Then 4,029
# (issue 64's third session: the first attempt's time left for the header
# from its plan alone, without `Instant` arithmetic): the ceiling follows.
# Then `ready` 254 (241 before): `#[retryable]`'s loop awaits one future a
# turn, the pause a turn of its own (two tests of a flag on a first-time
# success), for 5.7 % less of rustc's work per function (issue 64's fourth
# session): its ceiling follows.
declare -A ceiling=(
  [ready]=280 [ready_ctl]=630 [breaker]=348 [call]=370 [yield]=1366 [once]=1287
  [layer]=4430
)

failed=0
judge() { # mode instructions
  echo "$1 $2"
  if $check && [ -n "${ceiling[$1]:-}" ] && [ "$2" -gt "${ceiling[$1]}" ]; then
    echo "instructions.sh: $1 takes $2 instructions per call, above its ceiling ${ceiling[$1]}" >&2
    failed=1
  fi
}
for mode in direct again ready ready_ctl breaker call hand_yield yield hand_once once; do
  a=$(count "$mode" "$n")
  b=$(count "$mode" "$((2 * n))")
  judge "$mode" $(((b - a) / n))
done
# The layer per request, its service's own work (`layer_bare`) and tower's
# `retry` (`layer_tower`) beside it.
for mode in bare layer tower; do
  a=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$layer_bin" 10000 "$mode" 2>&1 | awk '/Collected/ { print $4 }')
  b=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$layer_bin" 20000 "$mode" 2>&1 | awk '/Collected/ { print $4 }')
  name=layer_$mode
  [ "$mode" = layer ] && name=layer
  judge "$name" $(((b - a) / 10000))
done
exit "$failed"
