#!/usr/bin/env bash
# Slow workers: what --balance wins back when one of 2 workers is slow (issue 11, D5).
#
#   bench/stragglers.sh                      # REPS=3 throughput repetitions
#   REPS=1 STEPS=40 WARMUP=15 bench/stragglers.sh   # a quick validation
#   ACC=1 bench/stragglers.sh                # plus the accuracy check (cnn, 5 epochs each)
#
# cnn, 2 workers x 1 thread, global batch 128, SGD lr 0.05 momentum 0.9, one epoch cut off
# by --max-steps STEPS (150).  Variants, interleaved within a repetition (the order
# rotates from one repetition to the next):
#
#   sync0    ./build/dptrain train --workers 2 ...                               no slowness:
#            the reference a perfect remedy would reach
#   sync     ... --simulate-slow 1:SLOW                                          (SLOW = 2)
#   balance  ... --simulate-slow 1:SLOW --balance[=BALANCE_K]                    (default K)
#   async    ... --simulate-slow 1:SLOW --mode async (the parameter server; async stops only at
#            epoch ends, so its run is one epoch of --train-limit STEPS x 128 samples: the same
#            samples; its step records are rank 0's pushes, each carrying every worker's samples
#            since the one before, so the same sum of samples / sum of step_s is global samples/s)
# VARIANTS_LIST="sync0 sync balance async" picks variants.  ACC=1 also runs async for 5 epochs
# (its accuracy is reported; the target is the throughput, >= 1.35x sync).
#
# Throughput: global samples/s over the steps after the WARMUP-th (25: past the first
# re-plans of --balance, whose shares start equal), from the step records of
# metrics.jsonl (sum of samples / sum of step_s).  balance / sync and sync / sync0 are
# per-repetition ratios (runs made side by side), medians over the repetitions
# [min..max].  Target: balance >= 1.35x sync.  Ideal with a 2x slow worker: shares 2/3
# and 1/3, a step of 2/3 of the synchronous one, so 1.5x sync and 0.75x sync0 (the two
# workers together are then worth 1.5 full-speed ones).
#
# ACC=1: cnn, ACC_EPOCHS (5) epochs each, sync0 vs balance (rank 1 SLOW x slow), the final
# test accuracy from the last `epoch 5/5 ... test acc XX.XX%` line; target: within
# ACC_TOL (0.3) points.  (The gradient of --balance is the global-batch one: the two runs
# differ only by float rounding, amplified by training.)
#
# Environment knobs:
#   REPS=3  STEPS=150  WARMUP=25  SLOW=2  BALANCE_K=  (empty: the default of --balance)
#   SEED=1  ACC=0  ACC_EPOCHS=5  ACC_TOL=0.3  ACC_EXTRA="..." (e.g. --train-limit 5000)
#   DPTRAIN=./build/dptrain  PY=/usr/bin/python3  RESULTS=bench/results
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

REPS=${REPS:-3}
STEPS=${STEPS:-150}
WARMUP=${WARMUP:-25}
SLOW=${SLOW:-2}
BALANCE_K=${BALANCE_K:-}
SEED=${SEED:-1}
ACC=${ACC:-0}
ACC_EPOCHS=${ACC_EPOCHS:-5}
ACC_TOL=${ACC_TOL:-0.3}
ACC_EXTRA=${ACC_EXTRA:-}
DPTRAIN=${DPTRAIN:-./build/dptrain}
PY=${PY:-/usr/bin/python3}
RESULTS=${RESULTS:-bench/results}

die() { echo "stragglers: error: $*" >&2; exit 1; }
note() { echo "stragglers: $*" >&2; }

# ---- preconditions ----------------------------------------------------------------
[ -x "$DPTRAIN" ] || die "$DPTRAIN not found or not executable: build it first (make) or set DPTRAIN=PATH"
HELP=$("$DPTRAIN" train --help 2>&1 || true) # (grep -q on a pipe would SIGPIPE it under pipefail)
grep -q -- '--balance' <<<"$HELP" || die "'$DPTRAIN train --help' does not list --balance: is the binary current?"
command -v "$PY" >/dev/null || die "$PY not found (set PY=)"
[ "$STEPS" -gt "$WARMUP" ] 2>/dev/null || die "STEPS ($STEPS) must be an integer above WARMUP ($WARMUP)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/stragglers.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
RAW=$WORK/raw.tsv      # variant rep samples_per_s steps_measured
ACCRAW=$WORK/acc.tsv   # variant acc% epoch time_s shares
: >"$RAW"
: >"$ACCRAW"

