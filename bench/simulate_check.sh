#!/usr/bin/env bash
# dptrain simulate against measured straggler runs, in one run (issue 14, G3): fit the
# simulator's two inputs from two measured cases, predict three others, compare.
#
#   bench/simulate_check.sh                              # REPS=3, STEPS=100: about 2 min quiet
#   REPS=1 STEPS=30 WARMUP=10 RESULTS=/tmp/sc bench/simulate_check.sh   # a quick validation
#
# cnn, 2 workers x 1 thread, global batch 128, SGD lr 0.05 momentum 0.9, seed SEED, one epoch
# cut off by --max-steps STEPS.  Measured cases, interleaved within a repetition (the order
# rotates from one repetition to the next):
#
#   alone    --workers 1 --batch 64: one worker's step alone   -> compute c = 64 / its samples/s
#   sync0    --workers 2, no slowness                          -> comm a = 128 / its samples/s - c
#   sync     --workers 2 --simulate-slow 1:SLOW                   (predicted)
#   async    --workers 2 --simulate-slow 1:SLOW --mode async      (predicted; async stops only at
#            epoch ends, so its run is one epoch of --train-limit STEPS x 128 samples, as in
#            bench/stragglers.sh; its step records are rank 0's pushes, each carrying every
#            worker's samples since the one before: sum of samples / sum of step_s is global)
#   backup   --workers 2 --backup-workers 1 --simulate-jitter JITTER  (predicted; 2 workers on
#            2 cores, so a stalled worker's core is not lent to the other, as the simulator
#            assumes; b = 1 is valid from P = 2 on)
#
# Throughput: samples/s over the step records of metrics.jsonl after the WARMUP-th (sum of
# samples / sum of step_s), medians over the REPS repetitions.  The inputs c and a come from
# the medians of alone and sync0 only; then `dptrain simulate` (deterministic) predicts:
#   sync    --mode sync --workers 2 --batch 64 --compute-ms c --comm-ms a --simulate-slow 1:SLOW
#   async   --mode async ... --compute-ms c --simulate-slow 1:SLOW (no --comm-ms: the push and
#           pull are memory copies on one host, and c already holds an optimizer step like the
#           server's; no --server-ms)
#   backup  --mode backup --backup 1 ... --compute-ms c --comm-ms a --simulate-jitter JITTER
#           --seed SEED, twice: over the measured window with the trainer's own stall draws
#           (simulate's step k is the trainer's step record k+1, so steps WARMUP+1..STEPS are
#           T(STEPS) - T(WARMUP) of two simulations), and over SIM_STEPS steps (the long run).
#           A backup step's record counts the global batch (128, dropped samples included);
#           simulate's samples/s counts the accepted P - b, so both sides are steps/s x 128.
# sync and async: SIM_STEPS steps (no randomness, the window does not matter).
# Error = (predicted - measured) / measured.
#
# Writes $RESULTS/simulate_check-STAMP.md (facts, inputs, simulate commands, table) and
# .tsv (one row per measured run).  Knobs:
#   REPS=3  STEPS=100  WARMUP=20  SLOW=2  JITTER=p=0.05,ms=50  SEED=1  SIM_STEPS=1000
#   DPTRAIN=./build/dptrain  PY=/usr/bin/python3  RESULTS=bench/results
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

REPS=${REPS:-3}
STEPS=${STEPS:-100}
WARMUP=${WARMUP:-20}
SLOW=${SLOW:-2}
JITTER=${JITTER:-p=0.05,ms=50}
SEED=${SEED:-1}
SIM_STEPS=${SIM_STEPS:-1000}
DPTRAIN=${DPTRAIN:-./build/dptrain}
PY=${PY:-/usr/bin/python3}
RESULTS=${RESULTS:-bench/results}

die() { echo "simulate_check: error: $*" >&2; exit 1; }
note() { echo "simulate_check: $*" >&2; }

# ---- preconditions ----------------------------------------------------------------
[ -x "$DPTRAIN" ] || die "$DPTRAIN not found or not executable: build it first (make) or set DPTRAIN=PATH"
HELP=$("$DPTRAIN" train --help 2>&1 || true) # (grep -q on a pipe would SIGPIPE it under pipefail)
for f in --backup-workers --simulate-jitter --simulate-slow --mode; do
    grep -q -- "$f" <<<"$HELP" || die "'$DPTRAIN train --help' does not list $f: is the binary current?"
