#!/usr/bin/env bash
# The rustc wrapper of the fuzz campaign's builds (RUSTC_WRAPPER): every crate gets the
# coverage instrumentation cargo-fuzz asks for, except the X25519 arithmetic, BLAKE2s and the
# hasher of the fuzzer's memo of their results (crates/ordo-proto/src/memo.rs). They are not
# the code under test, the first two are constant-time (no branch to guide the fuzzer), and
# their instrumented comparisons took most of every execution that completes a handshake.
rustc=$1
shift
case " $* " in
*" --crate-name curve25519_dalek "* | *" --crate-name x25519_dalek "* | *" --crate-name blake2 "* | *" --crate-name foldhash "*)
    args=()
    for a in "$@"; do
        case $a in
        -Cpasses=sancov-module | -Cllvm-args=-sanitizer-coverage*) ;;
        *) args+=("$a") ;;
        esac
    done
    exec "$rustc" "${args[@]}"
    ;;
esac
exec "$rustc" "$@"
