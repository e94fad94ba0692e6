#!/usr/bin/env bash
# Fuzzes the readers of other projects' token files, llm.c's shards
# (dp_tokens_parse_llmc) and nanoGPT's raw uint16 arrays (dp_tokens_parse_raw_u16), with
# libFuzzer + ASan + UBSan for $1 seconds (default 10).  Exits non-zero if the fuzzer
# finds a crash or a violated contract; the input is saved as
# tests/fuzz/findings-llmc/crash-*.
# Seeds: valid shards in llm.c's layout, broken variants of one (cut short, trailing
# bytes, each header field changed), and raw arrays.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
out=$(mktemp -d /tmp/dptrain-fuzz-llmc.XXXXXX)
trap 'rm -rf "$out"' EXIT
mkdir -p tests/fuzz/findings-llmc
src=(src/core/error.c src/core/alloc.c src/core/util.c src/core/file.c src/core/rng.c src/data/tokens.c)
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc -fsanitize=address,undefined -fno-sanitize-recover=undefined)
clang "${flags[@]}" -DDP_FUZZ_GEN -o "$out/gen" tests/fuzz/fuzz_llmc.c "${src[@]}" -lz -lm -lpthread
clang "${flags[@]}" -fsanitize=fuzzer -o "$out/fuzz" tests/fuzz/fuzz_llmc.c "${src[@]}" -lz -lm -lpthread
c="$out/corpus"
mkdir -p "$c"
"$out/gen" "$c/valid.bin" 40
"$out/gen" "$c/valid1.bin" 1
head -c 1050 "$c/valid.bin" >"$c/short.bin"
head -c 500 "$c/valid.bin" >"$c/short_header.bin"
{ cat "$c/valid.bin"; printf 'xy'; } >"$c/trailing.bin"
# variant FILE OFFSET OCTAL-BYTES: a copy of valid.bin with bytes replaced at OFFSET
variant() { cp "$c/valid.bin" "$c/$1"; printf "$3" | dd of="$c/$1" bs=1 seek="$2" conv=notrunc status=none; }
variant bad_magic.bin 0 'X'
variant bad_version.bin 4 '\002'
variant count_0.bin 8 '\000'
variant count_neg.bin 11 '\377'
variant count_more.bin 8 '\051'
variant count_less.bin 8 '\047'
tail -c 80 "$c/valid.bin" >"$c/raw.bin"
printf '\377\377\001\000' >"$c/raw_big_token.bin"
printf '\001\000\002' >"$c/raw_odd.bin"
"$out/fuzz" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix=tests/fuzz/findings-llmc/ "$c"
