#!/usr/bin/env bash
# Training throughput and peak memory: dptrain vs PyTorch 1.13, side by side in one run.
#
#   bench/train_vs_pytorch.sh                 # from the repository root (or anywhere)
#   REPS=5 bench/train_vs_pytorch.sh          # more repetitions
#
# For model in mlp cnn and threads in 1 2, REPS repetitions of four variants,
# interleaved within each repetition (the order rotates from one repetition to
# the next) so that the noise of a shared machine hits all of them alike:
#
#   dptrain    ./build/dptrain train --model M --workers 1 --threads T --batch 128 --lr 0.05
#              --momentum 0.9 --epochs 1 --max-steps S --progress none
#   installed  PyTorch as installed: Debian's OpenBLAS held to its Haswell (AVX2)
#              kernels by OPENBLAS_CORETYPE=Haswell in the environment
#   avx512     the same with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for that
#              command alone (OpenBLAS picks its AVX-512 kernels)
#   tuned      avx512 plus OMP_WAIT_POLICY=PASSIVE and glibc malloc on huge pages
#              (GLIBC_TUNABLES=glibc.malloc.hugetlb=1)
#
# Every variant runs the same recipe for the same number of steps S with its thread
# pools pinned to T (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS; PyTorch
# also torch.set_num_threads(T)).  Throughput is samples/s over the training steps
# after the 5th (no evaluation, no data loading).  The report gives medians over
# the repetitions, the medians of the per-repetition ratios dptrain / PyTorch, and
# model FLOP utilisation (MFU = samples/s x training FLOPs per sample / (P x T), P the fp32
# peak per core that dptrain measures at start and prints in its throughput line).  Then one peak-memory comparison (cnn, 1 thread, /usr/bin/time -v).
#
# Environment knobs:
#   REPS=3  STEPS_MLP=300  STEPS_CNN=150  MODELS="mlp cnn"  THREADS="1 2"
#   VARIANTS="dptrain installed avx512 tuned"   MEM=1 (0: skip the memory runs)
#   DPTRAIN=./build/dptrain   PY=/usr/bin/python3   RESULTS=bench/results
#   SKIP_DPTRAIN=1            run only the PyTorch half (dptrain columns become n/a)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

REPS=${REPS:-3}
STEPS_MLP=${STEPS_MLP:-300}
STEPS_CNN=${STEPS_CNN:-150}
MODELS=${MODELS:-"mlp cnn"}
THREADS=${THREADS:-"1 2"}
MEM=${MEM:-1}
DPTRAIN=${DPTRAIN:-./build/dptrain}
PY=${PY:-/usr/bin/python3}
RESULTS=${RESULTS:-bench/results}
SKIP_DPTRAIN=${SKIP_DPTRAIN:-0}
VARIANTS=${VARIANTS:-"dptrain installed avx512 tuned"}
TIME=/usr/bin/time

die() { echo "train_vs_pytorch: error: $*" >&2; exit 1; }
note() { echo "train_vs_pytorch: $*" >&2; }

# ---- preconditions ----------------------------------------------------------------
[ -x "$TIME" ] || die "$TIME not found (Debian package 'time')"
"$PY" -c 'import torch, numpy' 2>/dev/null ||
    die "$PY cannot import torch and numpy (install python3-torch python3-numpy; the pyenv python3 on PATH has no torch)"
if [ "$SKIP_DPTRAIN" = 1 ]; then
    VARIANTS=$(echo "$VARIANTS" | tr ' ' '\n' | grep -vx dptrain | tr '\n' ' ' || true)
    note "SKIP_DPTRAIN=1: running the PyTorch half only"
else
    [ -x "$DPTRAIN" ] || die "$DPTRAIN not found or not executable: build it first (make), set DPTRAIN=PATH, or SKIP_DPTRAIN=1 for the PyTorch half only"
    "$DPTRAIN" train --help >/dev/null 2>&1 || die "'$DPTRAIN train --help' fails: is the binary working?"
fi
[ -n "${VARIANTS// /}" ] || die "no variants to run"

steps_for() { case $1 in mlp) echo "$STEPS_MLP" ;; cnn) echo "$STEPS_CNN" ;; *) die "unknown model $1" ;; esac; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/train_vs_pytorch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
RAW=$WORK/raw.tsv   # variant model threads rep samples_per_s cpu_cores maxrss_kb
: >"$RAW"

