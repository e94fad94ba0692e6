#!/usr/bin/env bash
# Where dp2's step time goes against the machine's ceiling (issue 9): per-step
# timelines of three variants of the same work, side by side in one run.
#
#   bench/breakdown.sh                     # REPS=3, mlp and cnn
#   MODELS=mlp STEPS=300 REPS=5 bench/breakdown.sh
#
# Variants (global batch 128, SGD lr 0.05 momentum 0.9, one thread per worker):
#   one   one worker at batch 64, alone on the machine
#   ind2  two independent one-worker processes at batch 64 at once (scaling.sh's
#         ceiling: no communication, but both cores busy, sharing caches and memory), with
#         --prefetch 0: no loader thread, as dp2's --prefetch auto on the cores it fills
#   dp2   `--workers 2`: 64 per worker, gradients all-reduced (the default --comm-progress auto:
#         where the 2 workers fill the cores, caller progress, so dp2 is then dp2c)
#   dp2m  dp2 with metrics (--out, as bench/plan_validate.sh's runs): after every update the
#         trainer all-gathers each rank's wait, a second sync point per step (issue 14: what
#         the plan's "metrics gather" costs beyond its formula; the row dp2m - dp2)
#   dp2c  (with VARIANTS including it) dp2 with --comm-progress caller: the workers sum their
#         own blocks of each bucket between layers, no communication thread
#   dp2cs (with VARIANTS including it) dp2c with --comm-spin-us SPIN_US (200): a waiting worker
#         spins that long before it sleeps (no third thread needs its core)
#   ind2p, dp2cp, dp2cpb  (with VARIANTS including them) ind2 with each process on its own core
#         (taskset) and --pin-threads; dp2c pinned (--pin-threads); and that with --balance
#         (shares by busy time): issue 9's best variant against the pinned ceiling; with ind2p in
#         VARIANTS and not ind2, the differences are taken against ind2p
#   dp2n  (with VARIANTS including it) dp2 with --no-overlap: every bucket after backward
# Each run writes a timeline (--timeline): per step and worker the phases data,
# forward, backward, wait (from the end of backward until the step's last
# bucket is reduced: exposed communication plus waiting for the other worker)
# and optimizer.  A step is from one step's `data` start to the next's; `other`
# is what is left (zeroing, bookkeeping, the loop).  Per run: the median over
# the steps after the 5th of each phase, averaged over the workers (ind2: the
# two processes); per variant: the median over REPS runs of each column.
# The table's last rows are the differences dp2 - ind2 (what our machinery
# costs) and ind2 - one (what the second core's contention costs), column by
# column: the columns of a difference add up to its step time.
# `floor` (ind2, ind2p): the two independent processes' step times paired by step index,
# each less its own mean; were they made to step together, each step would last the longer
# one, m + E|d|/2 on average: m / (m + E|d|/2) is the share of the ceiling that synchronous
# data parallelism keeps on this machine with no communication at all (the row "synchronised:
# the floor").
# `imbal` (dp2) is the median |difference| of the two workers' backward end
# times per step: the part of `wait` that is one worker waiting for the other.
#
# Knobs: REPS=3 MODELS="mlp cnn" STEPS (default mlp 300, resnet 40, others 100) VARIANTS="one ind2 dp2"
#        (add dp2m, dp2c, dp2cs, dp2n) SPIN_US=200 DPTRAIN=./build/dptrain RESULTS=bench/results
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

REPS=${REPS:-3}
MODELS=${MODELS:-"mlp cnn"}
VARIANTS=${VARIANTS:-"one ind2 dp2"}
DPTRAIN=${DPTRAIN:-./build/dptrain}
RESULTS=${RESULTS:-bench/results}
PY=${PY:-python3}

die() { echo "breakdown: error: $*" >&2; exit 1; }
[ -x "$DPTRAIN" ] || die "$DPTRAIN not found: build it first (make)"
for v in $VARIANTS; do case $v in one | ind2 | ind2p | dp2 | dp2m | dp2c | dp2cs | dp2n | dp2cp | dp2cpb) ;; *) die "unknown variant $v (one ind2 ind2p dp2 dp2m dp2c dp2cs dp2n dp2cp dp2cpb)" ;; esac; done
[[ " $VARIANTS " == *" ind2 "* || " $VARIANTS " == *" ind2p "* ]] ||
    die "VARIANTS must include ind2 or ind2p (the differences are taken against it)"
"$PY" -c 'import json, statistics' 2>/dev/null || die "$PY cannot run"

