#!/usr/bin/env bash
# A BPE vocabulary against byte-level tokens on the fortunes corpus (issue 29, N5's target): a
# gpt over a 4,096-token BPE (prepare-text --vocab 4096) and a byte-level gpt of about the same
# parameter count, trained on the same number of tokens (same steps, batch and window), compared
# by validation loss in bits per byte of text (dp_trainer_bits_per_byte), which does not depend
# on the vocabulary.  Both validate on the corpus's last 5% of tokens (for the BPE about the last
# 5% of the bytes, which the BPE did not learn on).
#   bash bench/bpe_vs_bytes.sh                  # STEPS=1000: about 5 minutes
#   STEPS=2000 WORKERS=2 bash bench/bpe_vs_bytes.sh
# Writes bench/results/bpe_vs_bytes-<date>.txt (needs `make`, the fortunes packages).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STEPS=${STEPS:-1000}
WORKERS=${WORKERS:-2}
VOCAB=${VOCAB:-4096}
BPE_MODEL=${BPE_MODEL:-gpt:layers=4,heads=4,dim=128,ctx=64,vocab=$VOCAB}
BYTE_MODEL=${BYTE_MODEL:-gpt:layers=6,heads=4,dim=132,ctx=64}
RESULTS=${RESULTS:-bench/results}
DPTRAIN=${DPTRAIN:-./build/dptrain}
WORK=$(mktemp -d /tmp/dptrain-bpe.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
[[ -x $DPTRAIN ]] || { echo "build $DPTRAIN first (make)" >&2; exit 1; }
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts bpe_vs_bytes
OUT=$RESULTS/bpe_vs_bytes-$STAMP.txt
RUN=(--batch 32 --optim adamw --lr 1e-3 --max-steps "$STEPS" --epochs 1000 --workers "$WORKERS" --progress none
     --seed 1)
{
  echo "# bash bench/bpe_vs_bytes.sh (STEPS=$STEPS WORKERS=$WORKERS VOCAB=$VOCAB) at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  "$DPTRAIN" prepare-text --out "$WORK/bytes.bin" || exit 1
  "$DPTRAIN" prepare-text --vocab "$VOCAB" --out "$WORK/bpe.bin" || exit 1
  echo "# both: ${RUN[*]} (global batch 32 windows of 64 tokens: $((STEPS * 32 * 64)) training tokens each)"
  printf "%-8s %-45s %11s %9s %9s %8s\n" tokens model parameters "val loss" "val bpb" seconds
  for side in bytes bpe; do
    m=$BYTE_MODEL; [[ $side == bpe ]] && m=$BPE_MODEL
    t0=$(date +%s.%N)
    "$DPTRAIN" train --model "$m" --data "$WORK/$side.bin" "${RUN[@]}" >"$WORK/$side.log" 2>&1 ||
      { cat "$WORK/$side.log"; exit 1; }
    dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    params=$(sed -n 's/^dptrain: model [^ ]* (\([0-9]*\) parameters.*/\1/p' "$WORK/$side.log")
    line=$(grep '^eval step\|^epoch' "$WORK/$side.log" | tail -1)
    loss=$(sed -n 's/.*val loss \([0-9.]*\).*/\1/p' <<<"$line")
    bpb=$(sed -n 's/.*val bpb \([0-9.]*\).*/\1/p' <<<"$line")
    printf "%-8s %-45s %11s %9s %9s %8s\n" "$side" "$m" "$params" "$loss" "$bpb" "$dt"
    eval "bpb_$side=$bpb"
  done
  # shellcheck disable=SC2154
  awk -v a="$bpb_bpe" -v b="$bpb_bytes" 'BEGIN {
    printf "BPE %s bits/byte against bytes %s: %s (%.1f%% %s)\n", a, b, a < b ? "lower: target met" : "NOT lower: target not met",
           100 * (a > b ? a / b - 1 : 1 - a / b), a < b ? "less" : "more" }'
} 2>&1 | tee "$OUT"
