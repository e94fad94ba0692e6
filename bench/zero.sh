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
#     inflight (the ranges a sharded step holds at once), rss/bound (bench/zero_mem.c); lib: what
#     the GEMM library keeps per process once used (in the RSS before init: a warm-up GEMM first),
#     grad_hw: the most gradient a worker held unreduced during backward;
#  2. speed: `dptrain train` samples/s (its "throughput:" line, steps after the 5th) of cnn and mlp
#     at P = 2: plain, --zero 1 (all-reduce, overlapped; on threads the all-gather within the
#     step), --zero 1 --zero-reduce scatter, --zero 2, --zero 3 and --zero 1 --zero-gather ahead
#     (the all-gather left in flight for the next forward), REPS interleaved repetitions each
#     (median reported).
#  3. steps: build/bench/zero_steps on STEPS_MODELS at P = 2, --zero 0..3: ms, minor page faults
#     and kernel (sys) ms per step over STEPS steps (a 2 MiB unit given back and touched again is
#     one fault), REPS interleaved repetitions each (median reported).
#  4. hosts (only when PARTS names it; root, Open MPI, iproute2): the same speed on 2 emulated
#     hosts (tests/netns/cluster.sh: a network namespace and its own core each, links shaped to
#     HOST_RATE, 1gbit), one process per host, batch 128, HOST_STEPS (49) steps: plain, --zero 1
#     --zero-gather step, --zero 1 --zero-gather ahead (auto's choice across processes), and both
#     with --zero-reduce scatter (step: the slab reduce-scattered after backward; ahead: each
#     bucket during backward); REPS interleaved repetitions each (median reported).
#   bash bench/zero.sh                      # about 6 minutes
#   MODELS=mlp:784,4096,4096,10 bash bench/zero.sh   # wider still: the model state dominates the RSS
#   REPS=1 bash bench/zero.sh               # memory does not depend on load; speed does
#   REPS=5 LIMIT=12000 bash bench/zero.sh
#   PARTS="speed hosts" REPS=5 bash bench/zero.sh   # --zero-gather ahead against step, threads and hosts
#   PARTS="speed steps" SPEED_MODELS=mlp REPS=5 BASE=/tmp/zmain bash bench/zero.sh
#     only the speed and per-step parts, on mlp, each configuration also run with another tree's
#     build (BASE/build/dptrain and BASE/build/bench/zero_steps: e.g. main's, from `git archive main |
#     tar -x -C /tmp/zmain; git rev-parse main >/tmp/zmain/.git-rev; cp bench/zero_steps.c /tmp/zmain/bench;
#     make -C /tmp/zmain build/dptrain build/bench/zero_steps`) interleaved with this one's, rows marked "base"
# Writes bench/results/zero-<date>.txt (needs `make`).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
REPS=${REPS:-3}
LIMIT=${LIMIT:-6000}
MODELS=${MODELS:-mlp:784,2048,2048,10 mlp:784,1024,1024,1024,1024,1024,1024,1024,1024,10}
PARTS=${PARTS:-mem speed steps}
SPEED_MODELS=${SPEED_MODELS:-cnn mlp}
STEPS_MODELS=${STEPS_MODELS:-mlp}
STEPS=${STEPS:-200}
BASE=${BASE:-}
CFGS=("--zero 0" "--zero 1" "--zero 1 --zero-reduce scatter" "--zero 2" "--zero 3" "--zero 1 --zero-gather ahead")
HOST_CFGS=("--zero 0" "--zero 1 --zero-gather step" "--zero 1 --zero-gather ahead"
  "--zero 1 --zero-reduce scatter --zero-gather step" "--zero 1 --zero-reduce scatter --zero-gather ahead")
HOST_RATE=${HOST_RATE:-1gbit}
HOST_STEPS=${HOST_STEPS:-49}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
RESULTS=${RESULTS:-bench/results}
MEM=build/bench/zero_mem
BIN=build/dptrain
STEPBIN=build/bench/zero_steps
[[ -x $MEM && -x $BIN && -x $STEPBIN ]] || { echo "build $MEM, $BIN and $STEPBIN first (make)" >&2; exit 1; }
TREES=(this)
if [[ -n $BASE ]]; then
  [[ -x $BASE/build/dptrain && -x $BASE/build/bench/zero_steps ]] ||
    { echo "BASE=$BASE: build $BASE/build/dptrain and $BASE/build/bench/zero_steps first" >&2; exit 1; }
  TREES=(this base)