done
SHELP=$("$DPTRAIN" simulate --help 2>&1 || true)
grep -q -- '--simulate-jitter' <<<"$SHELP" || die "'$DPTRAIN simulate --help' does not list --simulate-jitter"
command -v "$PY" >/dev/null || die "$PY not found (set PY=)"
[ "$STEPS" -gt "$WARMUP" ] 2>/dev/null || die "STEPS ($STEPS) must be an integer above WARMUP ($WARMUP)"
[ "$REPS" -ge 1 ] 2>/dev/null || die "REPS ($REPS) must be an integer >= 1"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/simulate_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
RAW=$WORK/raw.tsv # case rep samples_per_s steps_measured
: >"$RAW"

PIN=(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1)
CASES=(alone sync0 sync async backup)

# The command line of one case, into CMD.
build_cmd() {
    CMD=(env "${PIN[@]}" "$DPTRAIN" train --model cnn --threads 1 --lr 0.05 --momentum 0.9
         --seed "$SEED" --progress none --epochs 1)
    case $1 in
    alone) CMD+=(--workers 1 --batch 64) ;;
    sync0) CMD+=(--workers 2 --batch 128) ;;
    sync) CMD+=(--workers 2 --batch 128 --simulate-slow "1:$SLOW") ;;
    async) CMD+=(--workers 2 --batch 128 --simulate-slow "1:$SLOW" --mode async) ;;
    backup) CMD+=(--workers 2 --batch 128 --backup-workers 1 --simulate-jitter "$JITTER") ;;
    esac
    # async stops at epoch ends only: one epoch of STEPS global batches instead of --max-steps
    if [ "$1" = async ]; then CMD+=(--train-limit $((STEPS * 128))); else CMD+=(--max-steps "$STEPS"); fi
}

run_one() {
    local c=$1 rep=$2
    local dir=$WORK/$c-r$rep log=$WORK/$c-r$rep.log rc=0 sps=NA k=0
    build_cmd "$c"
    "${CMD[@]}" --out "$dir" >"$log" 2>&1 || rc=$?
    [ -f "$dir/metrics.jsonl" ] && read -r sps k <<<"$(step_throughput "$dir/metrics.jsonl")"
    if [ "$rc" != 0 ] || [ "$sps" = NA ]; then
        note "$c rep=$rep: no throughput (exit $rc); last lines of its output:"
        tail -n 5 "$log" | sed 's/^/    /' >&2
        sps=NA
    fi
    rm -rf "$dir" # (the checkpoint: nothing else is read)
    printf '%s\t%s\t%s\t%s\n' "$c" "$rep" "$sps" "$k" >>"$RAW"
    printf '  %-7s rep %s: %s samples/s (%s steps after the %sth)\n' "$c" "$rep" "$sps" "$k" "$WARMUP" >&2
}

# ---- measure ----------------------------------------------------------------------
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T_START=$(date +%s)
note "cases: ${CASES[*]}; $REPS repetition(s); cnn, $STEPS steps, warm-up $WARMUP; slow 1:$SLOW; jitter $JITTER"
bench_interleaved "$REPS" "${CASES[@]}"

# ---- fit, simulate, report ---------------------------------------------------------
bench_facts simulate_check
export RAW REPS STEPS WARMUP SLOW JITTER SEED SIM_STEPS LOAD0 LOAD1 T_START CPU_MODEL NCPU GIT_REV DPTRAIN
"$PY" - >"$OUTMD" <<'EOF'
import json, os, statistics, subprocess, sys, time

E = os.environ
data = {}  # case -> [samples/s]
for line in open(E["RAW"]):
    c, rep, sps, k = line.rstrip("\n").split("\t")
    if sps != "NA":
        data.setdefault(c, []).append(float(sps))

def med(c):
    return statistics.median(data[c]) if data.get(c) else None

def spread(c):
    xs = data.get(c)
    return f"{statistics.median(xs):.0f} [{min(xs):.0f}..{max(xs):.0f}]" if xs else "n/a"

out = []
p = out.append
p("# dptrain simulate against measured straggler runs (cnn, 2 workers): inputs fitted, predictions out of sample")
p("")
p(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, wall {time.time() - int(E['T_START']):.0f}s; "
  f"dptrain `{E['DPTRAIN']}` at git `{E['GIT_REV']}`")
p(f"- machine: {E['CPU_MODEL']}, {E['NCPU']} CPUs; load average at start {E['LOAD0']}, at end {E['LOAD1']}")
p(f"- recipe: cnn, global batch 128, SGD lr 0.05 momentum 0.9, seed {E['SEED']}, 1 thread per worker, "
  f"{E['STEPS']} steps (async: one epoch of {E['STEPS']} x 128 samples); samples/s over the steps after the "
  f"{E['WARMUP']}th (metrics.jsonl step records); {E['REPS']} repetition(s), cases interleaved, medians [min..max]")
