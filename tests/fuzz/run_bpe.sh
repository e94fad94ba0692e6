#!/usr/bin/env bash
# Fuzzes the BPE tokenizer file reader (dp_bpe_parse) with libFuzzer + ASan + UBSan for
# $1 seconds (default 10).  Exits non-zero if the fuzzer finds a crash or a violated
# contract; the input is saved as tests/fuzz/findings-bpe/crash-*.
# Seeds: two valid files trained by the library (pre-split none and space), and broken
# variants (cut short, trailing bytes, each header line changed, a bad merge).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
out=$(mktemp -d /tmp/dptrain-fuzz-bpe.XXXXXX)
trap 'rm -rf "$out"' EXIT
mkdir -p tests/fuzz/findings-bpe
src=(src/core/error.c src/core/alloc.c src/core/util.c src/core/file.c src/data/bpe.c src/data/bpe_file.c)
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc -fsanitize=address,undefined -fno-sanitize-recover=undefined)
clang "${flags[@]}" -DDP_FUZZ_GEN -o "$out/gen" tests/fuzz/fuzz_bpe.c "${src[@]}" -lz -lm -lpthread
clang "${flags[@]}" -fsanitize=fuzzer -o "$out/fuzz" tests/fuzz/fuzz_bpe.c "${src[@]}" -lz -lm -lpthread
c="$out/corpus"
mkdir -p "$c"
"$out/gen" "$c/valid_space.bpe" space
"$out/gen" "$c/valid_none.bpe" none
v="$c/valid_space.bpe"
head -c 100 "$v" >"$c/short.bpe"
head -c 10 "$v" >"$c/short_magic.bpe"
{ cat "$v"; printf '1 2\n'; } >"$c/trailing.bpe"
sed '1s/ 1$/ 2/' "$v" >"$c/version.bpe"
sed '2s/.*/vocab 256/' "$v" >"$c/vocab_small.bpe"
sed '2s/.*/vocab 65536/' "$v" >"$c/vocab_big.bpe"
sed '3s/.*/split regex/' "$v" >"$c/split.bpe"
sed '3s/.*/split none/' "$v" >"$c/split_none.bpe"
sed '4s/.*/300 1/' "$v" >"$c/future_token.bpe"
sed '5s/.*/104 32/' "$v" >"$c/crossing.bpe"
printf 'dptrain-bpe 1\nvocab 267\nsplit none\n97 97\n256 256\n257 257\n258 258\n259 259\n260 260\n261 261\n262 262\n263 263\n264 264\n265 265\n' >"$c/long_token.bpe"
"$out/fuzz" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix=tests/fuzz/findings-bpe/ "$c"
