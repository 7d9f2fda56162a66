#!/usr/bin/env bash
# Installs what building and testing need on a Debian machine (as root):
# the Rust toolchain if missing, the C libraries rds-ib builds against, the
# network tools and programs the tests use (qperf for the LD_PRELOAD shim),
# and the VM rig (kernel RDS in qemu) when it can be found. Idempotent;
# quiet when everything is present.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"

need_pkgs=()
for p in pkg-config libibverbs-dev librdmacm-dev libclang-dev iproute2 python3 binutils xz-utils qperf; do
    dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
# rds-capi's tests build C programs against its header and <linux/rds.h>.
for p in gcc libc6-dev linux-libc-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "setup: installing ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || true
    apt-get install -y -qq "${need_pkgs[@]}" >/dev/null || echo "setup: WARNING: could not install ${need_pkgs[*]}" >&2
fi

if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    else
        echo "setup: installing the Rust toolchain (rustup)"
        command -v curl >/dev/null || apt-get install -y -qq curl >/dev/null
        curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c clippy -c rustfmt >/dev/null
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
fi
# The test command checks formatting and lints: a toolchain installed
# without them gets them.
for comp in clippy rustfmt; do
    if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1 && command -v rustup >/dev/null 2>&1; then
        echo "setup: adding the $comp component"
        rustup component add "$comp" >/dev/null 2>&1 || echo "setup: WARNING: could not add $comp" >&2
    fi
done

# The VM rig: boots a stock Debian 6.1 kernel with RDS for the conformance
# tests. Found at $VMRIG_DIR, ../shared/vmrig next to this repository, or
# /work/shared/vmrig.
vmrig_dir="${VMRIG_DIR:-}"
if [ -z "$vmrig_dir" ]; then
    for d in "$here/../shared/vmrig" /work/shared/vmrig; do
        if [ -x "$d/vmrig" ]; then vmrig_dir="$d"; break; fi
    done
fi
if [ -x "$vmrig_dir/vmrig" ]; then
    if [ ! -e /var/cache/vmrig/initrd.img ] || [ "${VMRIG_RESETUP:-}" = 1 ]; then
        echo "setup: preparing the VM rig ($vmrig_dir)"
        "$vmrig_dir/vmrig" setup >/tmp/vmrig-setup.log 2>&1 \
            || echo "setup: WARNING: vmrig setup failed (see /tmp/vmrig-setup.log); kernel conformance tests will be skipped" >&2
    fi
else
    echo "setup: no VM rig found (set VMRIG_DIR); kernel conformance tests will be skipped" >&2
fi
