#!/usr/bin/env bash
# Fuzzes the token-file reader (dp_tokens_parse) with libFuzzer + ASan + UBSan
# for $1 seconds (default 10).  Exits non-zero if the fuzzer finds a crash or
# a violated contract; the input is saved as tests/fuzz/findings-tokens/crash-*.
# Seeds: a valid file written by the library's writer, and broken variants of
# it (cut short, trailing bytes, each header field changed).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
out=$(mktemp -d /tmp/dptrain-fuzz-tokens.XXXXXX)
trap 'rm -rf "$out"' EXIT
mkdir -p tests/fuzz/findings-tokens
src=(src/core/error.c src/core/alloc.c src/core/util.c src/core/file.c src/core/rng.c src/data/tokens.c)
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc -fsanitize=address,undefined -fno-sanitize-recover=undefined)
clang "${flags[@]}" -DDP_FUZZ_GEN -o "$out/gen" tests/fuzz/fuzz_tokens.c "${src[@]}" -lz -lm -lpthread
clang "${flags[@]}" -fsanitize=fuzzer -o "$out/fuzz" tests/fuzz/fuzz_tokens.c "${src[@]}" -lz -lm -lpthread
c="$out/corpus"
mkdir -p "$c"
"$out/gen" "$c/valid.bin"
head -c 50 "$c/valid.bin" >"$c/short.bin"
head -c 20 "$c/valid.bin" >"$c/short_header.bin"
{ cat "$c/valid.bin"; printf 'xy'; } >"$c/trailing.bin"
# variant FILE OFFSET OCTAL-BYTES: a copy of valid.bin with bytes replaced at OFFSET
variant() { cp "$c/valid.bin" "$c/$1"; printf "$3" | dd of="$c/$1" bs=1 seek="$2" conv=notrunc status=none; }
variant bad_magic.bin 0 'X'
variant bad_version.bin 8 '\002'
variant vocab_1.bin 12 '\001\000\000\000'
variant vocab_big.bin 12 '\001\000\001\000'
variant count_0.bin 16 '\000'
variant count_huge.bin 23 '\377'
variant bad_crc.bin 24 '\000\000'
variant reserved.bin 28 '\001'
variant vocab_small.bin 12 '\002\000'
"$out/fuzz" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix=tests/fuzz/findings-tokens/ "$c"
