#!/usr/bin/env bash
# The cores' own speeds: the bound a step barrier with equal shares puts on P=2 (issue 9).
#
#   bench/cores.sh                               # REPS=4, mlp cnn resnet
#   REPS=2 MODELS=mlp bench/cores.sh
#
# For each model, REPS repetitions of the same single-worker job (batch 64, one thread,
# --prefetch 0, the scaling recipe), pinned with `taskset -c` to each core in turn and run
# there ALONE (the other core idle), the cores alternating and the first one rotating from
# a repetition to the next.  Alone, nothing the two jobs share (caches, memory bandwidth,
# our own threads) can make one core slower: what differs is the core itself (on a VM, the
# host's core behind the vCPU and who else runs on it).
#
# Per model: samples/s per core (median), slower / faster, and the equal-shares bound
#   bound = 2 x min(s0, s1) / (s0 + s1)
# the most dp2 (equal shares, one barrier a step) can reach of ind2 (two independent
# processes, each at its own core's speed) on these cores, with no communication at all and
# no step-to-step jitter.  Only unequal shares (--balance) can go above it.
# bench/scaling.sh's `ind2sync / ind2` measures the same thing with both processes running at
# once (so it also pays their contention); this script isolates the cores.
#
# Environment knobs:
#   REPS=4  MODELS="mlp cnn resnet"  STEPS_MLP=1000  STEPS_CNN=150  STEPS_RESNET=30  SEED=1
#   CORES="0 1" (two of the CPUs this script may use; default the first two)
#   DPTRAIN=./build/dptrain  PY=python3  RESULTS=bench/results
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/lib.sh
. bench/lib.sh

die() { echo "cores: $*" >&2; exit 1; }
note() { echo "cores: $*" >&2; }

REPS=${REPS:-4}
MODELS=${MODELS:-"mlp cnn resnet"}
STEPS_MLP=${STEPS_MLP:-1000}
STEPS_CNN=${STEPS_CNN:-150}
STEPS_RESNET=${STEPS_RESNET:-30}
SEED=${SEED:-1}
DPTRAIN=${DPTRAIN:-./build/dptrain}
PY=${PY:-python3}
RESULTS=${RESULTS:-bench/results}

[ -x "$DPTRAIN" ] || die "$DPTRAIN not found: build it first (make)"
command -v taskset >/dev/null || die "taskset not found (Debian package util-linux)"
[[ $REPS =~ ^[1-9][0-9]*$ ]] || die "REPS must be a positive integer, not '$REPS'"
if [ -z "${CORES:-}" ]; then
    CORES=$("$PY" -c 'import os; print(" ".join(str(c) for c in sorted(os.sched_getaffinity(0))[:2]))')
fi
read -r -a CORE <<<"$CORES"
[ "${#CORE[@]}" -eq 2 ] || die "need two CPUs to compare, have '$CORES'"

steps_of() {
    case $1 in mlp) echo "$STEPS_MLP" ;; cnn) echo "$STEPS_CNN" ;; resnet) echo "$STEPS_RESNET" ;;
    *) die "unknown model $1 (mlp cnn resnet)" ;; esac
}
for model in $MODELS; do steps_of "$model" >/dev/null; done
[ -n "${MODELS// /}" ] || die "no models to run"

bench_facts cores
LOAD_START=$LOAD1
RAW=$RESULTS/cores-$STAMP.tsv   # model rep core samples_per_s
: >"$RAW"

# One run of MODEL pinned to CORE, alone; its samples/s after the 5th step into $RAW.
run_on() {
    local model=$1 rep=$2 core=$3 out sps
    out=$(taskset -c "$core" "$DPTRAIN" train --model "$model" --workers 1 --threads 1 --batch 64 \
          --prefetch 0 --lr 0.05 --momentum 0.9 --seed "$SEED" --epochs 1 \
          --max-steps "$(steps_of "$model")" --progress none 2>&1) || die "$model on core $core failed: $(tail -n 2 <<<"$out")"
    sps=$(dptrain_sps /dev/stdin <<<"$out")
    [ -n "$sps" ] || die "$model on core $core printed no throughput"
    printf '%s\t%s\t%s\t%s\n' "$model" "$rep" "$core" "$sps" >>"$RAW"
    note "$model rep $rep core $core: $sps samples/s"
}

for rep in $(seq 1 "$REPS"); do
    for model in $MODELS; do
        if [ $((rep % 2)) -eq 1 ]; then order=("${CORE[0]}" "${CORE[1]}"); else order=("${CORE[1]}" "${CORE[0]}"); fi
        for core in "${order[@]}"; do run_on "$model" "$rep" "$core"; done
    done
done

RAW=$RAW CORE0=${CORE[0]} CORE1=${CORE[1]} STAMP=$STAMP CPU_MODEL=$CPU_MODEL NCPU=$NCPU \
LOAD0=$LOAD_START LOAD1=$(cut -d' ' -f1-3 /proc/loadavg) GIT_REV=$GIT_REV REPS=$REPS \
"$PY" - >"$OUTMD" <<'PYEOF'
import os, statistics
E = os.environ
rows = [l.rstrip("\n").split("\t") for l in open(E["RAW"]) if l.strip()]
c0, c1 = E["CORE0"], E["CORE1"]
models, by = [], {}
for model, rep, core, sps in rows:
    if model not in models:
        models.append(model)
    by.setdefault((model, core), []).append(float(sps))
print(f"# The cores' own speeds {E['STAMP']}")
print()
print(f"- machine: {E['CPU_MODEL']}, {E['NCPU']} CPUs; load average at start {E['LOAD0']}, at end {E['LOAD1']}; git `{E['GIT_REV']}`")
print(f"- one single-worker job (batch 64, 1 thread, --prefetch 0) pinned to core {c0} or {c1}, alone, "
      f"{E['REPS']} repetition(s) per core, the cores alternating; samples/s after the 5th step, medians [min..max]")
print("- bound = 2 x slower / (faster + slower): the most equal shares with a step barrier can reach "
      "of two independent processes on these cores (dp2 / ind2), before any communication or jitter")
print(f"- raw rows: {os.path.basename(E['RAW'])}")
print()
print(f"| model | core {c0} samples/s | core {c1} samples/s | slower / faster | equal-shares bound |")
print("|---|---:|---:|---:|---:|")
for m in models:
    a, b = by.get((m, c0), []), by.get((m, c1), [])
    if not a or not b:
        print(f"| {m} | n/a | n/a | n/a | n/a |")
        continue
    ma, mb = statistics.median(a), statistics.median(b)
    lo, hi = min(ma, mb), max(ma, mb)
    rng = lambda xs: f"{statistics.median(xs):.0f} [{min(xs):.0f}..{max(xs):.0f}]"
    print(f"| {m} | {rng(a)} | {rng(b)} | {lo / hi:.3f} | {2 * lo / (lo + hi):.3f} |")
PYEOF
cat "$OUTMD"
note "report written to $OUTMD (raw rows in $RAW)"
