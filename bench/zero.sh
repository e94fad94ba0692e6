#!/usr/bin/env bash
# ZeRO stages 0-3 (docs/ddp.md "ZeRO"): memory per worker and throughput.
#  1. memory: build/bench/zero_mem for each of MODELS (a wide mlp, 5.8M parameters, two large
#     layers; a deep one, 8.2M parameters in nine layers: stages 2 and 3 give memory back in
#     2 MiB units, src/ddp/zero.c, so the slabs must be large beside them) with AdamW,
#     --zero 0..3, P = 1, 2, 4: the allocator's own count of live bytes, worker 0's resident
#     model state after a step (state_step: stages 2 and 3 map their slabs and give the pages
#     back) beside the formulas 16 psi, 8 psi + 8 psi / P, 4 psi + 12 psi / P, 16 psi / P, and the
#     process's peak RSS: its model-state part per worker (rss_per_worker: less the RSS before
#     init and the data set, over P) beside formula + act (activations, loader buffers) +
#     inflight (the ranges a sharded step holds at once), rss/bound (bench/zero_mem.c);
#  2. speed: `dptrain train` samples/s (its "throughput:" line, steps after the 5th) of cnn and mlp
#     at P = 2: plain, --zero 1 (all-reduce, overlapped), --zero 1 --zero-reduce scatter, --zero 2
#     and --zero 3, REPS interleaved repetitions each (median reported).
#   bash bench/zero.sh                      # about 6 minutes
#   MODELS=mlp:784,4096,4096,10 bash bench/zero.sh   # wider still: the model state dominates the RSS
#   REPS=1 bash bench/zero.sh               # memory does not depend on load; speed does
#   REPS=5 LIMIT=12000 bash bench/zero.sh
# Writes bench/results/zero-<date>.txt (needs `make`).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
REPS=${REPS:-3}
LIMIT=${LIMIT:-6000}
MODELS=${MODELS:-mlp:784,2048,2048,10 mlp:784,1024,1024,1024,1024,1024,1024,1024,1024,10}
CFGS=("--zero 0" "--zero 1" "--zero 1 --zero-reduce scatter" "--zero 2" "--zero 3")
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
  echo "# bash bench/zero.sh (REPS=$REPS LIMIT=$LIMIT MODELS=$MODELS), git $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores (lscpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1));" \
       "load average at the start: $LOAD1"
  echo
  echo "## memory: $MEM MODEL P ZERO (AdamW); formula per worker: 16 psi (zero 0), 8 psi + 8 psi / P (1),"
  echo "## 4 psi + 12 psi / P (2), 16 psi / P (3); state_step/formula: the resident model state against it;"
  echo "## rss/bound: the peak RSS's model-state part per worker against formula + act + inflight"
  printf 'model\tP\tzero\tparams\tlive_init\tpeak\tdata\tper_worker\tper_param\tstate_step\tstate_per_param\trss_peak'
  printf '\tformula\tact\tinflight\trss_base\trss_per_worker\trss/bound\tstate_step/formula\n'
  for model in $MODELS; do
    for P in 1 2 4; do
      for z in 0 1 2 3; do
        "$MEM" "$model" "$P" "$z" "$DATA" | awk -F'\t' -v OFS='\t' '{ printf "%s\t%.3f\n", $0, $10 / $13 }' ||
          echo "FAILED: exit $?"
      done
    done
  done
  echo
  echo "## speed: $BIN train --model M --workers 2 --train-limit $LIMIT --epochs 1 --test-limit 256 (samples/s)"
  for model in cnn mlp; do
    declare -A runs=()
    for rep in $(seq "$REPS"); do
      for cfg in "${CFGS[@]}"; do
        # shellcheck disable=SC2086
        v=$("$BIN" train --model "$model" --data "$DATA" --workers 2 --train-limit "$LIMIT" --epochs 1 \
              --test-limit 256 --progress none $cfg 2>&1 | sed -n 's/^throughput: \([0-9.]*\) samples.*/\1/p')
        runs[$cfg]="${runs[$cfg]:-} ${v:-NA}"
      done
    done
    for cfg in "${CFGS[@]}"; do
      med=$(tr ' ' '\n' <<<"${runs[$cfg]}" | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
      printf '%s\t%s\tmedian %s\truns%s\n' "$model" "$cfg" "$med" "${runs[$cfg]}"
    done
    unset runs
  done
} | tee "$OUT"
echo "wrote $OUT"
