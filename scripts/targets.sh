#!/usr/bin/env bash
# Every performance target of the engine (`tests/bench/README.md`, "Where
# the targets stand") measured in one run, each marked met or missed:
#
#   instructions per call     scripts/instructions.sh (callgrind)
#   bytes per call's future   the example `future_sizes`
#   the doors over sockets    scripts/layer-instructions.sh (callgrind)
#   telemetry                 scripts/telemetry.sh (callgrind)
#   a ready call in time      cargo bench --bench overhead -- '^ready/'
#                             (criterion: `retries` and the peers)
#   compile time              scripts/compile-time.sh --instructions (200 fns,
#                             rustc's instructions under callgrind), and
#                             --lines (what each fn expands to)
#
#   bash scripts/targets.sh            all six (~25 minutes on 2 cores)
#   bash scripts/targets.sh --quick    without the compile time and the
#                                      criterion run (~8 minutes)
#
# Needs valgrind. Prints the raw figures, then one line per target; under
# a target missed, a `why:` line with the profile of the same run that says
# where the difference goes (issue 64: "each met or, where not, with the
# profile that says why").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
quick=false
[ "${1:-}" = "--quick" ] && quick=true
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "== instructions per call (scripts/instructions.sh)"
bash scripts/instructions.sh --profile | tee "$out/instr"
echo "== bytes per future (future_sizes)"
cargo run -q --release -p retries-bench --features examples --example future_sizes | tee "$out/sizes"
echo "== instructions per request over sockets (scripts/layer-instructions.sh)"
bash scripts/layer-instructions.sh | tee "$out/layers"
echo "== telemetry (scripts/telemetry.sh)"
bash scripts/telemetry.sh | tee "$out/telemetry"
if ! $quick; then
    echo "== a ready call in time (criterion)"
    cargo bench -q -p retries-bench --bench overhead -- '^ready/' 2>&1 | tee "$out/criterion"
    echo "== compile time (scripts/compile-time.sh --instructions)"
    bash scripts/compile-time.sh --instructions | tee "$out/compile"
    echo "== lines per function once expanded (scripts/compile-time.sh --lines)"
    bash scripts/compile-time.sh --lines | tee "$out/lines"
fi

get() { awk -v k="$2" '$1 == k { print $2 }' "$out/$1"; }
# The instructions of the client whose name is exactly $1.
layer() { awk -v n="$1" '{ line = $0; sub(/ +[0-9]+ +[0-9.]+$/, "", line); if (line == n) print $(NF - 1) }' "$out/layers"; }
verdict() { # measured, target, "≤" test as awk expression of m and t
    if awk -v m="$1" -v t="$2" "BEGIN { exit !($3) }"; then echo met; else echo missed; fi
}
row() { printf '%-58s %-30s %s\n' "$1" "$2" "$3"; }
why() { printf '    why: %s\n' "$*"; }

ready=$(get instr ready) breaker=$(get instr breaker) call=$(get instr call)
yield=$(get instr yield) hyield=$(get instr hand_yield)
once=$(get instr once) honce=$(get instr hand_once)
fut=$(get sizes retryable) hand=$(get sizes hand_loop) nested=$(get sizes retryable_nested)
bare=$(layer "hyper") ours=$(layer "hyper + retries RetryLayer") rt=$(layer "hyper + tower retry + timeout")
rth=$(layer "hyper + tower retry + timeout + deadline header")
rq=$(layer "reqwest (no middleware)") mw=$(layer "reqwest + retries RetryMiddleware") rr=$(layer "reqwest + reqwest-retry")
rrh=$(layer "reqwest + reqwest-retry + timeout + deadline header")
tonic=$(layer "tonic channel") grpc=$(layer "tonic channel + retries RetryLayer::grpc")