fi
bin_of() { if [[ $1 == base ]]; then echo "$BASE/build/$2"; else echo "build/$2"; fi; }
median() { tr ' ' '\n' | grep -v '^$' | grep -v NA | sort -g | awk '{a[NR] = $1} END {print NR ? a[int((NR + 1) / 2)] : "NA"}'; }
has() { [[ " $PARTS " == *" $1 "* ]]; }
# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_facts zero
OUT=$RESULTS/zero-$STAMP.txt
{
  echo "# bash bench/zero.sh (PARTS=$PARTS REPS=$REPS LIMIT=$LIMIT MODELS=$MODELS SPEED_MODELS=$SPEED_MODELS" \
       "STEPS_MODELS=$STEPS_MODELS STEPS=$STEPS BASE=${BASE:-none}), git $GIT_REV"
  [[ -n $BASE ]] && echo "# base: $BASE, git $(cat "$BASE/.git-rev" 2>/dev/null || echo unknown)"
  echo "# CPU: $CPU_MODEL, $NCPU cores (lscpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1));" \
       "load average at the start: $LOAD1"
  if has mem; then
  echo
  echo "## memory: $MEM MODEL P ZERO (AdamW); formula per worker: 16 psi (zero 0), 8 psi + 8 psi / P (1),"
  echo "## 4 psi + 12 psi / P (2), 16 psi / P (3); state_step/formula: the resident model state against it;"
  echo "## rss/bound: the peak RSS's model-state part per worker against formula + act + inflight"
  printf 'model\tP\tzero\tparams\tlive_init\tpeak\tdata\tper_worker\tper_param\tstate_step\tstate_per_param\trss_peak'
  printf '\tformula\tact\tinflight\trss_base\trss_per_worker\trss/bound\tlib\tgrad_hw\tstate_step/formula\n'
  for model in $MODELS; do
    for P in 1 2 4; do
      for z in 0 1 2 3; do
        "$MEM" "$model" "$P" "$z" "$DATA" | awk -F'\t' -v OFS='\t' '{ printf "%s\t%.3f\n", $0, $10 / $13 }' ||
          echo "FAILED: exit $?"
      done
    done
  done
  fi
  if has speed; then
  echo
  echo "## speed: $BIN train --model M --workers 2 --train-limit $LIMIT --epochs 1 --test-limit 256 (samples/s)"
  for model in $SPEED_MODELS; do
    declare -A runs=()
    for rep in $(seq "$REPS"); do
      for cfg in "${CFGS[@]}"; do
        for tree in "${TREES[@]}"; do
          # shellcheck disable=SC2086
          v=$("$(bin_of "$tree" dptrain)" train --model "$model" --data "$DATA" --workers 2 --train-limit "$LIMIT" \
                --epochs 1 --test-limit 256 --progress none $cfg 2>&1 |
                sed -n 's/^throughput: \([0-9.]*\) samples.*/\1/p')
          runs[$tree $cfg]="${runs[$tree $cfg]:-} ${v:-NA}"
        done
      done
    done
    for cfg in "${CFGS[@]}"; do
      for tree in "${TREES[@]}"; do
        printf '%s\t%s\t%s\tmedian %s\truns%s\n' "$model" "$tree" "$cfg" "$(median <<<"${runs[$tree $cfg]}")" \
          "${runs[$tree $cfg]}"
      done
    done
    unset runs
  done
  fi
  if has hosts; then
  echo
  echo "## hosts: mpirun -np 2 (2 emulated hosts, links $HOST_RATE) $BIN train --backend mpi --workers 1 --threads 1"
  echo "## --model M --batch 128 --max-steps $HOST_STEPS (samples/s)"
  # shellcheck source=tests/netns/cluster.sh
  source tests/netns/cluster.sh
  if ! why=$(cluster_check); then
    echo "hosts: not run: $why"
  else
    # shellcheck disable=SC2034  # cluster_up reads it
    CLUSTER_PREFIX=dpz-$$
    cluster_trap
    cluster_up 2 "$HOST_RATE" >/dev/null || echo "hosts: cluster_up failed"
    echo "## cores: $(awk '{printf "%s%s: %s", (NR > 1 ? "; " : ""), $1, $2}' "$CLUSTER_STATE/cpus")"
    for model in $SPEED_MODELS; do
      declare -A runs=()
      for _ in $(seq "$REPS"); do
        for cfg in "${HOST_CFGS[@]}"; do
          # shellcheck disable=SC2086
          v=$(cluster_run -np 2 -x OMP_NUM_THREADS=1 "$ROOT/$BIN" train --backend mpi --workers 1 --threads 1 \
                --model "$model" --data "$DATA" --batch 128 --train-limit $((128 * (HOST_STEPS + 1))) \
                --max-steps "$HOST_STEPS" --test-limit 256 --progress none $cfg 2>&1 |
                sed -n 's/^throughput: \([0-9.]*\) samples.*/\1/p')
          runs[$cfg]="${runs[$cfg]:-} ${v:-NA}"
        done
      done
      for cfg in "${HOST_CFGS[@]}"; do
        printf '%s\thosts\t%s\tmedian %s\truns%s\n' "$model" "$cfg" "$(median <<<"${runs[$cfg]}")" "${runs[$cfg]}"
      done
      unset runs
    done
    cluster_down
  fi
  fi
  if has steps; then
  echo
  echo "## steps: $STEPBIN MODEL 2 ZERO $STEPS (AdamW, batch 128): per step over $STEPS steps after 10,"
  echo "## medians of $REPS interleaved runs: ms, minor page faults (process), kernel ms (process)"
  printf 'model\ttree\tzero\tms_step\tminflt_step\tsys_ms_step\truns (ms minflt sys)\n'
  for model in $STEPS_MODELS; do
    declare -A ms=() fl=() sy=()
    for _ in $(seq "$REPS"); do
      for z in 0 1 2 3; do
        for tree in "${TREES[@]}"; do
          read -r _ _ _ _ a b c _ < <("$(bin_of "$tree" bench/zero_steps)" "$model" 2 "$z" "$STEPS" "$DATA" ||
                                     echo "x x x x NA NA NA")
          ms[$tree $z]="${ms[$tree $z]:-} $a" fl[$tree $z]="${fl[$tree $z]:-} $b" sy[$tree $z]="${sy[$tree $z]:-} $c"
        done
      done
    done
    for z in 0 1 2 3; do
      for tree in "${TREES[@]}"; do
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s |%s |%s\n' "$model" "$tree" "$z" "$(median <<<"${ms[$tree $z]}")" \
          "$(median <<<"${fl[$tree $z]}")" "$(median <<<"${sy[$tree $z]}")" "${ms[$tree $z]}" "${fl[$tree $z]}" \
          "${sy[$tree $z]}"
      done
    done
    unset ms fl sy
  done
  fi
} | tee "$OUT"
echo "wrote $OUT"
