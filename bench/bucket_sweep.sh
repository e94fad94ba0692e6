#!/usr/bin/env bash
# Gradient bucket size and overlap: how much of dptrain's all-reduce hides behind backward.
#
#   bench/bucket_sweep.sh                        # REPS=3, cnn + resnet
#   REPS=5 MODELS=cnn bench/bucket_sweep.sh
#   CAPS="0.25 0.5 1 25" bench/bucket_sweep.sh   # finer buckets
#
# For each model, REPS repetitions of these configurations, interleaved within a
# repetition (the order rotates from one repetition to the next), all with
# --workers 2 --threads 1, global batch 128, SGD lr 0.05 momentum 0.9, one whole epoch
# on a subset (cnn: --train-limit 6400, resnet: --train-limit 2560; --test-limit 500):
#
#   cap C       --bucket-cap-mb C --first-bucket-mb 1      for C in CAPS (1 5 25 100)
#   no-overlap  --bucket-cap-mb 25 --first-bucket-mb 1 --no-overlap   (all-reduce after backward)
#
# From each run: worker 0's total communication time (first bucket's start to the last
# one's completion, summed over the steps) and the exposed part (the wait after backward),
# both from metrics.jsonl (`comm_s`, `comm_exposed_s`; the epoch line's `comm X exposed Y`
# if it is missing), and the global samples/s of the steps after the 5th (`throughput:`).
# The report gives medians over the repetitions of: total, exposed, exposed/total (per
# run), samples/s, and samples/s relative to no-overlap.  Target: exposed <= 25% of total
# at the default (cap 25, first bucket 1).
#
# The number of buckets per step of each configuration comes from one extra tiny run
# with --timeline (one step; BUCKETS=0 skips it).  Note: cnn has 1.61 MiB of gradients and
# resnet 1.18 MiB, so every cap >= 1.61 MiB gives the same plan (a 1 MiB first bucket and
# the rest); caps below 1 MiB split further.
#
# Environment knobs:
#   REPS=3  MODELS="cnn resnet"  CAPS="1 5 25 100"  FIRST_MB=1  NO_OVERLAP=1  BUCKETS=1
#   LIMIT_CNN=6400  LIMIT_RESNET=2560  TEST_LIMIT=500  EPOCHS=1  SEED=1  WORKERS=2
#   DPTRAIN=./build/dptrain  RESULTS=bench/results  PY=/usr/bin/python3 (for the report; any python3 works)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

REPS=${REPS:-3}
MODELS=${MODELS:-"cnn resnet"}
CAPS=${CAPS:-"1 5 25 100"}
FIRST_MB=${FIRST_MB:-1}
NO_OVERLAP=${NO_OVERLAP:-1}
BUCKETS=${BUCKETS:-1}
LIMIT_CNN=${LIMIT_CNN:-6400}
LIMIT_RESNET=${LIMIT_RESNET:-2560}
LIMIT_MLP=${LIMIT_MLP:-12800}
TEST_LIMIT=${TEST_LIMIT:-500}
EPOCHS=${EPOCHS:-1}
SEED=${SEED:-1}
WORKERS=${WORKERS:-2}
DPTRAIN=${DPTRAIN:-./build/dptrain}
RESULTS=${RESULTS:-bench/results}
PY=${PY:-/usr/bin/python3}

die() { echo "bucket_sweep: error: $*" >&2; exit 1; }
note() { echo "bucket_sweep: $*" >&2; }

[ -x "$DPTRAIN" ] || die "$DPTRAIN not found or not executable: build it first (make) or set DPTRAIN=PATH"
[[ $("$DPTRAIN" train --help 2>&1) == *--bucket-cap-mb* ]] || die "'$DPTRAIN train --help' does not list --bucket-cap-mb: is the binary current?"
command -v "$PY" >/dev/null 2>&1 || PY=python3

limit_for() {
    case $1 in
    cnn) echo "$LIMIT_CNN" ;; resnet) echo "$LIMIT_RESNET" ;; mlp) echo "$LIMIT_MLP" ;;
    *) die "unknown model $1 (cnn, resnet, mlp)" ;;
    esac
}

