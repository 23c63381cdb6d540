#!/usr/bin/env bash
# Instructions per request of every client of `layer_throughput` (bare
# hyper, the layer, tower's retry without and with tower's timeout, bare
# reqwest, the middleware, reqwest-retry), over real loopback sockets, client and server in one
# process, counted by callgrind: the difference between a run of LOW and
# one of HIGH requests, over HIGH - LOW, so that start-up and warm-up cancel.
# Deterministic enough to compare where a load test's rates are noise.
#
#   bash scripts/layer-instructions.sh [LOW HIGH]     (default 1000 6000)
set -euo pipefail
cd "$(dirname "$0")/.."
low=${1:-1000}
high=${2:-6000}
cargo build --release -q -p retries-bench --example layer_throughput
bin=target/release/examples/layer_throughput
names=("hyper" "hyper + retries RetryLayer" "hyper + tower retry"
       "hyper + tower retry + timeout"
       "reqwest" "reqwest + retries RetryMiddleware" "reqwest + reqwest-retry")
count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 \
        | sed -n 's/.*refs: *//p' | tr -d ,
}
declare -a per
for v in 0 1 2 3 4 5 6; do
    a=$(count "$v" "$low")
    b=$(count "$v" "$high")
    per[$v]=$(( (b - a) / (high - low) ))
done
printf '%-36s %12s %8s\n' "client" "instr/req" "× bare"
for v in 0 1 2 3 4 5 6; do
    base=$(( v < 4 ? 0 : 4 ))
    printf '%-36s %12d %8.3f\n' "${names[$v]}" "${per[$v]}" \
        "$(echo "${per[$v]} / ${per[$base]}" | bc -l)"
done