# The command line of one variant, into the array CMD.
build_cmd() {
    local variant=$1 model=$2 threads=$3 steps=$4
    local pin=(OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads")
    local pyargs=("$PY" bench/pytorch_train.py --model "$model" --threads "$threads" --batch 128 --lr 0.05
                  --momentum 0.9 --epochs 1 --max-steps "$steps" --no-eval)
    case $variant in
    dptrain) CMD=(env "${pin[@]}" "$DPTRAIN" train --model "$model" --workers 1 --threads "$threads" --batch 128 --lr 0.05
                  --momentum 0.9 --epochs 1 --max-steps "$steps" --progress none) ;;
    installed) CMD=(env "${pin[@]}" "${pyargs[@]}") ;;
    avx512) CMD=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "${pin[@]}" "${pyargs[@]}") ;;
    tuned) CMD=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "${pin[@]}" OMP_WAIT_POLICY=PASSIVE
                GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1" "${pyargs[@]}") ;;
    *) die "unknown variant $variant" ;;
    esac
}

# samples/s from a log; empty if none found.
parse_sps() {
    local variant=$1 log=$2 v=""
    if [ "$variant" = dptrain ]; then
        # preferred: "throughput: N samples/s ..." (steps after the 5th)
        v=$(dptrain_sps "$log")
        # else "done: ..., N samples/s (last epoch), ..." (0 when no epoch finished)
        [ -n "$v" ] || v=$(sed -n 's/^done:.* \([0-9][0-9.eE+-]*\) samples\/s.*/\1/p' "$log" | tail -n 1)
        # else the last "epoch k/E ... N samples/s" line
        [ -n "$v" ] && awk -v x="$v" 'BEGIN { exit !(x + 0 > 0) }' || v=""
        [ -n "$v" ] || v=$(sed -n 's/^epoch .* \([0-9][0-9.eE+-]*\) samples\/s.*/\1/p' "$log" | tail -n 1)
    else
        v=$(sed -n 's/^RESULT .*samples_per_s=\([0-9][0-9.eE+-]*\).*/\1/p' "$log" | tail -n 1)
    fi
    if [ -n "$v" ] && awk -v x="$v" 'BEGIN { exit !(x + 0 > 0) }'; then echo "$v"; fi
}

run_one() {
    local variant=$1 model=$2 threads=$3 rep=$4 steps
    steps=$(steps_for "$model")
    local log=$WORK/$variant-$model-t$threads-r$rep.log
    build_cmd "$variant" "$model" "$threads" "$steps"
    local rc=0
    "$TIME" -f '%e %U %S %M' -o "$log.time" "${CMD[@]}" >"$log" 2>&1 || rc=$?
    local sps cpu rss
    sps=$(parse_sps "$variant" "$log")
    read -r _ _ _ rss <"$log.time" 2>/dev/null || true
    rss=${rss:-NA}
    cpu=$(cpu_busy "$log.time")
    if [ "$rc" != 0 ] || [ -z "$sps" ]; then
        note "$variant $model threads=$threads rep=$rep: no throughput (exit $rc); last lines of its output:"
        tail -n 5 "$log" | sed 's/^/    /' >&2
        sps=NA
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$variant" "$model" "$threads" "$rep" "$sps" "$cpu" "$rss" >>"$RAW"
    printf '  %-9s %-3s T=%s rep %s: %s samples/s (%s cores busy, max RSS %s KiB)\n' \
        "$variant" "$model" "$threads" "$rep" "$sps" "$cpu" "$rss" >&2
}