PIN=(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1)
BAL=(--balance)
[ -n "$BALANCE_K" ] && BAL=(--balance="$BALANCE_K")
VARIANTS=(${VARIANTS_LIST:-sync0 sync balance async})

# The command line of one variant, into CMD (the run's own flags after it).
build_cmd() {
    CMD=(env "${PIN[@]}" "$DPTRAIN" train --model cnn --workers 2 --threads 1 --batch 128 --lr 0.05
         --momentum 0.9 --seed "$SEED" --progress none)
    case $1 in
    sync0) ;;
    sync) CMD+=(--simulate-slow "1:$SLOW") ;;
    balance) CMD+=(--simulate-slow "1:$SLOW" "${BAL[@]}") ;;
    async) CMD+=(--simulate-slow "1:$SLOW" --mode async) ;;
    esac
}

run_one() {
    local variant=$1 rep=$2
    local dir=$WORK/$variant-r$rep log=$WORK/$variant-r$rep.log
    build_cmd "$variant"
    local rc=0
    # async stops at epoch ends only: one epoch of STEPS global batches instead of --max-steps
    if [ "$variant" = async ]; then
        "${CMD[@]}" --epochs 1 --train-limit $((STEPS * 128)) --out "$dir" >"$log" 2>&1 || rc=$?
    else
        "${CMD[@]}" --epochs 1 --max-steps "$STEPS" --out "$dir" >"$log" 2>&1 || rc=$?
    fi
    local sps="NA" k=0
    [ -f "$dir/metrics.jsonl" ] && read -r sps k <<<"$(step_throughput "$dir/metrics.jsonl")"
    if [ "$rc" != 0 ] || [ "$sps" = NA ]; then
        note "$variant rep=$rep: no throughput (exit $rc); last lines of its output:"
        tail -n 5 "$log" | sed 's/^/    /' >&2
        sps=NA
    fi
    printf '%s\t%s\t%s\t%s\n' "$variant" "$rep" "$sps" "$k" >>"$RAW"
    printf '  %-8s rep %s: %s samples/s (%s steps after the %sth)\n' "$variant" "$rep" "$sps" "$k" "$WARMUP" >&2
}

# ---- throughput -------------------------------------------------------------------
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T_START=$(date +%s)
note "variants: ${VARIANTS[*]}; $REPS repetition(s); cnn, $STEPS steps, warm-up $WARMUP; rank 1 ${SLOW}x slow"
bench_interleaved "$REPS" "${VARIANTS[@]}"

# ---- optional: accuracy, balance (slowed) vs sync0 (unslowed) ---------------------------
final_acc() { sed -n 's/^epoch \([0-9]*\)\/[0-9]* .*test acc \([0-9.]*\)%.*/\2 \1/p' "$1" | tail -n 1; }
last_shares() { sed -n 's/^epoch .*  shares \([0-9/]*\)$/\1/p' "$1" | tail -n 1; }
if [ "$ACC" = 1 ]; then
    # shellcheck disable=SC2206
    extra=($ACC_EXTRA)
    for variant in sync0 balance async; do
        log=$WORK/acc-$variant.log
        build_cmd "$variant"
        note "accuracy: $variant, cnn $ACC_EPOCHS epochs"
        t0=$(date +%s.%N)
        rc=0
        "${CMD[@]}" --epochs "$ACC_EPOCHS" "${extra[@]}" >"$log" 2>&1 || rc=$?
        t1=$(date +%s.%N)
        read -r acc ep <<<"$(final_acc "$log")" || true
        if [ "$rc" != 0 ] || [ -z "${acc:-}" ]; then
            note "  $variant: no final accuracy (exit $rc); last lines:"
            tail -n 5 "$log" | sed 's/^/    /' >&2
            acc=NA ep=0
        fi
        tt=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')
        sh=$(last_shares "$log")
        printf '%s\t%s\t%s\t%s\t%s\n' "$variant" "$acc" "${ep:-0}" "$tt" "${sh:-}" >>"$ACCRAW"
        note "  test acc ${acc}% after epoch ${ep:-0}/$ACC_EPOCHS (${tt}s)${sh:+, shares $sh}"
    done
fi

# ---- report -----------------------------------------------------------------------
bench_facts stragglers
export RAW ACCRAW REPS STEPS WARMUP SLOW LOAD0 LOAD1 T_START CPU_MODEL NCPU GIT_REV DPTRAIN SEED
export ACC_EPOCHS ACC_TOL ACC_EXTRA BALANCE_K
"$PY" - >"$OUTMD" <<'EOF'
import os, statistics, time