# the cores this script may use, for ind2p's taskset (one per process)
read -r -a CORES <<<"$("$PY" -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))))')"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/breakdown.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
PIN=(env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
RECIPE=(--lr 0.05 --momentum 0.9 --seed 1 --epochs 1 --threads 1 --progress none)

steps_for() {
    if [ -n "${STEPS:-}" ]; then echo "$STEPS"; return; fi
    case $1 in mlp) echo 300 ;; resnet) echo 40 ;; *) echo 100 ;; esac
}

run_variant() { # run_variant VARIANT MODEL REP: timelines into $WORK/VARIANT-MODEL-REP*.json
    local v=$1 m=$2 r=$3 s
    s=$(steps_for "$m")
    local base=$WORK/$v-$m-$r
    case $v in
    one) "${PIN[@]}" "$DPTRAIN" train --model "$m" --workers 1 --batch 64 --max-steps "$s" "${RECIPE[@]}" \
             --timeline "$base.json" >"$base.log" 2>&1 ;;
    ind2 | ind2p)
          local ta=() tb=() pin=(--prefetch 0)
          # ind2p: each process on its own core, pinned as dp2cp's workers are
          if [ "$v" = ind2p ]; then ta=(taskset -c "${CORES[0]}") tb=(taskset -c "${CORES[$((1 % ${#CORES[@]}))]}") pin+=(--pin-threads); fi
          "${ta[@]}" "${PIN[@]}" "$DPTRAIN" train --model "$m" --workers 1 --batch 64 --max-steps "$s" "${RECIPE[@]}" \
              "${pin[@]}" --timeline "$base-a.json" >"$base-a.log" 2>&1 &
          local pid=$!
          "${tb[@]}" "${PIN[@]}" "$DPTRAIN" train --model "$m" --workers 1 --batch 64 --max-steps "$s" "${RECIPE[@]}" \
              "${pin[@]}" --timeline "$base-b.json" >"$base-b.log" 2>&1
          wait "$pid" ;;
    dp2 | dp2m | dp2c | dp2cs | dp2n | dp2cp | dp2cpb)
        local extra=()
        case $v in
        dp2c) extra=(--comm-progress caller) ;;
        dp2cp) extra=(--comm-progress caller --pin-threads) ;;
        dp2cpb) extra=(--comm-progress caller --pin-threads --balance) ;;
        dp2cs) extra=(--comm-progress caller --comm-spin-us "${SPIN_US:-200}") ;;
        dp2n) extra=(--no-overlap) ;;
        dp2m) extra=(--out "$base.run") ;;
        esac
        "${PIN[@]}" "$DPTRAIN" train --model "$m" --workers 2 --batch 128 --max-steps "$s" "${RECIPE[@]}" \
            "${extra[@]}" --timeline "$base.json" >"$base.log" 2>&1 ;;
    esac || die "$v $m rep $r failed: $(tail -2 "$base"*.log)"
}

bench_facts breakdown
OUTTSV=${OUTMD%.md}.tsv
read -r -a VARR <<<"$VARIANTS"
NV=${#VARR[@]}
for m in $MODELS; do
    for r in $(seq 1 "$REPS"); do
        # the order rotates from one repetition to the next
        for k in $(seq 0 $((NV - 1))); do run_variant "${VARR[$(((k + r - 1) % NV))]}" "$m" "$r"; done
    done
done

"$PY" - "$WORK" "$MODELS" "$REPS" "$OUTTSV" "$VARIANTS" >"$WORK/table.md" <<'EOF'
import json, statistics, sys, glob, os
work, models, reps, out_tsv = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4]
variants = sys.argv[5].split()
PH = ["data", "forward", "backward", "wait", "optimizer"]
COLS = ["step"] + PH + ["other"]

def per_worker(path):
    """{tid: {step: {phase: ms, 't0': start of data, 'bwd_end': end of backward}}}"""
    ev = json.load(open(path))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    names = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M"}
    w = {}
    for e in ev:
        if e.get("ph") != "X" or "compute" not in names.get(e["tid"], ""): continue
        s = e.get("args", {}).get("step")
        if s is None: continue
        d = w.setdefault(e["tid"], {}).setdefault(s, {})
        d[e["name"]] = d.get(e["name"], 0.0) + e["dur"] / 1000.0
        if e["name"] == "data": d["t0"] = min(d.get("t0", 1e30), e["ts"] / 1000.0)
        if e["name"] == "backward": d["bwd_end"] = (e["ts"] + e["dur"]) / 1000.0
    return w

def worker_medians(steps):
    keys = sorted(k for k in steps if k >= 5 and k + 1 in steps and "t0" in steps[k] and "t0" in steps[k + 1])
    rows = []
    for k in keys:
        d = steps[k]
        row = {"step": steps[k + 1]["t0"] - d["t0"]}
        for p in PH: row[p] = d.get(p, 0.0)
        row["other"] = row["step"] - sum(row[p] for p in PH)
        rows.append(row)
    return {c: statistics.median(r[c] for r in rows) for c in COLS}, keys