# ---- throughput -------------------------------------------------------------------
read -r -a VARR <<<"$VARIANTS"
NV=${#VARR[@]}
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T_START=$(date +%s)
note "variants: ${VARR[*]}; models: $MODELS; threads: $THREADS; $REPS repetitions; steps mlp $STEPS_MLP, cnn $STEPS_CNN"
for rep in $(seq 1 "$REPS"); do
    note "repetition $rep/$REPS"
    for model in $MODELS; do
        for threads in $THREADS; do
            for k in $(seq 0 $((NV - 1))); do
                run_one "${VARR[$(((k + rep - 1) % NV))]}" "$model" "$threads" "$rep"
            done
        done
    done
done

# ---- peak memory: cnn, 1 thread ---------------------------------------------------
MEMRAW=$WORK/mem.tsv   # label maxrss_kb
: >"$MEMRAW"
if [ "$MEM" = 1 ]; then
    note "peak memory: cnn, 1 thread, $STEPS_CNN steps"
    for variant in "${VARR[@]}"; do
        [ "$variant" = avx512 ] && continue   # same allocations as 'installed'
        build_cmd "$variant" cnn 1 "$STEPS_CNN"
        log=$WORK/mem-$variant.log
        "$TIME" -v -o "$log.time" "${CMD[@]}" >"$log" 2>&1 || note "memory run $variant failed (see its output below)"
        kb=$(sed -n 's/.*Maximum resident set size (kbytes): *\([0-9]*\).*/\1/p' "$log.time" | tail -n 1)
        printf '%s\t%s\n' "$variant" "${kb:-NA}" >>"$MEMRAW"
        note "  $variant: max RSS ${kb:-NA} KiB"
        [ -n "$kb" ] || tail -n 5 "$log" | sed 's/^/    /' >&2
    done
    # What the interpreter and torch cost before any training (part of PyTorch's figure).
    log=$WORK/mem-import.log
    "$TIME" -v -o "$log.time" env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$PY" -c 'import numpy, torch' >"$log" 2>&1 || true
    kb=$(sed -n 's/.*Maximum resident set size (kbytes): *\([0-9]*\).*/\1/p' "$log.time" | tail -n 1)
    printf '%s\t%s\n' import-only "${kb:-NA}" >>"$MEMRAW"
fi

# ---- report -----------------------------------------------------------------------
bench_facts train_vs_pytorch
# The per-core peak dptrain measured (its "MFU ... of T x P GFLOP/s (measured, ISA)" line), median
# over its runs: the same figure its own MFU uses, measured on this machine in this run.
PEAK_GFLOPS=$(cat "$WORK"/dptrain-*.log 2>/dev/null | sed -n 's/.* x \([0-9.]*\) GFLOP\/s (measured.*/\1/p' | sort -n |
    awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')
export PEAK_GFLOPS
export RAW MEMRAW REPS STEPS_MLP STEPS_CNN LOAD0 T_START
TORCH_VER=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo unknown)
DPTRAIN_BIN=$DPTRAIN
export LOAD1 CPU_MODEL NCPU GIT_REV TORCH_VER DPTRAIN_BIN
"$PY" - >"$OUTMD" <<'EOF'
import os, statistics, time

# Training FLOPs per sample = 3 x forward multiply-add FLOPs (forward + two GEMMs in backward).
FWD = {"mlp": 2 * (784 * 512 + 512 * 512 + 512 * 10),
       "cnn": 2 * (28 * 28 * 32 * 9 + 14 * 14 * 64 * 32 * 9 + 3136 * 128 + 128 * 10)}
PEAK = float(os.environ.get("PEAK_GFLOPS") or 0) * 1e9  # fp32 FLOP/s per core, measured by dptrain
NAMES = {"dptrain": "dptrain", "installed": "PyTorch as installed (AVX2 OpenBLAS)",
         "avx512": "PyTorch AVX-512", "tuned": "PyTorch tuned"}
PT = ["installed", "avx512", "tuned"]

rows = [l.rstrip("\n").split("\t") for l in open(os.environ["RAW"]) if l.strip()]
data = {}  # (variant, model, threads) -> {rep: sps}
cpu = {}
for variant, model, threads, rep, sps, c, rss in rows:
    key = (variant, model, int(threads))
    if sps != "NA":
        data.setdefault(key, {})[int(rep)] = float(sps)
    if c != "NA":
        cpu.setdefault(key, []).append(float(c))
present = {r[0] for r in rows}
variants = [v for v in ["dptrain"] + PT if v in present]
cases = []
for r in rows:
    c = (r[1], int(r[2]))
    if c not in cases:
        cases.append(c)

def med(xs):
    return statistics.median(xs) if xs else None

def fmt(x, f="{:.0f}"):
    return f.format(x) if x is not None else "n/a"

out = []
p = out.append
p(f"# Training throughput: dptrain vs PyTorch {os.environ['TORCH_VER']}")
p("")
p(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, wall {time.time() - int(os.environ['T_START']):.0f}s; "
  f"dptrain `{os.environ['DPTRAIN_BIN']}` at git `{os.environ['GIT_REV']}`")
p(f"- machine: {os.environ['CPU_MODEL']}, {os.environ['NCPU']} CPUs; load average at start "
  f"{os.environ['LOAD0']}, at end {os.environ['LOAD1']}")
p(f"- recipe: batch 128, SGD lr 0.05 momentum 0.9, fp32; {os.environ['STEPS_MLP']} steps (mlp), "
  f"{os.environ['STEPS_CNN']} steps (cnn); samples/s over the steps after the 5th, no evaluation")
p(f"- {os.environ['REPS']} repetitions, variants interleaved; figures are medians over the repetitions; "
  "ratios are medians of the per-repetition ratios (min..max in brackets)")
p("")
p("## Samples/s (median)")
p("")
p("| model | threads | " + " | ".join(NAMES[v] for v in variants) + " |")
p("|---|---:|" + "---:|" * len(variants))
for m, t in cases:
    p(f"| {m} | {t} | " + " | ".join(fmt(med(list(data.get((v, m, t), {}).values()))) for v in variants) + " |")
p("")
if "dptrain" in variants:
    pts = [v for v in PT if v in variants]
    p("## dptrain / PyTorch (median of per-repetition ratios; > 1 means dptrain is faster)")
    p("")
    p("| model | threads | " + " | ".join(f"vs {NAMES[v]}" for v in pts) + " |")
    p("|---|---:|" + "---:|" * len(pts))
    for m, t in cases:
        cells = []
        d = data.get(("dptrain", m, t), {})
        for v in pts:
            o = data.get((v, m, t), {})
            rs = [d[r] / o[r] for r in d if r in o and o[r] > 0]
            cells.append(f"{med(rs):.2f}x [{min(rs):.2f}..{max(rs):.2f}]" if rs else "n/a")
        p(f"| {m} | {t} | " + " | ".join(cells) + " |")
    p("")
p(f"## Model FLOP utilisation (median samples/s x 3 x forward FLOPs / ({PEAK / 1e9:.0f} GFLOP/s x threads))")
p("")
p("The peak per core is the one dptrain measured at start in this run (an FMA loop on the CPU's widest ISA)."
  if PEAK > 0 else "No peak was measured in this run (no dptrain log with an MFU line): MFU is not given.")
p("")
p("| model | threads | train MFLOP/sample | " + " | ".join(NAMES[v] for v in variants) + " |")
p("|---|---:|---:|" + "---:|" * len(variants))
for m, t in cases:
    fl = 3 * FWD[m]
    cells = []
    for v in variants:
        s = med(list(data.get((v, m, t), {}).values()))
        cells.append(f"{100 * s * fl / (PEAK * t):.1f}%" if s is not None and PEAK > 0 else "n/a")
    p(f"| {m} | {t} | {fl / 1e6:.2f} | " + " | ".join(cells) + " |")
p("")
p("## CPU cores busy per run (median of (user+sys)/wall over the whole process, load included)")
p("")
p("| model | threads | " + " | ".join(NAMES[v] for v in variants) + " |")
p("|---|---:|" + "---:|" * len(variants))
for m, t in cases:
    p(f"| {m} | {t} | " + " | ".join(fmt(med(cpu.get((v, m, t), [])), "{:.2f}") for v in variants) + " |")
p("")
mem = [l.rstrip("\n").split("\t") for l in open(os.environ["MEMRAW"]) if l.strip()]
if mem:
    p(f"## Peak resident memory, cnn training, 1 thread, {os.environ['STEPS_CNN']} steps (/usr/bin/time -v)")
    p("")
    p("| run | max RSS (MiB) |")
    p("|---|---:|")
    memd = dict(mem)
    for label, kb in mem:
        name = {"import-only": "PyTorch: `import numpy, torch` alone (no data, no model)"}.get(label, NAMES.get(label, label))
        p(f"| {name} | {int(kb) / 1024:.0f} |" if kb != "NA" else f"| {name} | n/a |")
    if memd.get("dptrain", "NA") != "NA" and memd.get("installed", "NA") != "NA":
        p("")
        p(f"PyTorch (as installed) / dptrain peak RSS: {int(memd['installed']) / int(memd['dptrain']):.2f}x. "
          "Both hold the normalised fp32 training and test sets (about 219 MiB).")
    p("")
print("\n".join(out))
EOF
cat "$OUTMD"
RAWOUT=${OUTMD%.md}.tsv
{ printf 'variant\tmodel\tthreads\trep\tsamples_per_s\tcpu_cores\tmaxrss_kb\n'; cat "$RAW"; } >"$RAWOUT"
note "report written to $OUTMD (raw figures in $RAWOUT)"
