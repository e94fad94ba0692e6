#!/usr/bin/env bash
# ZeRO stage 1 (docs/ddp.md "ZeRO"): memory per worker and throughput.
#  1. memory: build/bench/zero_mem (the allocator's own count of live bytes) for mlp with AdamW,
#     --zero 0 and 1, P = 1, 2, 4, beside the formulas 16 psi and 8 psi + 8 psi / P;
#  2. speed: `dptrain train` samples/s (its "throughput:" line, steps after the 5th) of cnn and mlp
#     at P = 2: plain, --zero 1 (all-reduce, overlapped) and --zero 1 --zero-reduce scatter,
#     REPS interleaved repetitions each (median reported).
#   bash bench/zero.sh                      # about 3 minutes
#   REPS=5 LIMIT=12000 bash bench/zero.sh
# Writes bench/results/zero-<date>.txt (needs `make`).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=${REPS:-3}
LIMIT=${LIMIT:-6000}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
RESULTS=${RESULTS:-bench/results}
MEM=build/bench/zero_mem
BIN=build/dptrain
[[ -x $MEM && -x $BIN ]] || { echo "build $MEM and $BIN first (make)" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_facts zero
OUT=$RESULTS/zero-$STAMP.txt
{
  echo "# bash bench/zero.sh (REPS=$REPS LIMIT=$LIMIT), git $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores (lscpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1));" \
       "load average at the start: $LOAD1"
  echo
  echo "## memory: $MEM mlp P ZERO (AdamW); formula: 16 psi (zero 0), 8 psi + 8 psi / P (zero 1)"
  printf 'model\tP\tzero\tparams\tlive_init\tpeak\tdata\tper_worker\tper_param\tformula\tper_worker-formula\n'
  for P in 1 2 4; do
    for z in 0 1; do
      "$MEM" mlp "$P" "$z" "$DATA" | awk -F'\t' -v OFS='\t' '{
        f = ($3 == 0) ? 16 * $4 : 8 * $4 + 8 * $4 / $2; print $0, f, $8 - f }' || echo "FAILED: exit $?"
    done
  done
  echo
  echo "## speed: $BIN train --model M --workers 2 --train-limit $LIMIT --epochs 1 --test-limit 256 (samples/s)"
  for model in cnn mlp; do
    declare -A runs=()
    for rep in $(seq "$REPS"); do
      for cfg in "--zero 0" "--zero 1" "--zero 1 --zero-reduce scatter"; do
        # shellcheck disable=SC2086
        v=$("$BIN" train --model "$model" --data "$DATA" --workers 2 --train-limit "$LIMIT" --epochs 1 \
              --test-limit 256 --progress none $cfg 2>&1 | sed -n 's/^throughput: \([0-9.]*\) samples.*/\1/p')
        runs[$cfg]="${runs[$cfg]:-} ${v:-NA}"
      done
    done
    for cfg in "--zero 0" "--zero 1" "--zero 1 --zero-reduce scatter"; do
      med=$(tr ' ' '\n' <<<"${runs[$cfg]}" | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
      printf '%s\t%s\tmedian %s\truns%s\n' "$model" "$cfg" "$med" "${runs[$cfg]}"
    done
    unset runs
  done
} | tee "$OUT"
echo "wrote $OUT"
