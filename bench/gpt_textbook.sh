#!/usr/bin/env bash
# The textbook model on this machine (issue 10, Targets): gpt:layers=16,heads=16,dim=1024,ctx=256
# (about 202M parameters), 10 AdamW steps, 2 data-parallel workers (threads), per step: time,
# tokens/s and bytes all-reduced; peak RSS of the run; beside them the textbook example's figures.
#
#   bench/gpt_textbook.sh                      # the 202M model, global batch 16, 10 steps
#   BATCH=32 bench/gpt_textbook.sh
#   MODEL=gpt:layers=1,heads=2,dim=32,ctx=16 STEPS=3 bench/gpt_textbook.sh   # a smoke test
#
# The run: ./build/dptrain train --model MODEL --data TOKENS --batch BATCH --optim adamw --lr 1e-3
# --workers WORKERS --threads 1 --epochs 1 --max-steps STEPS --timeline TL, under /usr/bin/time -v.
#   * time per step: from worker 0's --timeline events (docs: the compute track holds each step's
#     data, forward, backward, wait-for-all-reduce and optimizer phases, with args.step): step s
#     ends when its optimizer phase ends and takes the time since step s-1 ended (step 0: since
#     its data phase began).  tokens/s = global batch x ctx / that time.
#   * bytes all-reduced per step: the sum of the "bytes" of worker 0's all-reduce events (one per
#     gradient bucket, the bucket's fp32 gradient) that fall inside the step: the payload every
#     worker contributes, 4 x parameters.  What a worker sends for it depends on the algorithm;
#     a ring all-reduce sends 2 (P-1)/P x payload per worker, given beside it.
#   * peak RSS: /usr/bin/time -v "Maximum resident set size" of the whole process (every worker's
#     replica, gradients and AdamW state, the token file, the activations).
# The textbook example: 200M parameters, global batch 1600, 8 workers (200 per worker); its
# gradient is 4 x 200M = 800 MB of fp32 per step, and a ring all-reduce moves 2 (8-1)/8 x 800 MB
# = 1.4 GB through every worker per step.
#
# Environment knobs:
#   MODEL=gpt:layers=16,heads=16,dim=1024,ctx=256  STEPS=10  BATCH=16  WORKERS=2  LR=1e-3  SEED=1
#   TOKENS=(prepared into a temp dir)  DPTRAIN=./build/dptrain  PY=python3 (any: json only)
#   RESULTS=bench/results  EXTRA="..." (more dptrain train flags, e.g. --bucket-cap-mb 25)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

MODEL=${MODEL:-gpt:layers=16,heads=16,dim=1024,ctx=256}
STEPS=${STEPS:-10}
BATCH=${BATCH:-16}
WORKERS=${WORKERS:-2}
LR=${LR:-1e-3}
SEED=${SEED:-1}
TOKENS=${TOKENS:-}
EXTRA=${EXTRA:-}
DPTRAIN=${DPTRAIN:-./build/dptrain}
PY=${PY:-/usr/bin/python3}
RESULTS=${RESULTS:-bench/results}
TIME=/usr/bin/time

die() { echo "gpt_textbook: error: $*" >&2; exit 1; }
note() { echo "gpt_textbook: $*" >&2; }

[ -x "$TIME" ] || die "$TIME not found (Debian package 'time')"
[ -x "$DPTRAIN" ] || die "$DPTRAIN not found or not executable: build it first (make) or set DPTRAIN=PATH"
[[ $("$DPTRAIN" train --help 2>&1) == *--timeline* ]] || die "'$DPTRAIN train --help' lists no --timeline: is the binary current?"
"$PY" -c 'import json, statistics' 2>/dev/null || die "$PY cannot run (any python3 will do: PY=python3)"
[[ $MODEL == gpt:* ]] || die "MODEL must be gpt:layers=L,heads=H,dim=D,ctx=T"
CTX=$(sed -n 's/.*ctx=\([0-9]*\).*/\1/p' <<<"$MODEL")
[ -n "$CTX" ] || die "MODEL $MODEL has no ctx="
[ "$STEPS" -ge 1 ] || die "STEPS must be at least 1"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpt_textbook.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

