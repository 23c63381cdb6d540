#!/usr/bin/env bash
# Instructions per request of every client of `layer_throughput` (bare
# hyper, the layer, tower's retry without and with tower's timeout and
# with the layer's deadline header, bare reqwest, the middleware,
# reqwest-retry and reqwest-retry under a timeout writing the header) and
# of `grpc_throughput` (a bare tonic channel, the gRPC layer), over real
# loopback sockets, client and server in one process on one thread,
# counted by callgrind: the difference between a run of LOW and one of
# HIGH requests, over HIGH - LOW, so that start-up and warm-up cancel.
# Deterministic to about 10 instructions a request (on two workers it
# moved by 1-5 % run to run). Each ratio is to the first client of the
# same family (the first word of its name: hyper, reqwest, tonic), its
# bare client.
#
#   bash scripts/layer-instructions.sh [LOW HIGH]     (default 1000 6000)
#
# Needs valgrind (Debian: `apt-get install valgrind`).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
low=${1:-1000}
high=${2:-6000}
command -v valgrind >/dev/null || { echo "layer-instructions.sh: valgrind not found" >&2; exit 2; }
cargo build --release -q -p retries-bench --features examples --example layer_throughput
cargo build --release -q -p retries-payments --example grpc_throughput
dir="${CARGO_TARGET_DIR:-$root/target}/release/examples"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

# One run of variant $1 for $2 requests: sets `name` (printed by the
# example; empty when there is no such variant) and `refs`.
run() {
    name=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>"$log")
    refs=$(sed -n 's/.*Collected : *//p' "$log")
}

printf '%-50s %12s %8s\n' "client" "instr/req" "× bare"
declare -A bare
for bin in "$dir/layer_throughput" "$dir/grpc_throughput"; do
    for ((v = 0; ; v++)); do
        run "$v" "$low"
        [ -n "$name" ] || break
        a=$refs
        run "$v" "$high"
        per=$(((refs - a) / (high - low)))
        family=${name%% *}
        : "${bare[$family]:=$per}"
        awk -v n="$name" -v p="$per" -v b="${bare[$family]}" \
            'BEGIN { printf "%-50s %12d %8.3f\n", n, p, p / b }'
    done
done
