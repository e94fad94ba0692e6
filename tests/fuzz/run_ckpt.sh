#!/usr/bin/env bash
# Fuzzes the checkpoint reader with libFuzzer + ASan + UBSan for $1 seconds
# (default 10).  Exits non-zero if the fuzzer finds a crash.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
out=$(mktemp -d /tmp/dptrain-fuzz-ckpt.XXXXXX)
trap 'rm -rf "$out"' EXIT
src=(src/core/*.c src/train/ckpt.c)
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc -fsanitize=address,undefined -fno-sanitize-recover=undefined)
clang "${flags[@]}" -DDP_FUZZ_GEN -o "$out/gen" tests/fuzz/fuzz_ckpt.c "${src[@]}" -lz -lm -lpthread
clang "${flags[@]}" -fsanitize=fuzzer -o "$out/fuzz" tests/fuzz/fuzz_ckpt.c "${src[@]}" -lz -lm -lpthread
mkdir -p "$out/corpus"
"$out/gen" "$out/corpus/valid.bin"
head -c 100 "$out/corpus/valid.bin" >"$out/corpus/short.bin"
"$out/fuzz" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus"