bench_tokens

# shellcheck disable=SC2206
extra=($EXTRA)
CMD=(env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
     "$DPTRAIN" train --model "$MODEL" --data "$TOKENS" --batch "$BATCH" --optim adamw --lr "$LR" --seed "$SEED"
     --workers "$WORKERS" --threads 1 --epochs 1 --max-steps "$STEPS" --progress none
     --timeline "$WORK/timeline.json" "${extra[@]}")
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T_START=$(date +%s)
note "running: ${CMD[*]:4}"
rc=0
"$TIME" -v -o "$WORK/time.txt" "${CMD[@]}" >"$WORK/run.log" 2>&1 || rc=$?
cat "$WORK/run.log" >&2
[ "$rc" = 0 ] || die "dptrain failed (exit $rc)"
[ -s "$WORK/timeline.json" ] || die "no timeline written"
RSS_KB=$(sed -n 's/.*Maximum resident set size (kbytes): *\([0-9]*\).*/\1/p' "$WORK/time.txt" | tail -n 1)
WALL=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): *//p' "$WORK/time.txt" | tail -n 1)

bench_facts gpt_textbook
MEM_TOTAL=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
export WORK MODEL STEPS BATCH WORKERS LR CTX RSS_KB WALL LOAD0 LOAD1 T_START CPU_MODEL MEM_TOTAL NCPU GIT_REV
export DPTRAIN_BIN=$DPTRAIN EXTRA RAWOUT=${OUTMD%.md}.tsv
"$PY" - >"$OUTMD" <<'EOF'
import json, os, re, statistics, time

E = os.environ
log = open(os.path.join(E["WORK"], "run.log")).read()
m = re.search(r"^dptrain: model \S+ \((\d+) parameters, ([0-9.]+) MFLOP/sample forward\)", log, re.M)
nparams = int(m.group(1)) if m else None
mflop = float(m.group(2)) if m else None
thr = re.search(r"^throughput: ([0-9.]+) samples/s \(training steps after the 5th, (\d+) steps\)", log, re.M)

ev = json.load(open(os.path.join(E["WORK"], "timeline.json")))["traceEvents"]
# worker 0: compute track tid 0, all-reduce track tid 1 (src/train/timeline.c)
comp = [e for e in ev if e.get("ph") == "X" and e.get("tid") == 0]
comm = [e for e in ev if e.get("ph") == "X" and e.get("tid") == 1]
steps = {}
for e in comp:
    s = e["args"]["step"]
    a, b = e["ts"], e["ts"] + e["dur"]
    lo, hi = steps.get(s, (a, b))
    steps[s] = (min(lo, a), max(hi, b))
order = sorted(steps)
B, T, P = int(E["BATCH"]), int(E["CTX"]), int(E["WORKERS"])
rows = []
prev_end = None
for s in order:
    lo, hi = steps[s]
    dt = (hi - (prev_end if prev_end is not None else lo)) / 1e6
    # the buckets all-reduced during this step (between its first phase's start and its end)
    nbytes = sum(e["args"].get("bytes", 0) for e in comm if lo <= e["ts"] and e["ts"] + e["dur"] <= hi)
    nb = sum(1 for e in comm if lo <= e["ts"] and e["ts"] + e["dur"] <= hi)
    rows.append((s, dt, B * T / dt if dt > 0 else float("nan"), nbytes, nb))
    prev_end = hi

def mib(x):
    return x / 2**20

out = []
p = out.append
p("# The textbook model on this machine: dptrain, gpt, 2 workers, AdamW")
p("")
p(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, wall {time.time() - int(E['T_START']):.0f}s; "
  f"dptrain `{E['DPTRAIN_BIN']}` at git `{E['GIT_REV']}`")
p(f"- machine: **{E['CPU_MODEL']}**, {E['NCPU']} CPUs, {E['MEM_TOTAL']} of memory; load average at start "
  f"{E['LOAD0']}, at end {E['LOAD1']}")
p(f"- model `{E['MODEL']}`: {nparams if nparams is not None else '?'} parameters"
  + (f" ({nparams / 1e6:.1f}M), {mflop:.1f} MFLOP forward per window of {T} tokens" if nparams else ""))
