#!/usr/bin/env bash
# The Python package's CI (no GPU): a fresh virtual environment, the wheel
# built and installed the way a user installs it (`pip install ./python`),
# the Rust producer/consumer examples the tests run against, then pytest.
# Called from .ci/run as `step bash python/ci.sh`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "==> installing python3-venv"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq python3-venv
fi

venv=target/ci-venv
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q maturin pytest numpy

# The extension crate is outside the root package: format and lint it here.
cargo fmt --check
cargo clippy --all-targets -q -- -D warnings

# The examples the tests start (debug profile: `cargo test` built it already).
(cd .. && cargo build -q --example producer --example consumer --example packet_producer)
export VRAMRING_EXAMPLES="$PWD/../target/debug/examples"

"$venv/bin/python" -m pip install -q .
"$venv/bin/python" -c 'import vramring; print("vramring", vramring.__version__, "from", vramring.__file__)'

rc=0
"$venv/bin/python" -m pytest tests -q -p no:cacheprovider || rc=$?
if [[ $rc -eq 5 ]]; then
    echo "pytest collected no tests: treating that as a failure" >&2
    exit 1
fi
exit $rc
