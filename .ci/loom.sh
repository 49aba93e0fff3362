#!/usr/bin/env bash
# loom model checks of the ring protocol (tests/loom.rs), of the packet
# ring (tests/loom_packet.rs), of push delivery's buffer handshake
# (tests/loom_push.rs, queued: tests/loom_push_queue.rs) and of the subscriber-entry lifecycle in
# src/ring/table.rs (tests/loom_table.rs). A separate target dir keeps the
# --cfg loom build from invalidating the normal one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export RUSTFLAGS="--cfg loom"
export CARGO_TARGET_DIR=target/loom
cargo test --release --test loom --test loom_push --test loom_push_queue --test loom_packet --test loom_table -- --test-threads=1