E = os.environ
rows = [l.rstrip("\n").split("\t") for l in open(E["RAW"]) if l.strip()]
data = {}  # variant -> {rep: sps}
for variant, rep, sps, k in rows:
    if sps != "NA":
        data.setdefault(variant, {})[int(rep)] = float(sps)

def med(xs):
    return statistics.median(xs) if xs else None

def ratios(a, b):
    da, db = data.get(a, {}), data.get(b, {})
    return [da[r] / db[r] for r in da if r in db and db[r] > 0]

def cell(rs, target=None):
    if not rs:
        return "n/a"
    m = med(rs)
    s = f"{m:.2f}x [{min(rs):.2f}..{max(rs):.2f}]"
    if target is not None:
        s += " ok" if m >= target else " **below target**"
    return s

k = E["BALANCE_K"] or "default"
out = []
p = out.append
p(f"# Slow workers: --balance against synchronous training (cnn, 2 workers, rank 1 {E['SLOW']}x slow)")
p("")
p(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, wall {time.time() - int(E['T_START']):.0f}s; "
  f"dptrain `{E['DPTRAIN']}` at git `{E['GIT_REV']}`")
p(f"- machine: {E['CPU_MODEL']}, {E['NCPU']} CPUs; load average at start {E['LOAD0']}, at end {E['LOAD1']}")
p(f"- recipe: cnn, global batch 128, SGD lr 0.05 momentum 0.9, seed {E['SEED']}, 2 workers x 1 thread, "
  f"{E['STEPS']} steps; samples/s over the steps after the {E['WARMUP']}th (metrics.jsonl step records); "
  f"--balance re-plan interval: {k}; slowness by --simulate-slow 1:{E['SLOW']} (sleep, docs/ddp.md)")
p(f"- {E['REPS']} repetition(s), variants interleaved; samples/s are medians over the repetitions, ratios "
  "medians of the per-repetition ratios [min..max]")
p("")
p("| variant | samples/s (median) |")
p("|---|---:|")
names = {"sync0": "synchronous, no slow worker (reference)", "sync": f"synchronous, rank 1 {E['SLOW']}x slow",
         "balance": f"--balance, rank 1 {E['SLOW']}x slow",
         "async": f"--mode async (parameter server), rank 1 {E['SLOW']}x slow"}
for v in ("sync0", "sync", "balance", "async"):
    m = med(list(data.get(v, {}).values()))
    p(f"| {names[v]} | {m:.0f} |" if m is not None else f"| {names[v]} | n/a |")
p("")
p("| ratio | value |")
p("|---|---:|")
p(f"| balance / sync (target >= 1.35x, ideal 1.5x at 2x slow) | {cell(ratios('balance', 'sync'), 1.35)} |")
p(f"| balance / sync0 (the unslowed run) | {cell(ratios('balance', 'sync0'))} |")
if data.get("async"):
    p(f"| async / sync (target >= 1.35x) | {cell(ratios('async', 'sync'), 1.35)} |")
p(f"| sync / sync0 (what the slow worker costs) | {cell(ratios('sync', 'sync0'))} |")
p("")
acc = [l.rstrip("\n").split("\t") for l in open(E["ACCRAW"]) if l.strip()]
if acc:
    tol = float(E["ACC_TOL"])
    ne = int(E["ACC_EPOCHS"])
    extra = f", extra flags `{E['ACC_EXTRA']}`" if E["ACC_EXTRA"].strip() else ""
    p(f"## Accuracy: cnn, {ne} epochs, --balance and async (rank 1 {E['SLOW']}x slow) vs synchronous unslowed{extra}")
    p("")
    p("| variant | test acc | epochs | time | shares at the end |")
    p("|---|---:|---:|---:|---|")
    res = {}
    for v, a, ep, tt, sh in (r + [""] * (5 - len(r)) for r in acc):
        res[v] = (a, int(ep))
        p(f"| {names[v]} | {a}% | {ep} | {tt}s | {sh or '-'} |")
    r0, r1 = res.get("sync0"), res.get("balance")
    if r0 and r1 and r0[0] != "NA" and r1[0] != "NA" and r0[1] == ne and r1[1] == ne:
        d = float(r1[0]) - float(r0[0])
        p("")
        p(f"balance - sync0: {d:+.2f} points" + (" ok" if abs(d) <= tol + 1e-9 else " **outside target**")
          + f" (target within {tol})")
    p("")
print("\n".join(out))
EOF
cat "$OUTMD"
RAWOUT=${OUTMD%.md}.tsv
{ printf 'variant\trep\tsamples_per_s\tsteps_measured\n'; cat "$RAW"; } >"$RAWOUT"
note "report written to $OUTMD (raw figures in $RAWOUT)"
