#!/usr/bin/env bash
# One public path per item, one meaning per name: builds the docs of every
# published crate (all features) and fails when two item pages of the same
# crate share a name, whatever their kinds: an inlined second re-export
# produces that, and so does a second item under the same name (a struct
# `limit::Admission` beside a root `Admission` that means something else,
# a trait and a struct both `Budget`). The facade `retries` is the
# runtime under its own name (one glob re-export, which rustdoc inlines at
# both the root and the module of the root's convenience items): it is
# checked through `retries_core`, where those re-exports are links.
#
#   scripts/public-paths.sh        (from the repository's root)
set -euo pipefail
cd "$(dirname "$0")/.."
crates=(retries_core retries_http retries_dedup retries_tower retries_reqwest retries_sqlx retries_chaos)
packages=(retries-core retries retries-http retries-dedup retries-tower retries-reqwest retries-sqlx retries-chaos)
for p in "${packages[@]}"; do
  cargo doc --no-deps --all-features -p "$p" --quiet
done
doc="${CARGO_TARGET_DIR:-target}/doc"
# Distinct items that share a name on purpose (one meaning, two protocols):
# `http::classify_status` and `tonic::classify_status`, each the verdict for
# its protocol's status.
allowed='classify_status.html'
status=0
for c in "${crates[@]}"; do
  # rustdoc writes a redirect page where an item of a private module is
  # re-exported: a redirect is not a second path, so those are skipped.
  dupes=$(cd "$doc/$c" && find . -name '*.html' \
    | grep -E '/(struct|enum|trait|fn|constant|type|macro|static|union)\.[A-Za-z0-9_]+\.html$' \
    | xargs grep -L 'http-equiv="refresh"' \
    | awk -F/ '{print $NF}' | sed -E 's/^[a-z]+\.//' | sort | uniq -d | grep -vxF "$allowed" || true)
  if [ -n "$dupes" ]; then
    status=1
    for d in $dupes; do
      echo "$c: more than one public item or path named ${d%.html}:" >&2
      (cd "$doc/$c" && find . -name "*.$d" | grep -E '/(struct|enum|trait|fn|constant|type|macro|static|union)\.' \
        | xargs grep -L 'http-equiv="refresh"' | sed 's|^\./|  |') >&2
    done
  fi
done
if [ "$status" = 0 ]; then
  echo "one public path per item in ${crates[*]}"
fi
exit "$status"
