#!/usr/bin/env bash
# The simulator's own speed (issue 14, G3): 20,000 workers x 1,000 steps in each mode,
# with noise, stalls and one slow worker, on one core.  Target: under 10 s each.
#
#   bench/simulate_speed.sh
#
# Each run: `dptrain simulate --workers 20000 --steps 1000 --compute-sd-ms 10
# --simulate-jitter p=0.01,ms=50 --simulate-slow 3:2 --mode M [...]`, timed by
# /usr/bin/time (user + sys CPU seconds, and wall), pinned to one core with taskset.
# Writes bench/results/simulate_speed-STAMP.md with lscpu's model and the table.
#   DPTRAIN=./build/dptrain  RESULTS=bench/results  WORKERS=20000  STEPS=1000
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
DPTRAIN=${DPTRAIN:-./build/dptrain}
RESULTS=${RESULTS:-bench/results}
WORKERS=${WORKERS:-20000}
STEPS=${STEPS:-1000}
[ -x "$DPTRAIN" ] || { echo "build first: make" >&2; exit 1; }
bench_facts simulate_speed
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
{
  echo "# dptrain simulate: $WORKERS workers x $STEPS steps"
  echo
  echo "CPU: $CPU_MODEL ($NCPU cores; load $LOAD1), git $GIT_REV, $STAMP"
  echo
  echo "| mode | wall s | cpu s | steps/s (simulated) | idle mean | staleness mean / p99 / max |"
  echo "|---|---|---|---|---|---|"
  for m in "sync" "backup --backup 100" "ssp --bound 4" "async --shards 4 --server-ms 0.001"; do
    # shellcheck disable=SC2086  # the mode's options split on purpose
    /usr/bin/time -f '%e %U %S' -o "$WORK/t" taskset -c 0 "$DPTRAIN" simulate --workers "$WORKERS" --steps "$STEPS" \
      --compute-sd-ms 10 --simulate-jitter p=0.01,ms=50 --simulate-slow 3:2 --mode $m --json >"$WORK/o"
    read -r el us sy <"$WORK/t"
    python3 - "$m" "$el" "$us" "$sy" "$WORK/o" <<'PY'
import json, sys
m, el, us, sy, f = sys.argv[1:]
d = json.load(open(f))
st = f"{d['stale_mean']:.4g} / {d['stale_p99']} / {d['stale_max']}" if "stale_mean" in d else "-"
print(f"| {m} | {float(el):.2f} | {float(us) + float(sy):.2f} | {d['steps_per_s']:.4g} | {d['idle_mean']:.4f} | {st} |")
PY
  done
} | tee "$OUTMD"
echo "wrote $OUTMD"
