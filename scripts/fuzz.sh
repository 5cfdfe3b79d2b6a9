#!/usr/bin/env bash
# Fuzzing the parsers that take untrusted input (fuzz/README.md).
#
#   scripts/fuzz.sh replay [ARGS]   every file of fuzz/corpus/<target>/ (and of
#                                   fuzz/artifacts/<target>/) through the targets, as a
#                                   plain `cargo test` (ARGS go to it): stable
#                                   toolchain, no cargo-fuzz
#   scripts/fuzz.sh run [SECONDS]   each target under libFuzzer for SECONDS (default 30),
#                                   installing cargo-fuzz first if it is missing
#   scripts/fuzz.sh merge           adds to fuzz/corpus/ the inputs of earlier runs
#                                   (fuzz/.work/) that reach code the corpus does not
#
# Environment:
#   FUZZ_TARGETS     targets to run (default: every fuzz/fuzz_targets/*.rs)
#   FUZZ_SANITIZER   none (default) or address. `none` needs nothing but the stable
#                    toolchain. `address` builds with AddressSanitizer, which rustc
#                    accepts only as a nightly flag: the script sets RUSTC_BOOTSTRAP=1
#                    for it (and CARGO_CACHE_RUSTC_INFO=0, so cargo does not reuse a
#                    failed probe cached by an earlier run without it), in its own
#                    target directory, fuzz/target/asan.
#
# `run` leaves the committed corpus alone: libFuzzer writes what it finds to
# fuzz/.work/<target>/ (ignored by git) and reads fuzz/corpus/<target>/ as seeds. A crash
# is saved in fuzz/artifacts/<target>/, which `replay` then runs too, so it stays red
# until it is fixed. The exit status is non-zero when any target found a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
}

if [ -n "${FUZZ_TARGETS:-}" ]; then
    read -r -a targets <<<"$FUZZ_TARGETS"
else
    targets=()
    for source in fuzz/fuzz_targets/*.rs; do
        name=${source##*/}
        targets+=("${name%.rs}")
    done
fi

sanitizer=${FUZZ_SANITIZER:-none}
fuzz_flags=()
case "$sanitizer" in
    none)
        fuzz_flags=(--sanitizer none)
        ;;
    address)
        export RUSTC_BOOTSTRAP=1 CARGO_CACHE_RUSTC_INFO=0
        fuzz_flags=(--sanitizer address --target-dir "$root/fuzz/target/asan")
        ;;
    *)
        echo "FUZZ_SANITIZER must be none or address, not $sanitizer" >&2
        exit 2
        ;;
esac

need_cargo_fuzz() {
    if ! cargo fuzz --version >/dev/null 2>&1; then
        echo "==> installing cargo-fuzz" >&2
        cargo install cargo-fuzz --locked
    fi
}

cmd=${1:-}
case "$cmd" in
    replay)
        exec cargo test --manifest-path fuzz/Cargo.toml "${@:2}"
        ;;

    run)
        seconds=${2:-30}
        case "$seconds" in '' | *[!0-9]*) usage ;; esac
        need_cargo_fuzz
        echo "==> building the fuzz targets (sanitizer: $sanitizer)"
        cargo fuzz build "${fuzz_flags[@]}"
        failed=()
        summary=()
        for target in "${targets[@]}"; do
            work="$root/fuzz/.work/$target"
            mkdir -p "$work"
            args=(-max_total_time="$seconds" -timeout=10 -print_final_stats=1)
            if [ -f "fuzz/dict/$target.dict" ]; then
                args+=(-dict="$root/fuzz/dict/$target.dict")
            fi
            echo "==> $target for ${seconds}s"
            log="$work.log"
            set +e
            cargo fuzz run "${fuzz_flags[@]}" "$target" "$work" "$root/fuzz/corpus/$target" \
                -- "${args[@]}" 2>&1 | tee "$log" | grep -E --line-buffered \
                'INITED|DONE|pulse|ERROR|panicked|SUMMARY|Test unit written|^stat::'
            status=${PIPESTATUS[0]}
            set -e
            execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
            rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
            cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
            if [ "$status" -ne 0 ]; then
                failed+=("$target")
                summary+=("$target: FAILED (exit $status), see $log and fuzz/artifacts/$target/")
            else
                summary+=("$target: ${execs:-?} execs, ${rate:-?} exec/s, $cov, no crash")
            fi
        done
        echo
        printf '%s\n' "${summary[@]}"
        if [ ${#failed[@]} -gt 0 ]; then
            echo "crashes in: ${failed[*]} (reproduce: scripts/fuzz.sh replay, or" \
                "cargo fuzz run ${fuzz_flags[*]} TARGET fuzz/artifacts/TARGET/crash-...)" >&2
            exit 1
        fi
        ;;

    merge)
        need_cargo_fuzz
        for target in "${targets[@]}"; do
            work="$root/fuzz/.work/$target"
            [ -d "$work" ] || continue
            before=$(find "fuzz/corpus/$target" -type f | wc -l)
            # Edges only (-use_counters=0): with hit counts the corpus grows tenfold.
            cargo fuzz run "${fuzz_flags[@]}" "$target" "$root/fuzz/corpus/$target" "$work" \
                -- -merge=1 -use_counters=0 2>&1 | grep -E 'MERGE-OUTER: [0-9]+ new files' || true
            after=$(find "fuzz/corpus/$target" -type f | wc -l)
            echo "$target: $before -> $after corpus files"
            if [ "$after" -gt 200 ]; then
                echo "  over 200 files: keep fuzz/corpus/$target small (fuzz/README.md)" >&2
            fi
        done
        ;;

    *)
        usage
        ;;
esac
