#!/bin/sh
# Builds the IDX fuzzer with libFuzzer + ASan + UBSan and runs it.
#
#     tests/fuzz/run.sh [SECONDS]     (default 10; run from anywhere)
#
# The binary goes to build-fuzz/, the seed corpus (a valid IDX file and a few
# broken ones) to a temporary directory; a crash is saved as
# tests/fuzz/findings-idx/crash-* and the script exits non-zero.  Replay one
# with: build-fuzz/fuzz_idx tests/fuzz/findings-idx/crash-...
set -eu
secs=${1:-10}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
CC=${CC:-clang}
mkdir -p build-fuzz tests/fuzz/findings-idx
$CC -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -Iinclude -Isrc \
    tests/fuzz/fuzz_idx.c src/core/error.c src/core/alloc.c src/data/idx.c \
    -lz -o build-fuzz/fuzz_idx

corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
# hdr TYPE NDIM DIM... : the header bytes as printf escapes.
hdr() {
    t=$1 n=$2; shift 2
    s="\\000\\000\\$t\\$n"
    for d in "$@"; do
        s="$s$(printf '\\%03o\\%03o\\%03o\\%03o' $((d >> 24 & 255)) $((d >> 16 & 255)) \
            $((d >> 8 & 255)) $((d & 255)))"
    done
    printf "$s"
}
{ hdr 010 003 2 3 4; head -c 24 /dev/urandom; } > "$corpus/valid3d"
{ hdr 010 001 5; printf 'abcde'; } > "$corpus/valid1d"
{ hdr 010 004 1 2 1 2; printf 'wxyz'; } > "$corpus/valid4d"
{ hdr 010 003 2 3 4; head -c 20 /dev/urandom; } > "$corpus/truncated"
{ hdr 010 001 5; printf 'abcdefg'; } > "$corpus/trailing"
{ hdr 015 001 2; printf 'abcdefgh'; } > "$corpus/float_type"
{ hdr 010 005 1 1 1 1 1; printf 'a'; } > "$corpus/ndim5"
{ hdr 010 002 0 3; } > "$corpus/zero_dim"
{ hdr 010 004 4294967295 4294967295 4294967295 4294967295; } > "$corpus/huge"
printf '\001\000\010\001' > "$corpus/bad_magic"

./build-fuzz/fuzz_idx -max_total_time="$secs" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix=tests/fuzz/findings-idx/ "$corpus"
