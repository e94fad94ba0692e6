#!/usr/bin/env bash
# Each convolution of cnn and resnet against oneDNN's convolution primitives (bench/conv_layers.c):
#   bash bench/conv_layers.sh            (REPS=7; about 2 minutes)
# Writes bench/results/conv_layers-<date>.txt, the CPU model and load at its head.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck disable=SC2034 # (lib.sh reads $ROOT)
ROOT=$PWD
RESULTS=${RESULTS:-bench/results}
REPS=${REPS:-7}
BIN=${BIN:-build/bench/conv_layers}
die() { echo "conv_layers: $*" >&2; exit 1; }
[ -x "$BIN" ] || die "$BIN not found: build it first (make)"
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts conv_layers
OUT=$RESULTS/conv_layers-$STAMP.txt
{
  echo "# bash bench/conv_layers.sh (REPS=$REPS) at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  OMP_NUM_THREADS=1 "$BIN" "$REPS"
} | tee "$OUT"
rc=${PIPESTATUS[0]}
echo "wrote $OUT" >&2
exit "$rc"
