#!/usr/bin/env bash
# Runs the cargo-fuzz targets of fuzz/ (libFuzzer with AddressSanitizer)
# for a while each.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]    default: 5 s each, every target
#
# Examples:
#   scripts/fuzz.sh 5                  # the short run of scripts/test.sh (CI)
#   scripts/fuzz.sh 600 node_recv      # ten minutes of one target
#   FUZZ_JOBS=2 scripts/fuzz.sh 600    # two fuzzing processes per target
#   (several scripts/fuzz.sh may run at once with one job each)
#
# Targets: header (Header::decode), exthdr (Header::extensions and
# push_extension), frame (FrameDecoder::feed and direct reads), congmap
# (CongMap::from_wire, update_from), node_recv (a Node's whole receive path
# fed TCP byte streams); ib_private (rds-ib's RDMA CM private data and the
# version negotiation), ib_frag (rds-ib's fragment reassembler), ib_side
# (rds-ib's verbs-only side channel: header, parameters, handshake);
# info_codec (rds-info's request, response header and snapshot body),
# info_ipc (rds-info's exchange: a hostile client, a hostile node). The
# README's Fuzzing section says what each checks. The corpus grows in fuzz/corpus/TARGET (kept
# between runs, not committed); a crash leaves its input in
# fuzz/artifacts/TARGET/ and fails the run. Reproduce one with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run -O TARGET fuzz/artifacts/TARGET/crash-...
#
# cargo-fuzz needs nightly-only compiler flags (-Zsanitizer=address and the
# sanitizer-coverage passes). Only a stable toolchain is available here, so
# RUSTC_BOOTSTRAP=1 lets the stable compiler accept them; its x86_64 Linux
# distribution ships the ASan runtime. cargo-fuzz itself is installed from
# crates.io when missing; if that fails the run is skipped with a SKIP line.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
secs="${1:-5}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(header exthdr frame congmap node_recv ib_private ib_frag ib_side info_codec info_ipc)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz from crates.io"
    if ! cargo install cargo-fuzz --locked >/tmp/cargo-fuzz-install.log 2>&1; then
        echo "SKIP: fuzz: cargo-fuzz could not be installed (see /tmp/cargo-fuzz-install.log); no fuzz target was run" >&2
        exit 0
    fi
fi
export RUSTC_BOOTSTRAP=1
cd fuzz
if ! cargo fuzz build -O >/tmp/fuzz-build.log 2>&1; then
    cat /tmp/fuzz-build.log >&2
    echo "fuzz: FAILED to build the fuzz targets" >&2
    exit 1
fi
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    log="/tmp/fuzz-$t.log"
    if [ "${FUZZ_JOBS:-1}" -gt 1 ]; then
        # libFuzzer's jobs write fuzz-N.log in the current directory: one
        # such run at a time.
        rm -f fuzz-*.log
        cargo fuzz run -O "$t" -- -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
            -jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS" -print_final_stats=1 >"$log" 2>&1
        rc=$?
        cat fuzz-*.log >>"$log" 2>/dev/null
        rm -f fuzz-*.log
    else
        cargo fuzz run -O "$t" -- -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
            -print_final_stats=1 >"$log" 2>&1
        rc=$?
    fi
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{s+=$2} END {print s+0}')
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}')
    ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | awk '{print $2}')
    corp=$(find "corpus/$t" -type f | wc -l)
    if [ $rc -ne 0 ]; then
        status=1
        echo "fuzz: $t FAILED after ${secs}s (log $log):"
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -8
    else
        echo "fuzz: $t ok: ${secs}s, $runs runs, coverage $cov edges, $ft features, corpus $corp"
    fi
done
exit $status
