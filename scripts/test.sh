#!/usr/bin/env bash
# Runs every test of the project: formatting-independent lint, unit and
# integration tests (release build: the stress tests move gigabytes), and the
# conformance tests against the Linux kernel in the VM rig (skipped with a
# loud line when the rig cannot start).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== build"
cargo build --release --workspace --all-targets
echo "== clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== tests"
cargo test --release --workspace
echo "== fuzz (5 s per target; scripts/fuzz.sh 600 for ten minutes each)"
scripts/fuzz.sh 5
echo "== done"
