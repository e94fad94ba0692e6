#!/usr/bin/env bash
# Pipeline parallelism's bubble and activation memory (issue 31, Q4): 2 stages, each on its own
# core, gpipe and 1f1b at M = 1 .. 32 micro-batches, against the formulas.
#
#   bench/pipe_bubble.sh                 # REPS=3 STEPS=14 MICRO="1 2 4 8 16 32"
#   TOKENS=fortunes.bin bench/pipe_bubble.sh
#
# Workload: gpt:layers=4,heads=4,dim=128,ctx=64 (the issue's gpt) on the fortunes token file, global
# batch 64 windows, AdamW, `--workers 2 --pp 2 --pin-threads` (stage s on core s), --timeline.
#
# The bubble, measured from each run's timeline over steps 4 .. STEPS-1: a step's pipeline time
# is from the first forward's start on either stage to the last backward's end on either; stage
# s's busy time is the sum of its forwards and backwards in it; its idle share is
# 1 - busy / pipeline time.  The formula, (S - 1) / (M + S - 1), assumes stages of equal cost;
# the split (printed by the run) is as balanced as whole layers allow, and the report gives each
# stage's measured cost per micro-batch beside it.  Medians of REPS repetitions, interleaved.
#
# Activations: the run's last line, each stage's most bytes held at once (its micro-batches'
# arenas' high-water marks); the formula: gpipe holds M micro-batches' activations, 1f1b at
# most min(S - s, M) on stage s, so 1f1b / gpipe = min(S - s, M) / M.
#
# Also, as the references, one worker (--workers 1), plain data parallelism on the two cores
# (--workers 2, 32 windows each) and tensor parallelism (--workers 2 --tp 2: both workers on the
# whole batch, each block split 2 ways) on the same batch: samples/s.
# The plan against them (PLAN=0: not run): `dptrain calibrate --model MODEL --workers 2 --batch 64
# --optim adamw` once, before the runs (the profile: forward and backward seconds per sample with
# both workers computing at once, the optimizer's per parameter, the links), and the same at
# --batch 16 and 4 (8 and 2 samples per worker: the compute of a pipeline's small micro-batches,
# given with --profile-at); then for each layout `dptrain plan --profile ... --profile-at ...`
# (--pp 2 --micro-batches M --pp-schedule K; --workers 1, 2 and --tp 2 for the references): its predicted
# step against the measured one (64 / samples/s), and `plan --layout auto`'s first layout against
# the fastest measured.
# Output: bench/results/pipe_bubble-<stamp>.md and .tsv (one row per run).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RESULTS=${RESULTS:-$ROOT/bench/results}
DPTRAIN=${DPTRAIN:-$ROOT/build/dptrain}
REPS=${REPS:-3}
STEPS=${STEPS:-14}
MICRO=${MICRO:-1 2 4 8 16 32}
TOKENS=${TOKENS:-}
PY=${PY:-python3}
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
bench_start pipe_bubble
[ -x "$DPTRAIN" ] || die "$DPTRAIN not built (make)"
[ "$STEPS" -ge 6 ] 2>/dev/null || die "STEPS must be at least 6 (got '$STEPS')"
bench_tokens
MODEL=gpt:layers=4,heads=4,dim=128,ctx=64
COMMON=(--model "$MODEL" --data "$TOKENS" --batch 64 --optim adamw --lr 1e-3 --max-steps "$STEPS" --progress none
        --pin-threads)
PLAN=${PLAN:-1}
PROFILE=$WORK/profile.json
if [ "$PLAN" != 0 ]; then
    note "calibrating (dptrain calibrate --model $MODEL --workers 2 --batch 64 --optim adamw)"
    for cb in 64 16 4; do
        "$DPTRAIN" calibrate --model "$MODEL" --workers 2 --batch "$cb" --optim adamw --out "$WORK/profile-$cb.json" \
            >"$WORK/calibrate.log" 2>&1 || { tail -3 "$WORK/calibrate.log" >&2; die "dptrain calibrate failed"; }
    done
    cp "$WORK/profile-64.json" "$PROFILE"
fi
PLAN_AT=(--profile-at "$WORK/profile-16.json" --profile-at "$WORK/profile-4.json")
# predicted SCHEDULE M: the plan's step seconds for that layout (one/dp2 with M 0); NA without PLAN
predicted() {
    [ "$PLAN" != 0 ] || { echo NA; return; }
    local args=(--profile "$PROFILE" "${PLAN_AT[@]}" --model "$MODEL" --batch 64 --optim adamw --json)
    case $1 in
        one) "$DPTRAIN" plan "${args[@]}" --workers 1 ;;
        dp2) "$DPTRAIN" plan "${args[@]}" --workers 2 ;;
        tp2) "$DPTRAIN" plan "${args[@]}" --workers 2 --tp 2 ;;
        *) "$DPTRAIN" plan "${args[@]}" --workers 2 --pp 2 --micro-batches "$2" --pp-schedule "$1" ;;
    esac 2>/dev/null | sed -n 's/.*"step_s": \([0-9.eE+-]*\),.*/\1/p' | head -n 1
}
TSV=${OUTMD%.md}.tsv
printf 'rep\tschedule\tmicro\tsamples_s\tidle0\tidle1\tbusy0_ms\tbusy1_ms\tact0_mb\tact1_mb\tplan_step_s\n' >"$TSV"