p("")
p("| case | `dptrain train` flags | measured samples/s |")
p("|---|---|---:|")
flags = {"alone": "--workers 1 --batch 64", "sync0": "--workers 2", "sync": f"--workers 2 --simulate-slow 1:{E['SLOW']}",
         "async": f"--workers 2 --simulate-slow 1:{E['SLOW']} --mode async",
         "backup": f"--workers 2 --backup-workers 1 --simulate-jitter {E['JITTER']}"}
for c in ("alone", "sync0", "sync", "async", "backup"):
    p(f"| {c} | `{flags[c]}` | {spread(c)} |")
p("")
a0, s0 = med("alone"), med("sync0")
if not a0 or not s0:
    p("**No fit**: the alone or sync0 case gave no throughput.")
    print("\n".join(out))
    sys.exit(0)
c_ms = 64 / a0 * 1e3
step_ms = 128 / s0 * 1e3
comm_ms = step_ms - c_ms
clamp = comm_ms < 0
if clamp:
    comm_ms = 0.0
p(f"Inputs (from alone and sync0 only): compute c = 64 / {a0:.1f} = {c_ms:.3f} ms per step; "
  f"sync0 step = 128 / {s0:.1f} = {step_ms:.3f} ms, so comm a = {comm_ms:.3f} ms"
  + (" (**negative, set to 0**: sync0 was faster than two lone workers)" if clamp else ""))
p("")

def simulate(args):
    cmd = [E["DPTRAIN"], "simulate", "--workers", "2", "--batch", "64", "--compute-ms", f"{c_ms:.4f}",
           "--seed", E["SEED"]] + args
    r = subprocess.run(cmd + ["--json"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"simulate_check: {' '.join(cmd)} failed: {r.stderr.strip()}")
    return "dptrain simulate " + " ".join(cmd[2:]), json.loads(r.stdout)

K, W, N = int(E["SIM_STEPS"]), int(E["WARMUP"]), int(E["STEPS"])
comm = ["--comm-ms", f"{comm_ms:.4f}"]
slow = ["--simulate-slow", f"1:{E['SLOW']}"]
bk = ["--mode", "backup", "--backup", "1", "--simulate-jitter", E["JITTER"]] + comm
rows = []  # (case, what, command, predicted samples/s)
cmd, r = simulate(["--mode", "sync", "--steps", str(K)] + comm)
rows.append(("sync0", "the fit (check: equals measured)", cmd, r["steps_per_s"] * 128))
cmd, r = simulate(["--mode", "sync", "--steps", str(K)] + comm + slow)
rows.append(("sync", f"{K} steps", cmd, r["steps_per_s"] * 128))
cmd, r = simulate(["--mode", "async", "--steps", str(K)] + slow)
rows.append(("async", f"{K} pushes a worker", cmd, r["samples_per_s"]))
# the measured window, steps WARMUP+1..STEPS: T(STEPS) - T(WARMUP), same draws as the trainer's
cmd_n, rn = simulate(["--steps", str(N)] + bk)
cmd_w, rw = simulate(["--steps", str(W)] + bk)
tn, tw = N / rn["steps_per_s"], W / rw["steps_per_s"]
rows.append(("backup", f"steps {W + 1}..{N}, the run's stall draws", f"{cmd_n}  (minus the same with --steps {W})",
             (N - W) * 128 / (tn - tw)))
cmd, r = simulate(["--steps", str(K)] + bk)
rows.append(("backup", f"{K} steps (long run)", cmd, r["steps_per_s"] * 128))

p("| case | simulated | predicted samples/s | measured | error |")
p("|---|---|---:|---:|---:|")
for c, what, cmd, pred in rows:
    m = med(c)
    err = f"{(pred - m) / m * 100:+.1f}%" if m else "n/a"
    p(f"| {c} | {what} | {pred:.0f} | {m:.0f} | {err} |" if m else f"| {c} | {what} | {pred:.0f} | n/a | n/a |")
p("")
p("Backup: both sides count a step as the global batch (128 samples), dropped samples included "
  "(simulate's own samples/s counts the P - b accepted).  Async: no --comm-ms or --server-ms (push and pull "
  "are copies in one process; c holds an optimizer step like the server's).")
p("")
p("Commands:")
p("")
p("```")
for c, what, cmd, pred in rows:
    p(cmd)
p("```")
print("\n".join(out))
EOF
cat "$OUTMD"
RAWOUT=${OUTMD%.md}.tsv
{ printf 'case\trep\tsamples_per_s\tsteps_measured\n'; cat "$RAW"; } >"$RAWOUT"
note "report written to $OUTMD (raw figures in $RAWOUT)"
