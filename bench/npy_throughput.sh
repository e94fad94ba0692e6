#!/usr/bin/env bash
# What reading batches from a memory-mapped .npy costs against the in-memory IDX path (issue
# 29's throughput target: at most 5% on Fashion-MNIST, cnn, 2 workers).  Fashion-MNIST's
# training set is converted to .npy (uint8 pixels, and float32 already scaled as the IDX path
# scales them), then each model trains from the IDX folder and from each array in turn, REPS
# rounds interleaved; samples/s are dptrain's own steady-state figure, medians per source.
#   bash bench/npy_throughput.sh                       # about 5 minutes (REPS=9: 8)
#   MODELS="cnn" REPS=5 LIMIT=20000 bash bench/npy_throughput.sh
# Writes bench/results/npy_throughput-<date>.txt (needs `make`, numpy).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=${REPS:-5}
MODELS=${MODELS:-cnn mlp}
LIMIT=${LIMIT:-20000}
WORKERS=${WORKERS:-2}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
RESULTS=${RESULTS:-bench/results}
DPTRAIN=${DPTRAIN:-./build/dptrain}
WORK=$(mktemp -d /tmp/dptrain-npytp.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
[[ -x $DPTRAIN ]] || { echo "build $DPTRAIN first (make)" >&2; exit 1; }
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts npy_throughput
OUT=$RESULTS/npy_throughput-$STAMP.txt
/usr/bin/python3 - "$DATA" "$WORK" <<'PY'
import gzip, sys, numpy as np
d, w = sys.argv[1:]
x = np.frombuffer(gzip.open(f"{d}/train-images-idx3-ubyte.gz").read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
y = np.frombuffer(gzip.open(f"{d}/train-labels-idx1-ubyte.gz").read(), np.uint8, offset=8).astype(np.int64)
np.save(f"{w}/x_u8.npy", x); np.save(f"{w}/x_f32.npy", x.astype(np.float32) / 255); np.save(f"{w}/y.npy", y)
PY
# the same normalisation everywhere: Fashion-MNIST's mean and std, in each source's units
declare -A SRC=(
  [idx]="--data $DATA"
  [npy_u8]="--data $WORK/x_u8.npy --labels $WORK/y.npy --normalize 72.93,90.015"
  [npy_f32]="--data $WORK/x_f32.npy --labels $WORK/y.npy --normalize 0.2860,0.3530"
)
{
  echo "# bash bench/npy_throughput.sh (REPS=$REPS MODELS='$MODELS' LIMIT=$LIMIT WORKERS=$WORKERS) at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  echo "# $DPTRAIN train SOURCE --model M --epochs 1 --train-limit $LIMIT --test-limit 1000 --batch 128 --workers $WORKERS"
  echo "# samples/s: dptrain's throughput line (training steps after the 5th); median of $REPS, sources interleaved"
  printf "%-6s %-8s %10s %10s %9s  %s\n" model source median ratio "data %" "all runs (samples/s)"
  for m in $MODELS; do
    declare -A runs=() data=()
    for ((r = 0; r < REPS; r++)); do
      for s in idx npy_u8 npy_f32; do
        # shellcheck disable=SC2086
        "$DPTRAIN" train ${SRC[$s]} --model "$m" --epochs 1 --train-limit "$LIMIT" --test-limit 1000 --batch 128 \
          --workers "$WORKERS" --progress none >"$WORK/run.log" 2>&1 || { cat "$WORK/run.log"; exit 1; }
        runs[$s]+="$(dptrain_sps "$WORK/run.log") "
        # worker 0's data phase (assembling its batches: reading, converting, normalising) as a
        # share of its epoch: the loading cost itself, apart from the step's noise
        data[$s]+="$(sed -n 's/^epoch .* \([0-9.]*\)s (data \([0-9.]*\) .*/\2 \1/p' "$WORK/run.log" | awk '{printf "%.4f", 100 * $1 / $2}') "
      done
    done
    base=$(tr ' ' '\n' <<<"${runs[idx]}" | sed '/^$/d' | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
    for s in idx npy_u8 npy_f32; do
      med=$(tr ' ' '\n' <<<"${runs[$s]}" | sed '/^$/d' | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
      dmed=$(tr ' ' '\n' <<<"${data[$s]}" | sed '/^$/d' | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
      printf "%-6s %-8s %10.1f %10.3f %8.2f%%  %s\n" "$m" "$s" "$med" "$(awk -v a="$med" -v b="$base" 'BEGIN {print a / b}')" \
        "$dmed" "${runs[$s]}"
    done
    unset runs data
  done
  echo "# ratio: the source's median over the IDX path's (1 = no cost; the target is >= 0.95); data %: the"
  echo "# median share of worker 0's epoch spent assembling its batches (with 2 workers on 2 cores there is"
  echo "# no loader thread: each worker reads, converts and normalises its own share), the loading cost itself"
} 2>&1 | tee "$OUT"