# timeline_idle FILE: "idle0 idle1 busy0_ms busy1_ms", medians over steps 4 .. STEPS-1
timeline_idle() {
    "$PY" - "$1" "$STEPS" <<'PYEOF'
import json, statistics, sys
doc = json.load(open(sys.argv[1]))
ev = doc["traceEvents"] if isinstance(doc, dict) else doc
steps = int(sys.argv[2])
rows = {}
for e in ev:
    if e.get("ph") != "X" or e["name"] not in ("forward", "backward"): continue
    st = e["args"].get("step", -1)
    if st < 4 or st >= steps: continue
    r = rows.setdefault(st, {"t0": 1e30, "t1": 0, "busy": {}})
    r["t0"] = min(r["t0"], e["ts"]); r["t1"] = max(r["t1"], e["ts"] + e["dur"])
    stage = e["tid"] // 2
    r["busy"][stage] = r["busy"].get(stage, 0) + e["dur"]
idle = {0: [], 1: []}; busy = {0: [], 1: []}
for r in rows.values():
    span = r["t1"] - r["t0"]
    for s in (0, 1):
        b = r["busy"].get(s, 0)
        idle[s].append(1 - b / span); busy[s].append(b / 1e3)
med = statistics.median
print("%.3f %.3f %.1f %.1f" % (med(idle[0]), med(idle[1]), med(busy[0]), med(busy[1])))
PYEOF
}

note "pipe_bubble: $CPU_MODEL, $NCPU CPUs, REPS=$REPS STEPS=$STEPS MICRO='$MICRO'"
for rep in $(seq 1 "$REPS"); do
    runs=()
    for k in gpipe 1f1b; do for m in $MICRO; do runs+=("$k:$m"); done; done
    runs+=("one:0" "dp2:0" "tp2:0")
    n=${#runs[@]}
    for i in $(seq 0 $((n - 1))); do
        r=${runs[$(((i + rep) % n))]} # (the order rotates per repetition)
        k=${r%%:*} m=${r##*:}
        log=$WORK/run-$rep-$k-$m.log tl=$WORK/tl-$rep-$k-$m.json
        if [ "$k" = one ] || [ "$k" = dp2 ] || [ "$k" = tp2 ]; then
            case $k in one) ref=(--workers 1) ;; dp2) ref=(--workers 2) ;; *) ref=(--workers 2 --tp 2) ;; esac
            "$DPTRAIN" train "${COMMON[@]}" "${ref[@]}" >"$log" 2>&1 || { tail -3 "$log" >&2; die "$k failed"; }
            printf '%s\t%s\t0\t%s\tNA\tNA\tNA\tNA\tNA\tNA\t%s\n' "$rep" "$k" "$(dptrain_sps "$log")" \
                "$(predicted "$k" 0)" >>"$TSV"
            continue
        fi
        "$DPTRAIN" train "${COMMON[@]}" --workers 2 --pp 2 --micro-batches "$m" --pp-schedule "$k" --timeline "$tl" \
            >"$log" 2>&1 || { tail -3 "$log" >&2; die "--pp 2 --micro-batches $m --pp-schedule $k failed"; }
        read -r i0 i1 b0 b1 <<<"$(timeline_idle "$tl")"
        act=$(sed -n 's/^pipeline: activations held at most: stage 0 \([0-9.]*\) MB, stage 1 \([0-9.]*\) MB$/\1 \2/p' "$log")
        read -r a0 a1 <<<"${act:-NA NA}"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rep" "$k" "$m" "$(dptrain_sps "$log")" "$i0" "$i1" "$b0" \
            "$b1" "$a0" "$a1" "$(predicted "$k" "$m")" >>"$TSV"
        split=$(sed -n 's/^pipeline: 2 stages x 1 replica, [0-9]* micro-batch[es]*, [a-z0-9]*: //p' "$log")
    done
done

FIRST=NA
if [ "$PLAN" != 0 ]; then # the layout plan ranks first: "dp pp micro"
    FIRST=$("$DPTRAIN" plan --profile "$PROFILE" "${PLAN_AT[@]}" --model "$MODEL" --batch 64 --optim adamw --workers 2 --layout auto --json \
        2>/dev/null | sed -n 's/.*"rank": 1, "dp": \([0-9]*\), "pp": \([0-9]*\), "tp": \([0-9]*\), "micro_batches": \([0-9]*\), "zero": \([0-9]*\).*/\1 \2 \3 \4 \5/p')
fi
"$PY" - "$TSV" "$OUTMD" "$CPU_MODEL" "$NCPU" "$LOAD1" "$GIT_REV" "$STEPS" "$split" "${FIRST:-NA}" <<'PYEOF'
import csv, statistics, sys
tsv, out, cpu, ncpu, load, rev, steps, split, first = sys.argv[1:]
rows = list(csv.DictReader(open(tsv), delimiter="\t"))
med = lambda xs: statistics.median(xs) if xs else float("nan")
def f(v):
    try: return float(v)
    except ValueError: return float("nan")