p(f"- run: global batch {B} windows ({B // P} per worker, {B * T} tokens per step), AdamW lr {E['LR']}, "
  f"{P} workers (threads) x 1 thread, {E['STEPS']} steps, fp32" + (f"; extra flags `{E['EXTRA']}`" if E["EXTRA"].strip() else ""))
p(f"- whole process: wall {E['WALL']} (start-up, weights and data included), "
  f"**peak RSS {int(E['RSS_KB']) / 2**20:.2f} GiB** (/usr/bin/time -v)" if E["RSS_KB"] else "- peak RSS: n/a")
p("")
p(f"## Per step (worker 0's --timeline) -- {E['CPU_MODEL']}")
p("")
p("time: from the end of the previous step to the end of this step's optimizer phase (step 0: from "
  "its data phase); bytes all-reduced: the fp32 gradient payload of the buckets reduced in the step "
  f"(what each worker contributes); a ring all-reduce sends 2(P-1)/P = {2 * (P - 1) / P:g} x that per worker.")
p("")
p("| step | time (s) | tokens/s | buckets | bytes all-reduced | MiB | ring: MiB sent per worker |")
p("|---:|---:|---:|---:|---:|---:|---:|")
for s, dt, tps, nbytes, nb in rows:
    p(f"| {s} | {dt:.3f} | {tps:.0f} | {nb} | {nbytes} | {mib(nbytes):.1f} | {mib(2 * (P - 1) / P * nbytes):.1f} |")
steady = rows[1:] if len(rows) > 1 else rows
if steady:
    mt = statistics.median(r[1] for r in steady)
    p(f"| median, steps 1.. | {mt:.3f} | {B * T / mt:.0f} | | | | |")
p("")
if thr:
    p(f"dptrain's own `throughput:` line (steps after the 5th, {thr.group(2)} steps): "
      f"{float(thr.group(1)) * T:.0f} tokens/s.")
    p("")
TB_PARAMS, TB_BATCH, TB_P = 200e6, 1600, 8
grad = 4 * TB_PARAMS
p("## Beside the textbook example")
p("")
p("| | this run | textbook example |")
p("|---|---:|---:|")
p(f"| parameters | {f'{nparams / 1e6:.1f}M' if nparams else '?'} | 200M |")
p(f"| global batch (sequences) | {B} | {TB_BATCH} |")
p(f"| workers | {P} | {TB_P} |")
p(f"| per-worker batch | {B // P} | {TB_BATCH // TB_P} |")
pay = statistics.median(r[3] for r in rows) if rows else 0
p(f"| gradient per step (fp32 payload, 4 x parameters) | {mib(pay):.1f} MiB ({pay / 1e6:.1f} MB) | "
  f"{grad / 2**20:.1f} MiB ({grad / 1e6:.0f} MB) |")
p(f"| ring all-reduce, bytes sent per worker per step, 2(P-1)/P x payload | "
  f"{mib(2 * (P - 1) / P * pay):.1f} MiB ({2 * (P - 1) / P * pay / 1e6:.1f} MB) | "
  f"{2 * (TB_P - 1) / TB_P * grad / 2**20:.1f} MiB ({2 * (TB_P - 1) / TB_P * grad / 1e6:.0f} MB) |")
if nparams and pay:
    p("")
    p(f"Bytes all-reduced per step / (4 x parameters) = {pay / (4 * nparams):.4f}: every gradient is reduced "
      "once per step (the tied embedding once, with both its contributions).")
p("")
print("\n".join(out))
with open(E["RAWOUT"], "w") as f:
    f.write("step\ttime_s\ttokens_per_s\tbuckets\tbytes_allreduced\n")
    for s, dt, tps, nbytes, nb in rows:
        f.write(f"{s}\t{dt:.6f}\t{tps:.1f}\t{nb}\t{nbytes}\n")
    f.write(f"# peak_rss_kb\t{E['RSS_KB']}\n")
EOF
cat "$OUTMD"
note "report written to $OUTMD (raw figures in ${OUTMD%.md}.tsv)"
