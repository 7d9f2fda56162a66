#!/usr/bin/env bash
# Runs every test of the project: the habits (rustfmt, rustdoc and clippy
# without warnings, every unsafe block documented), unit and
# integration tests (release build: the stress tests move gigabytes), the
# conformance tests against the Linux kernel in the VM rig (TCP, and rds-ib's
# verbs feature against rds_rdma over rxe; skipped with a loud line when the
# rig cannot start), and short fuzz runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== habits (formatting, docs without warnings; clippy below denies undocumented unsafe blocks)"
cargo fmt --all -- --check
(cd fuzz && cargo fmt -- --check)
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p rds-ib --features verbs --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p rds-sock --features ib --quiet
echo "== build"
cargo build --release --workspace --all-targets
echo "== clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== tests"
cargo test --release --workspace --exclude rds-preload
echo "== the LD_PRELOAD shim (librdspreload.so): unmodified qperf rds_bw / rds_lat, python3's socket module (readiness, EINTR, fork) and tests/kernel/conform.py against rds-conform, on loopback in private network namespaces; qperf under the shim against the kernel's qperf in the VM rig"
cargo test --release -p rds-preload
echo "== the shim as it ships (the dist profile, link-time optimised: Cargo.toml): the host's qperf, python3 and conform.py tests again with it"
cargo rustc --profile dist -q -p rds-preload --lib --crate-type cdylib
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
RDS_TEST_SHIM="$target_dir/dist/librdspreload.so" cargo test --release -p rds-preload --test qperf --test python --test conform_host
echo "== rds-ib verbs (lints with the RDMA features; rds-ib's unit tests; kernel_ib: RDMA CM against the kernel's rds_rdma over Soft-RoCE in the VM rig)"
cargo clippy -p rds-ib --all-targets --features verbs -- -D warnings
cargo clippy -p rds-sock --all-targets --features ib -- -D warnings
cargo clippy -p rds-tools --all-targets --features ib -- -D warnings
cargo clippy -p rds-tests --all-targets --features ib -- -D warnings
cargo test --release -p rds-ib --features verbs
cargo test --release -p rds-tests --features verbs --test kernel_ib
echo "== the engine with IB (rds-sock's ib feature, tests in rds-tests) (engine to engine and to the kernel's rds_rdma over rxe in the VM rig)"
cargo test --release -p rds-tests --features ib --test ib_vm
echo "== the engine with IB (rds-sock's ib feature, tests in rds-tests), verbs-only setup (PSK-authenticated side channel, a wrong key refused) in the VM rig"
cargo test --release -p rds-tests --features ib --test ib_vm_psk
echo "== the engine with IB (rds-sock's ib feature, tests in rds-tests): connections broken mid-stream (verbs-only: side channel killed; RDMA CM: RoCE v2 dropped, ours and the kernel's rds_rdma), nothing lost or duplicated (VM rig)"
cargo test --release -p rds-tests --features ib --test ib_vm_disconnect
echo "== the engine with IB (rds-sock's ib feature, tests in rds-tests): RDMA READ / WRITE through the socket API, ours and the kernel's rds_rdma (VM rig)"
cargo test --release -p rds-tests --features ib --test ib_vm_rdma
echo "== fuzz (5 s per target; scripts/fuzz.sh 600 for ten minutes each)"
scripts/fuzz.sh 5
echo "== done"
