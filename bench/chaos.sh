#!/usr/bin/env bash
# The chaos run (issue 33, E4): dptrain launch on the emulated cluster (tests/netns/cluster.sh:
# HOSTS hosts at 1 Gbit/s, one process per host, Open MPI over TCP) while hosts are lost and come
# back.  A random host's rank is SIGKILLed every 15-30 s (the host leaves the hosts file: the
# machine is gone), and the host comes back 20 s later (launch grows the job at a step
# boundary); never below --min-nodes 2; for at least MIN_S seconds, with at least FAILS losses
# and REJOINS returns (tests/netns/chaos.sh: one action at a time, each once the job is steady).
#
# The job: cnn, deterministic, a background checkpoint every N steps, STEPS steps of 128.  It
# passes when the job finishes, its parameter hash equals the uninterrupted run's (HOSTS threads
# in one process, the same global batch), launch.jsonl holds one failure naming the lost host
# per loss and one scale-up per return, in order, no failure lost more than 2N steps, and every
# step from 1 to STEPS is recorded once (samples are keyed by global index: none skipped, none
# seen twice).  Every phase is bounded (90 s to be steady again; 900 s in all).
#
# Usage (as root, after make): bash bench/chaos.sh
# Environment: HOSTS (4), FAILS (6), REJOINS (3), MIN_S (180), STEPS (3000), N (10), SEED (1),
# DP_DATA.  Writes bench/results/chaos-<date>.txt.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
BIN=$ROOT/build/dptrain
DATA=${DP_DATA:-/usr/share/datasets/fashion-mnist}
HOSTS=${HOSTS:-4} FAILS=${FAILS:-6} REJOINS=${REJOINS:-3} MIN_S=${MIN_S:-180} STEPS=${STEPS:-3000}
N=${N:-10} SEED=${SEED:-1}
RESULTS=${RESULTS:-bench/results}
# shellcheck source=lib.sh
source bench/lib.sh
# shellcheck source=../tests/netns/cluster.sh
source tests/netns/cluster.sh
# shellcheck source=../tests/netns/chaos.sh
source tests/netns/chaos.sh
why=$(cluster_check) || { echo "chaos: cannot run an emulated cluster here: $why" >&2; exit 1; }
[[ -x $BIN ]] || { echo "chaos: no $BIN (run make)" >&2; exit 1; }
bench_facts chaos
RAW=$RESULTS/chaos-$STAMP.txt
W=$(mktemp -d /tmp/dpt-chaos.XXXXXX)
cleanup() { local p; for p in $(jobs -p); do kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; done; rm -rf "$W"; }
# shellcheck disable=SC2034  # used by cluster_trap
EXTRA_CLEANUP=cleanup
cluster_trap
# a copy of the binary: launch relaunches its own (/proc/self/exe), and a rebuild during the run
# must not change it (a half-written file killed a relaunch with SIGILL once)
cp "$BIN" "$W/dptrain" && BIN=$W/dptrain
export CLUSTER_PREFIX=dpch-$$   # (cluster_up's)
cluster_up "$HOSTS" 1gbit || { echo "chaos: cluster_up failed" >&2; exit 1; }

JOB=(--model cnn --data "$DATA" --train-limit 12800 --test-limit 256 --batch 128 --lr 0.02 --seed 1
     --epochs 1000 --max-steps "$STEPS" --deterministic --ckpt-every-steps "$N" --progress none)
{
  echo "# chaos: dptrain launch on $HOSTS emulated hosts (1 Gbit/s), a loss every 15-30 s, each lost host back 20 s later"
  echo "# $STAMP, CPU: $CPU_MODEL, $NCPU cores, load $LOAD1, git $GIT_REV"
  echo "# job: ${JOB[*]}"
  echo "# wanted: >= $FAILS losses, >= $REJOINS returns, >= $MIN_S s of losses; seed $SEED"
} | tee "$RAW"

t0=$(date +%s.%N)
timeout 900 "$BIN" train --workers "$HOSTS" "${JOB[@]}" --out "$W/straight" >"$W/straight.log" 2>&1 ||
  { echo "chaos: the uninterrupted run failed: $(tail -3 "$W/straight.log")" | tee -a "$RAW"; exit 1; }
want=$("$BIN" ckpt info "$W/straight/checkpoint.bin" | awk '/^param hash:/ {print $3}')
echo "uninterrupted ($HOSTS threads): param hash $want, $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", b - a}') s" | tee -a "$RAW"

rc=0
if chaos_run "$W/chaos" "$FAILS" "$REJOINS" "$MIN_S" "$SEED" "${JOB[@]}" && chaos_check "$W/chaos" "$want" "$N"; then
  echo "PASS: the job finished in $CHAOS_S s with the uninterrupted run's hash; $(chaos_summary "$W/chaos")" | tee -a "$RAW"
else
  echo "FAIL: $CHAOS_WHY; $(chaos_summary "$W/chaos" 2>/dev/null)" | tee -a "$RAW"
  rc=1
fi
{
  echo
  echo "## actions (seconds since the launch, action, host, job size before)"
  cat "$W/chaos.chaos"
  echo
  echo "## launch.jsonl"
  cat "$W/chaos/launch.jsonl"
  echo
  echo "## launch's lines"
  grep '^dptrain launch:' "$W/chaos.log"
} >>"$RAW"
echo "raw: $RAW"
exit $rc
