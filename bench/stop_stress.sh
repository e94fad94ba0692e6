#!/usr/bin/env bash
# Signal stops, many of them, at random steps: how often the process dies instead of stopping
# cleanly (issue 27, R2).  A signal handler run on a thread inside oneDNN's GEMM writes its
# frame over the heap (oneDNN#4845: the JIT kernel points rsp into a heap buffer), and glibc
# aborts later with "corrupted size vs. prev_size".  dptrain therefore takes SIGINT/SIGTERM on
# a thread of its own (tools/dptrain/main.c take_stop_signals).  Each binary given runs N stops
# of the deterministic 2-worker mlp run (--prefetch 0, the loader in the workers, as on a
# loaded machine), SIGINT and SIGTERM alternating, each after a random 1..60 step records; the
# binaries alternate run by run.
#   bash bench/stop_stress.sh                       # build/dptrain, N=150 (about 3 minutes)
#   N=150 bash bench/stop_stress.sh OLD/dptrain build/dptrain
# Writes bench/results/stop_stress-<date>.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
N=${N:-150}
RESULTS=${RESULTS:-bench/results}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
BINS=("$@")
[[ ${#BINS[@]} -gt 0 ]] || BINS=(build/dptrain)
for b in "${BINS[@]}"; do [[ -x $b ]] || { echo "no binary $b (make first)" >&2; exit 1; }; done
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts stop_stress
OUT=$RESULTS/stop_stress-$STAMP.txt
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RUN=(train --model mlp --epochs 3 --data "$DATA" --train-limit 3000 --test-limit 500 --batch 50 --lr 0.05
     --momentum 0.9 --progress none --deterministic --workers 2 --simulate-slow 1:5 --prefetch 0)
RANDOM=1 # the same sequence of stop points for every invocation
for i in $(seq "$N"); do
  k=$((RANDOM % 60 + 1))
  sig=$([[ $((i % 2)) == 0 ]] && echo INT || echo TERM)
  want=$([[ $sig == INT ]] && echo 130 || echo 143)
  for b in "${BINS[@]}"; do
    rm -rf "$WORK/run"
    "$b" "${RUN[@]}" --out "$WORK/run" >"$WORK/log" 2>&1 &
    pid=$!
    while (( $(cat "$WORK/run/metrics.jsonl" 2>/dev/null | grep -c '"kind": "step"') < k )) && kill -0 $pid 2>/dev/null; do
      sleep 0.01
    done
    kill -$sig $pid 2>/dev/null
    wait $pid 2>/dev/null
    rc=$?
    [[ $rc == "$want" ]] && grep -q "^stopped by SIG$sig" "$WORK/log" ||
      echo "# run $i, $b: exit $rc after $k step records ($sig): $(tail -1 "$WORK/log")"
  done
done 2>&1 | tee "$WORK/events"
{
  echo "# bash bench/stop_stress.sh ${BINS[*]} (N=$N) at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  echo "# dptrain ${RUN[*]} --out DIR, signalled after a random 1..60 step records"
  cat "$WORK/events"
  printf '%-40s %6s %12s %8s %14s\n' binary runs "clean stops" died "heap aborts"
} >"$OUT"
for b in "${BINS[@]}"; do
  d=$(grep -c ", $b: exit" "$WORK/events")
  h=$(grep ", $b: exit" "$WORK/events" | grep -c "corrupted\|double free\|free():\|malloc")
  printf '%-40s %6d %12d %8d %14d\n' "$b" "$N" $((N - d)) "$d" "$h" >>"$OUT"
done
cat "$OUT" | tail -n $((${#BINS[@]} + 1))
echo "saved: $OUT" >&2