echo
echo "== targets (one run, $(date -u +%Y-%m-%d))"
echo "-- the engine's floor (issue 49, resolved with its misses explained: tests/bench/README.md, \"The engine at its floor, second step\")"
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
echo "-- the doors at their peers, telemetry, a ready call in time, compile time (issue 64)"
v_layer=$(verdict "$ours" "$rt" 'm <= t')
row "tower layer ≤ tower retry + timeout" "$(awk -v a="$ours" -v b="$bare" -v c="$rt" 'BEGIN { printf "%.3f× vs %.3f× bare", a / b, c / b }')" "$v_layer"
row "  tower's pair writing the layer's deadline header (its wire work)" \
    "$(awk -v c="$rth" -v b="$bare" 'BEGIN { printf "%.3f× bare", c / b }'): the header $((rth - rt)) a request" \
    "$(verdict "$ours" "$rth" 'm <= t')"
lb=$(get instr layer_bare) ll=$(get instr layer) lt=$(get instr layer_tower)
row "  the layer in process (deterministic; over its service)" "+$((ll - lb)) vs tower retry +$((lt - lb)) instructions" "-"
if [ "$v_layer" = missed ]; then
    frees=$(awk '$1 == "layer_frees_in" { printf "%s%s %s", sep, $2, $3; sep = ", " }' "$out/instr")
    why "over sockets the deadline header costs $((rth - rt)) a request (written by the layer, parsed by the server);" \
        "in process (layer_profile) the layer allocates $(get instr layer_allocations) times a request against tower retry's $(get instr layer_tower_allocations)" \
        "(freed in: $frees: the header's map and value, the call's boxed future and head)," \
        "$(get instr layer_in_allocator) instructions in the allocator against $(get instr layer_tower_in_allocator)," \
        "$(get instr layer_in_memcpy) in memcpy against $(get instr layer_tower_in_memcpy) (its larger futures moved);" \
        "the rest is the call's rules (budget, breaker slot, hooks, key, plan) that tower's retry does not have"
fi
v_middleware=$(verdict "$mw" "$rr" 'm <= t')
row "middleware ≤ reqwest-retry" "$(awk -v a="$mw" -v b="$rq" -v c="$rr" 'BEGIN { printf "%.3f× vs %.3f× bare", a / b, c / b }')" "$v_middleware"
row "  reqwest-retry under a timeout writing the header (its wire work)" \
    "$(awk -v c="$rrh" -v b="$rq" 'BEGIN { printf "%.3f× bare", c / b }'): timeout and header $((rrh - rr)) a request" \
    "$(verdict "$mw" "$rrh" 'm <= t')"
if [ "$v_middleware" = missed ]; then
    why "the middleware bounds each attempt by the call's deadline and writes it on the wire;" \
        "reqwest-retry doing the same (the client's timeout, the header) costs $((rrh - rr)) a request more," \
        "and is then $((rrh - mw)) above the middleware"
fi
tel() { awk -v s="$1" -v k="$2" '$1 == s && $2 == k { print $3 }' "$out/telemetry"; }
seen() { awk -v k="$1" '$1 == k { $1 = ""; sub(/^ /, ""); print }' "$out/telemetry"; }
plain=$(tel none tracing) metered=$(tel none metrics)
row "metrics compiled in, no recorder ≤ 1.10× without" "$metered / $plain = $(awk -v a="$metered" -v b="$plain" 'BEGIN { printf "%.3f×", a / b }')" \
    "$(verdict "$metered" "$(awk -v b="$plain" 'BEGIN { print 1.10 * b }')" 'm <= t')"
reg=$(tel registry metrics) hreg=$(tel registry hand_metrics)
row "Registry recorder ≤ the same metrics by hand" "$reg vs $hreg" "$(verdict "$reg" "$hreg" 'm <= t')"
info=$(tel fmt_info tracing) oinfo=$(tel otel_info tracing)
row "first-time success at INFO costs nothing" "fmt $info, OpenTelemetry $oinfo vs none $plain" \
    "$(verdict "$(( (info > oinfo ? info : oinfo) - plain ))" 2 'm <= t')"
retried=$(seen retried_success) gave=$(seen gave_up) first=$(seen first_time_success)
row "retried / gave up seen at INFO" "$retried / $gave (first-time: $first)" \
    "$( [ "$retried" = "INFO_event=1" ] && [ "$gave" = "WARN_event=1" ] && [ "$first" = "nothing" ] && echo met || echo missed)"
