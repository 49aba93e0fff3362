#!/usr/bin/env bash
# The library's public API against its committed listing, api/vramring.txt:
# any change to what a user can name shows in review. rustdoc's JSON output
# is unstable, so this asks for it with RUSTC_BOOTSTRAP on the stable
# toolchain; .ci/public_api.py turns it into one line an item.
#   bash .ci/public-api.sh          compare (CI)
#   bash .ci/public-api.sh --bless  rewrite the listing after a deliberate change
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RUSTC_BOOTSTRAP=1 cargo rustdoc -q -p vramring --lib --features nvdec -- -Z unstable-options --output-format json
now=$(mktemp)
trap 'rm -f "$now"' EXIT
python3 .ci/public_api.py target/doc/vramring.json > "$now"
if [[ "${1:-}" == "--bless" ]]; then
    cp "$now" api/vramring.txt
    echo "api/vramring.txt: $(wc -l < api/vramring.txt) items"
    exit 0
fi
if ! diff -u api/vramring.txt "$now"; then
    echo "The public API changed (above: - committed, + this tree). If that is deliberate, run" >&2
    echo "  bash .ci/public-api.sh --bless" >&2
    echo "and commit api/vramring.txt with the change." >&2
    exit 1
fi
echo "public API unchanged: $(wc -l < api/vramring.txt) items"