one = med([f(r["samples_s"]) for r in rows if r["schedule"] == "one"])
dp2 = med([f(r["samples_s"]) for r in rows if r["schedule"] == "dp2"])
tp2 = med([f(r["samples_s"]) for r in rows if r["schedule"] == "tp2"])
S = 2
lines = ["# Pipeline bubble and activations: 2 stages, gpipe and 1f1b", "",
         f"CPU: {cpu}, {ncpu} CPUs (load at start {load}); dptrain {rev}; gpt:layers=4,heads=4,dim=128,ctx=64,"
         f" batch 64, steps 4..{int(steps) - 1} of each run, medians of the repetitions.", "",
         f"Split: {split}", "",
         f"On the same batch: one worker {one:.1f} samples/s; plain data parallelism on the two cores"
         f" (--workers 2) {dp2:.1f} samples/s ({dp2 / one:.2f}×); tensor parallelism on them (--workers 2 --tp 2)"
         f" {tp2:.1f} samples/s ({tp2 / one:.2f}×).", "",
         "| schedule | M | formula (S-1)/(M+S-1) | idle stage 0 | idle stage 1 | busy ms/step 0 / 1 | samples/s | vs one worker |"
         " act. MB stage 0 / 1 | formula 1f1b/gpipe stage 0 / 1 | step ms measured / planned |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
def planned(rs):
    v = med([f(r["plan_step_s"]) for r in rs])
    m = med([64 / f(r["samples_s"]) for r in rs if f(r["samples_s"]) > 0])
    return m, v, ("" if v != v else f"{m * 1e3:.1f} / {v * 1e3:.1f} ({(v / m - 1) * 100:+.0f}%)")
errs = []
micros = sorted({int(r["micro"]) for r in rows if r["schedule"] in ("gpipe", "1f1b")})
gp = {}
for k in ("gpipe", "1f1b"):
    for m in micros:
        rs = [r for r in rows if r["schedule"] == k and int(r["micro"]) == m]
        if not rs: continue
        g = lambda key: med([f(r[key]) for r in rs])
        a0, a1 = g("act0_mb"), g("act1_mb")
        if k == "gpipe": gp[m] = (a0, a1)
        ratio = "" if k == "gpipe" or m not in gp else \
            f"{a0 / gp[m][0]:.2f} / {a1 / gp[m][1]:.2f} (formula {min(S, m) / m:.2f} / {min(S - 1, m) / m:.2f})"
        sps = g("samples_s")
        mstep, pstep, ptxt = planned(rs)
        if pstep == pstep: errs.append(abs(pstep / mstep - 1))
        lines.append(f"| {k} | {m} | {(S - 1) / (m + S - 1):.3f} | {g('idle0'):.3f} | {g('idle1'):.3f} |"
                     f" {g('busy0_ms'):.0f} / {g('busy1_ms'):.0f} | {sps:.1f} | {sps / one:.2f}× |"
                     f" {a0:.1f} / {a1:.1f} | {ratio} | {ptxt} |")
names = {"one": "one worker", "dp2": "data parallel, 2 workers", "tp2": "tensor parallel, 2 workers"}
for ref in ("one", "dp2", "tp2"):
    rs = [r for r in rows if r["schedule"] == ref]
    mstep, pstep, ptxt = planned(rs)
    if pstep == pstep:
        errs.append(abs(pstep / mstep - 1))
        lines.append(f"| ({names[ref]}) | | | | | | {64 / mstep:.1f} | |"
                     f" | | {ptxt} |")
if errs:
    lines += ["", f"The plan's step against the measured: largest error {max(errs) * 100:.0f}%, median"
              f" {statistics.median(errs) * 100:.0f}% over {len(errs)} layouts (target: within 20%)."]
if first != "NA":
    dpn, ppn, tpn, mn, zn = (int(x) for x in first.split())
    meas = {("one", 0): one, ("dp2", 0): dp2, ("tp2", 0): tp2}
    for k in ("gpipe", "1f1b"):
        for m in micros:
            meas[(k, m)] = med([f(r["samples_s"]) for r in rows if r["schedule"] == k and int(r["micro"]) == m])
    best = max(meas, key=lambda key: meas[key])
    pick = ("tp2", 0) if tpn == 2 else ("dp2", 0) if ppn == 1 else ("1f1b", mn)
    got = meas.get(pick, float("nan"))
    lines += ["", f"`plan --layout auto` ranks first: dp {dpn} x pp {ppn} x tp {tpn}, {mn} micro-batch(es), ZeRO {zn}; measured"
              f" {got:.1f} samples/s against the fastest measured layout, {best[0]} M={best[1]}, {meas[best]:.1f}"
              f" ({(got / meas[best] - 1) * 100:+.0f}%; target: within 10%)."]
lines += ["", f"Raw rows: {tsv.split('/')[-1]}."]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
echo "wrote $OUTMD" >&2