def run_row(files):
    ws, imb = [], None
    per = [per_worker(f) for f in files]
    workers = [steps for p in per for steps in p.values()]
    meds = [worker_medians(s)[0] for s in workers]
    row = {c: sum(m[c] for m in meds) / len(meds) for c in COLS}
    if len(per) == 1 and len(workers) == 2:  # dp2: the two workers' backward ends
        a, b = workers
        ks = [k for k in a if k >= 5 and k in b and "bwd_end" in a[k] and "bwd_end" in b[k]]
        row["imbal"] = statistics.median(abs(a[k]["bwd_end"] - b[k]["bwd_end"]) for k in ks) if ks else 0.0
    if len(per) == 2 and len(workers) == 2:  # ind2: what a step barrier alone would cost them
        row["floor"] = sync_floor(*workers)
    return row

def sync_floor(a, b):
    """The two independent processes' step times paired by step index, each
    less its own mean (what --balance would even out): were they made to
    step together, each step would last the longer of the two, i.e. on
    average m + E|d|/2 for a mean step m and the paired difference d.  The
    floor is m / (m + E|d|/2): the share of ind2's throughput that any
    synchronous data parallelism on this machine keeps, with no
    communication at all."""
    def times(w):
        ks = sorted(k for k in w if k >= 5 and k + 1 in w and "t0" in w[k] and "t0" in w[k + 1])
        return {k: w[k + 1]["t0"] - w[k]["t0"] for k in ks}
    ta, tb = times(a), times(b)
    ks = [k for k in ta if k in tb]
    if len(ks) < 2: return float("nan")
    ma, mb = statistics.mean(ta[k] for k in ks), statistics.mean(tb[k] for k in ks)
    d = statistics.mean(abs((ta[k] - ma) - (tb[k] - mb)) for k in ks)
    m = (ma + mb) / 2
    return m / (m + d / 2)

tsv = open(out_tsv, "w")
tsv.write("model\tvariant\trep\t" + "\t".join(COLS) + "\timbal\tfloor\n")
print("| model | variant | step ms | data | forward | backward | wait | optimizer | other | imbal |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for m in models:
    med = {}
    for v in variants:
        rows = []
        for r in range(1, reps + 1):
            files = sorted(glob.glob(os.path.join(work, f"{v}-{m}-{r}*.json")))
            row = run_row(files)
            rows.append(row)
            tsv.write(f"{m}\t{v}\t{r}\t" + "\t".join(f"{row[c]:.4f}" for c in COLS) +
                      f"\t{row.get('imbal', 0):.4f}\t{row.get('floor', float('nan')):.4f}\n")
        med[v] = {c: statistics.median(x[c] for x in rows) for c in COLS + ["imbal", "floor"] if c in rows[0]}
        mv = med[v]
        print(f"| {m} | {v} | " + " | ".join(f"{mv[c]:.3f}" for c in COLS) + f" | {mv.get('imbal', 0):.3f} |" if "imbal" in mv
              else f"| {m} | {v} | " + " | ".join(f"{mv[c]:.3f}" for c in COLS) + " | |")
    dps = [v for v in variants if v.startswith("dp2")]
    # the pinned variants against the pinned ceiling when there is one
    def ceiling(v):
        return "ind2p" if "ind2p" in med and (v in ("dp2cp", "dp2cpb") or "ind2" not in med) else "ind2"
    pairs = [(v, ceiling(v)) for v in dps] + ([("ind2", "one")] if "one" in med and "ind2" in med else []) + \
        ([("dp2m", "dp2")] if "dp2m" in med and "dp2" in med else [])
    for a, b in pairs:
        print(f"| {m} | {a} - {b} | " + " | ".join(f"{med[a][c] - med[b][c]:+.3f}" for c in COLS) + " | |")
    for v in dps:
        print(f"| {m} | {v} / {ceiling(v)} throughput | {med[ceiling(v)]['step'] / med[v]['step']:.3f} | | | | | | | |")
    for v in ("ind2", "ind2p"):
        if v in med and "floor" in med[v]:
            print(f"| {m} | {v} synchronised: the floor | {med[v]['floor']:.3f} | | | | | | | |")
EOF

{
    echo "# breakdown $STAMP"
    echo
    echo "CPU: $CPU_MODEL ($NCPU cores); load average at start: $LOAD1; git $GIT_REV"
    echo "VARIANTS=\"$VARIANTS\" REPS=$REPS; per-step medians in ms (steps after the 5th), the median over the repetitions;"
    echo "raw per-run rows: $(basename "$OUTTSV")"
    echo
    cat "$WORK/table.md"
} | tee "$OUTMD"
echo "breakdown: wrote $OUTMD" >&2