CONFIGS=()
for c in $CAPS; do CONFIGS+=("cap$c"); done
[ "$NO_OVERLAP" = 1 ] && CONFIGS+=("nooverlap")
[ ${#CONFIGS[@]} -gt 0 ] || die "no configurations (CAPS empty and NO_OVERLAP=0)"

# Flags of one configuration, into the array CFG.
config_flags() {
    case $1 in
    nooverlap) CFG=(--bucket-cap-mb 25 --first-bucket-mb "$FIRST_MB" --no-overlap) ;;
    cap*) CFG=(--bucket-cap-mb "${1#cap}" --first-bucket-mb "$FIRST_MB") ;;
    esac
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/bucket_sweep.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
RAW=$WORK/raw.tsv        # model config rep comm_s exposed_s samples_per_s
NBRAW=$WORK/buckets.tsv  # model config buckets_per_step
: >"$RAW"
: >"$NBRAW"
PIN=(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1)

num() { [ -n "$1" ] && awk -v x="$1" 'BEGIN { exit !(x == x + 0) }'; }

run_one() {
    local model=$1 config=$2 rep=$3
    local log=$WORK/$model-$config-r$rep.log out=$WORK/$model-$config-r$rep.out
    config_flags "$config"
    local rc=0
    env "${PIN[@]}" "$DPTRAIN" train --model "$model" --workers "$WORKERS" --threads 1 --batch 128 --lr 0.05 \
        --momentum 0.9 --seed "$SEED" --epochs "$EPOCHS" --train-limit "$(limit_for "$model")" \
        --test-limit "$TEST_LIMIT" "${CFG[@]}" --progress none --out "$out" >"$log" 2>&1 || rc=$?
    local comm="" exp="" sps=""
    # metrics.jsonl: sum comm_s and comm_exposed_s over the epoch records (3 decimals)
    if [ -f "$out/metrics.jsonl" ]; then
        read -r comm exp < <(awk '
            /"kind": *"epoch"/ {
                if (match($0, /"comm_s": *[0-9.eE+-]+/)) { s = substr($0, RSTART, RLENGTH); sub(/.*: */, "", s); c += s; nc++ }
                if (match($0, /"comm_exposed_s": *[0-9.eE+-]+/)) { s = substr($0, RSTART, RLENGTH); sub(/.*: */, "", s); e += s; ne++ }
            }
            END { if (nc && ne) print c, e }' "$out/metrics.jsonl") || true
    fi
    # fallback: the epoch lines' "comm X exposed Y" (2 decimals)
    if ! num "$comm" || ! num "$exp"; then
        read -r comm exp < <(sed -n 's/^epoch [0-9]*\/[0-9]* .*[ (]comm \([0-9.]*\) exposed \([0-9.]*\).*/\1 \2/p' "$log" |
            awk '{ c += $1; e += $2; n++ } END { if (n) print c, e }') || true
    fi
    sps=$(dptrain_sps "$log")
    num "$sps" || sps=$(sed -n 's/^epoch .* \([0-9][0-9.eE+-]*\) samples\/s.*/\1/p' "$log" | tail -n 1)
    num "$comm" || comm=NA
    num "$exp" || exp=NA
    num "$sps" || sps=NA
    if [ "$rc" != 0 ] || [ "$comm" = NA ] || [ "$sps" = NA ]; then
        note "$model $config rep=$rep: missing figures (exit $rc); last lines of its output:"
        tail -n 5 "$log" | sed 's/^/    /' >&2
    fi
    rm -rf "$out"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$model" "$config" "$rep" "$comm" "$exp" "$sps" >>"$RAW"
    printf '  %-6s %-10s rep %s: comm %s s, exposed %s s, %s samples/s\n' "$model" "$config" "$rep" "$comm" "$exp" "$sps" >&2
}

# Buckets per step: the distinct "bucket": N of one step's timeline.
count_buckets() {
    local model=$1 config=$2
    local tl=$WORK/tl-$model-$config.json nb=NA
    config_flags "$config"
    if env "${PIN[@]}" "$DPTRAIN" train --model "$model" --workers "$WORKERS" --threads 1 --batch 128 --seed "$SEED" \
        --epochs 1 --max-steps 1 --train-limit 256 --test-limit 100 "${CFG[@]}" --progress none \
        --timeline "$tl" >"$tl.log" 2>&1 && [ -f "$tl" ]; then
        nb=$(grep -o '"bucket": *[0-9]*' "$tl" | sed 's/.*: *//' | sort -un | wc -l)
        [ "$nb" -gt 0 ] || nb=NA
    fi
    rm -f "$tl"
    printf '%s\t%s\t%s\n' "$model" "$config" "$nb" >>"$NBRAW"
}

NC=${#CONFIGS[@]}
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T_START=$(date +%s)
note "models: $MODELS; configurations: ${CONFIGS[*]}; $REPS repetition(s); P=$WORKERS"
if [ "$BUCKETS" = 1 ]; then
    for model in $MODELS; do for config in "${CONFIGS[@]}"; do count_buckets "$model" "$config"; done; done
fi
for rep in $(seq 1 "$REPS"); do
    note "repetition $rep/$REPS"
    for model in $MODELS; do
        for k in $(seq 0 $((NC - 1))); do
            run_one "$model" "${CONFIGS[$(((k + rep - 1) % NC))]}" "$rep"
        done
    done
done

# ---- report -----------------------------------------------------------------------
mkdir -p "$RESULTS"
STAMP=$(date +%Y-%m-%d-%H%M%S)
OUTMD=$RESULTS/bucket-sweep-$STAMP.md
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
NCPU=$(nproc)
GIT_REV=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)
DPTRAIN_BIN=$DPTRAIN
export RAW NBRAW REPS LOAD0 LOAD1 T_START CPU_MODEL NCPU GIT_REV DPTRAIN_BIN FIRST_MB
export LIMIT_CNN LIMIT_RESNET LIMIT_MLP TEST_LIMIT EPOCHS SEED WORKERS
"$PY" - >"$OUTMD" <<'EOF'
import os, statistics, time

E = os.environ
rows = [l.rstrip("\n").split("\t") for l in open(E["RAW"]) if l.strip()]
nb = {(m, c): n for m, c, n in (l.rstrip("\n").split("\t") for l in open(E["NBRAW"]) if l.strip())}
models, configs = [], []
runs = {}  # (model, config) -> {rep: (comm, exposed, sps)}
for m, c, rep, comm, exp, sps in rows:
    if m not in models:
        models.append(m)
    if c not in configs:
        configs.append(c)
    f = lambda x: None if x == "NA" else float(x)
    runs.setdefault((m, c), {})[int(rep)] = (f(comm), f(exp), f(sps))

def key(c):
    return (1, 0.0) if c == "nooverlap" else (0, float(c[3:]))
configs.sort(key=key)

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def fmt(x, f="{:.3f}"):
    return f.format(x) if x is not None else "n/a"

limits = {"cnn": E["LIMIT_CNN"], "resnet": E["LIMIT_RESNET"], "mlp": E["LIMIT_MLP"]}
first = E["FIRST_MB"]
out = []
p = out.append
p("# Gradient buckets and overlap: dptrain all-reduce hidden behind backward")
p("")
p(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, wall {time.time() - int(E['T_START']):.0f}s; "
  f"dptrain `{E['DPTRAIN_BIN']}` at git `{E['GIT_REV']}`")
p(f"- machine: {E['CPU_MODEL']}, {E['NCPU']} CPUs; load average at start {E['LOAD0']}, at end {E['LOAD1']}")
p(f"- recipe: --workers {E['WORKERS']} --threads 1, global batch 128, SGD lr 0.05 momentum 0.9, seed {E['SEED']}, "
  f"{E['EPOCHS']} epoch(s) on the first N training samples ("
  + ", ".join(f"{m} {limits.get(m, '?')}" for m in models) + f"), test limit {E['TEST_LIMIT']}")
p(f"- {E['REPS']} repetition(s), configurations interleaved; figures are medians over the repetitions "
  "(exposed/total: median of the per-run ratios, min..max in brackets)")
p("- comm: worker 0's all-reduce time (first bucket's start to the last one's completion), summed over the "
  "steps; exposed: the wait after backward; samples/s: global, steps after the 5th")
p("")
for m in models:
    p(f"## {m}")
    p("")
    p("| configuration | buckets/step | comm total (s) | exposed (s) | exposed / total | exposed / no-overlap comm "
      "| samples/s | vs no-overlap |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|")
    base = runs.get((m, "nooverlap"), {})
    for c in configs:
        r = runs.get((m, c))
        if not r:
            continue
        name = ("--no-overlap (cap 25)" if c == "nooverlap" else f"cap {c[3:]} MiB") + f", first {first}"
        if c == "cap25":
            name += " (default)"
        fr = [e / t for t, e, _ in r.values() if t is not None and e is not None and t > 0]
        frs = f"{100 * med(fr):.0f}% [{100 * min(fr):.0f}..{100 * max(fr):.0f}]" if fr else "n/a"
        if c == "cap25" and fr:
            frs += " ok" if med(fr) <= 0.25 else " **above 25% target**"
        xn = [e / base[k][0] for k, (_, e, _) in r.items() if e is not None and k in base and base[k][0]]
        xns = f"{100 * med(xn):.0f}%" if xn and c != "nooverlap" else ("100%" if c == "nooverlap" and xn else "n/a")
        sp = [s / base[k][2] for k, (_, _, s) in r.items() if s is not None and k in base and base[k][2]]
        sps = f"{med(sp):.2f}x" if sp and c != "nooverlap" else ("1.00x" if c == "nooverlap" else "n/a")
        p(f"| {name} | {nb.get((m, c), 'n/a')} | {fmt(med([x[0] for x in r.values()]))} | "
          f"{fmt(med([x[1] for x in r.values()]))} | {frs} | {xns} | {fmt(med([x[2] for x in r.values()]), '{:.0f}')} | {sps} |")
    p("")
p("Target: exposed <= 25% of the total communication time at the default (cap 25 MiB, first bucket 1 MiB).")
p("")
p("`comm total` runs from the first bucket's start to the last one's completion: with overlap it also counts "
  "the time a started bucket waits for the other worker to reach the same point of its backward, so it is larger "
  "than the transfer itself. `--no-overlap` reduces after backward, closer to the bare cost (any imbalance "
  "between the workers still included). `exposed / no-overlap comm` (per repetition, the exposed time over the "
  "no-overlap run's communication time) is the share of that cost still on the critical path.")
p("")
print("\n".join(out))
EOF
cat "$OUTMD"
RAWOUT=${OUTMD%.md}.tsv
{ printf 'model\tconfig\trep\tcomm_s\texposed_s\tsamples_per_s\n'; cat "$RAW"; } >"$RAWOUT"
note "report written to $OUTMD (raw figures in $RAWOUT)"
