#!/usr/bin/env bash
# Fuzzes the model-file parser (dp_model_from_text) with libFuzzer + ASan + UBSan for $1
# seconds (default 10).  Exits non-zero if the fuzzer finds a crash or a violated contract;
# the input is saved as tests/fuzz/findings-model/crash-*.  Seeds: the shipped models/*.txt
# and a few broken variants of them.  The layers are built (shapes, parameters), never run.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
out=$(mktemp -d /tmp/dptrain-fuzz-model.XXXXXX)
trap 'rm -rf "$out"' EXIT
mkdir -p tests/fuzz/findings-model
src=(src/core/*.c src/nn/*.c)
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc -fsanitize=address,undefined -fno-sanitize-recover=undefined)
clang "${flags[@]}" -fsanitize=fuzzer -o "$out/fuzz" tests/fuzz/fuzz_model.c "${src[@]}" -lz -lm -lpthread
c="$out/corpus"
mkdir -p "$c"
cp models/*.txt "$c/"
sed 's/out=32/out=0/' models/cnn.txt >"$c/out0.txt"
sed 's/kernel=3/kernel=99/' models/cnn.txt >"$c/kernel99.txt"
sed 's/^input.*/input tokens 8/' models/mlp.txt >"$c/tokens_mlp.txt"
printf 'input 3 32 32\nresblock b out=8 stride=2\nglobal_avgpool g\nlinear fc out=10\n' >"$c/rgb.txt"
"$out/fuzz" -max_total_time="$secs" -max_len=2048 -print_final_stats=1 -dict=<(
  for w in input tokens linear conv2d maxpool global_avgpool relu gelu gelu_erf flatten dropout batchnorm \
           layernorm resblock attention transformer_block embedding lm_head loss cross_entropy out= kernel= \
           stride= pad= bias= p= eps= momentum= heads= pos= vocab= dim= ctx= tied=; do echo "\"$w\""; done) \
    -artifact_prefix=tests/fuzz/findings-model/ "$c"