otel=$(tel otel_debug tracing) hotel=$(tel otel_debug hand)
v_otel=$(verdict "$otel" "$(awk -v b="$hotel" 'BEGIN { print 1.25 * b }')" 'm <= t')
row "OpenTelemetry at DEBUG ≤ 1.25× instrumented hand loop" "$otel / $hotel = $(awk -v a="$otel" -v b="$hotel" 'BEGIN { printf "%.2f×", a / b }')" "$v_otel"
if [ "$v_otel" = missed ]; then
    hnone=$(tel none hand)
    why "at DEBUG a first-time success emits $(seen debug_first_time_success), the hand loop $(seen debug_hand);" \
        "the hand loop's one span costs $((hotel - hnone)) through the OpenTelemetry layer (its count above no subscriber)," \
        "so a call span and an attempt span alone are ~$((2 * (hotel - hnone))), above 1.25 × $hotel:" \
        "a span per attempt, the first one included, is kept by choice (gRFC A72; tests/bench/README.md, \"The price of telemetry\")"
fi
row "gRPC layer (no target of its own; × a bare channel)" "$(awk -v a="$grpc" -v b="$tonic" 'BEGIN { printf "%.3f×", a / b }')" "-"
if ! $quick; then
    # criterion's median of each `ready/…` id, in ns (a long id is printed
    # on a line of its own, its times on the next).
    ns() {
        awk -v id="ready/$1" '
            $1 == id { found = 1 }
            found && /time:/ { v = $0; sub(/.*time: *\[[^ ]+ [^ ]+ /, "", v); split(v, p, " ")
                u = p[2]; m = p[1]; if (u == "ps") m /= 1000; if (u == "µs") m *= 1000; if (u == "ms") m *= 1e6
                print m; exit }' "$out/criterion"
    }
    r=$(ns retryable) hl=$(ns hand_loop) th=$(ns tryhard) trt=$(ns tokio-retry) bo=$(ns backon) ag=$(ns again)
    tht=$(ns tryhard+timeout) trtt=$(ns tokio-retry+timeout)
    fastest=$(printf '%s\n' "$hl" "$tht" "$trtt" | sort -g | head -1)
    row "ready (criterion) ≤ the fastest bound by a deadline" \
        "$r ns vs $fastest ns (hand loop $hl, tryhard+timeout $tht, tokio-retry+timeout $trtt)" \
        "$(verdict "$r" "$fastest" 'm <= t')"
    row "  the peers without a deadline (no target)" "tryhard $th, tokio-retry $trt, backon $bo, again $ag ns" "-"
    rb=$(awk '/retryable \/ backon/ { sub(/×/, "", $4); print $4 }' "$out/compile")
    ri=$(awk '/retryable \/ instrument/ { sub(/×/, "", $4); print $4 }' "$out/compile")
    v_backon=$(verdict "$rb" 1.0 'm <= t') v_instrument=$(verdict "$ri" 1.0 'm <= t')
    row "compile ≤ backon closures (200 fns, rustc instructions)" "${rb}×" "$v_backon"
    row "compile ≤ #[instrument]" "${ri}×" "$v_instrument"
    # The phases of `compile-time.sh` where `retryable` and a peer differ
    # by 0.05 G or more, most first; its columns: plain, retryable,
    # instrument, backon.
    phases_against() { # column of the peer (3 instrument, 4 backon)
        awk -v col="$1" '
            /^where they went/ { on = 1; next }
            on && NF > 4 && $1 != "phase" {
                label = $1; for (i = 2; i <= NF - 4; i++) label = label " " $i
                d = $(NF - 2) - $(NF - 4 + col)
                if (d >= 0.05 || d <= -0.05) printf "%+.2f G %s\n", d, label
            }' "$out/compile" | sort -g -r | paste -sd ';' | sed 's/;/; /g'
    }
    if [ "$v_backon" = missed ]; then
        why "rustc's phases against backon (inclusive, they overlap): $(phases_against 4)"
    fi
    if [ "$v_instrument" = missed ]; then
        why "rustc's phases against #[instrument] (inclusive, they overlap): $(phases_against 3)"
    fi
    row "  lines a fn expands to (no target)" \
        "$(awk '$1 ~ /^(retryable|instrument|backon|plain)$/ { printf "%s%s %s", sep, $1, $2; sep = ", " }' "$out/lines")" "-"
fi
