#!/usr/bin/env bash
# Training throughput and peak memory: dptrain vs PyTorch 1.13, side by side in one run.
#
#   bench/train_vs_pytorch.sh                 # from the repository root (or anywhere)
#   REPS=5 bench/train_vs_pytorch.sh          # more repetitions
#   VARIANTS="dptrain installed avx512 tuned_own tuned_skx" bench/train_vs_pytorch.sh   # every variant
#
# For each model in MODELS (mlp cnn resnet) and threads T in THREADS (1 2), REPS repetitions
# of the variants in VARIANTS, interleaved within each repetition (the order rotates from one
# repetition to the next) so that the noise of a shared machine hits all of them alike:
#
#   dptrain    ./build/dptrain train --model M --workers 1 --threads T --batch 128 --lr 0.05
#              --momentum 0.9 --epochs 1 --max-steps S --progress none
#   installed  PyTorch in the environment as it is (on the project's machine that environment holds
#              Debian's OpenBLAS to its Haswell/AVX2 kernels with OPENBLAS_CORETYPE=Haswell; the
#              report prints what this run inherited)
#   avx512     the same with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for that command alone
#              (OpenBLAS picks its kernels itself)
#   tuned_own  "best-tuned" run (a): env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE (OpenBLAS's own
#              kernel choice), OMP_WAIT_POLICY=PASSIVE, and dptrain's allocator policy,
#              GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=
#              17179869184:glibc.malloc.hugetlb=1 (appended with ':' to any GLIBC_TUNABLES already set)
#   tuned_skx  "best-tuned" run (b): the same with OPENBLAS_CORETYPE=SkylakeX (OPENBLAS_L2_SIZE unset)
#
# "PyTorch best-tuned" is, per repetition, the faster of tuned_own and tuned_skx (of the one that
# ran, where the other failed or is not in VARIANTS): the headline baseline.  VARIANTS=tuned is
# short for "tuned_own tuned_skx".
#
# Every variant runs the same recipe for the same number of steps S with its thread
# pools pinned to T (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS; PyTorch
# also torch.set_num_threads(T)).  Throughput is samples/s over the training steps
# after the 5th (no evaluation, no data loading).  The report gives medians over
# the repetitions, the medians of the per-repetition ratios dptrain / PyTorch best-tuned
# (the headline) and dptrain / each PyTorch variant, and model FLOP utilisation (MFU =
# samples/s x training FLOPs per sample / (P x T), P the fp32 peak per core that dptrain
# measures at start and prints in its throughput line; training FLOPs = 3 x the forward
# multiply-add FLOPs of the convolutions and fully connected layers).  Then one peak-memory
# comparison (cnn, 1 thread, /usr/bin/time -v; every variant but avx512).
#
# Environment knobs:
#   REPS=3  STEPS_MLP=300  STEPS_CNN=150  STEPS_RESNET=40  MODELS="mlp cnn resnet"  THREADS="1 2"
#   VARIANTS="dptrain tuned_own tuned_skx" (also: installed avx512)   MEM=1 (0: skip the memory runs)
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
STEPS_RESNET=${STEPS_RESNET:-40}
MODELS=${MODELS:-"mlp cnn resnet"}
THREADS=${THREADS:-"1 2"}
MEM=${MEM:-1}
DPTRAIN=${DPTRAIN:-./build/dptrain}
PY=${PY:-/usr/bin/python3}
RESULTS=${RESULTS:-bench/results}
SKIP_DPTRAIN=${SKIP_DPTRAIN:-0}
VARIANTS=${VARIANTS:-"dptrain tuned_own tuned_skx"}
TIME=/usr/bin/time
# dptrain's allocator policy (it sets the same with mallopt at start), for the tuned variants
TUNED_MALLOC=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184:glibc.malloc.hugetlb=1

die() { echo "train_vs_pytorch: error: $*" >&2; exit 1; }
note() { echo "train_vs_pytorch: $*" >&2; }

# ---- preconditions ----------------------------------------------------------------
[ -x "$TIME" ] || die "$TIME not found (Debian package 'time')"
"$PY" -c 'import torch, numpy' 2>/dev/null ||
    die "$PY cannot import torch and numpy (install python3-torch python3-numpy; the pyenv python3 on PATH has no torch)"
# "tuned" is short for the best-tuned pair
VARIANTS=$(for v in $VARIANTS; do if [ "$v" = tuned ]; then echo tuned_own tuned_skx; else echo "$v"; fi; done |
    tr ' ' '\n' | awk 'NF && !seen[$0]++' | tr '\n' ' ')
for v in $VARIANTS; do
    case $v in dptrain | installed | avx512 | tuned_own | tuned_skx) ;;
    *) die "unknown variant $v (dptrain installed avx512 tuned_own tuned_skx; tuned = tuned_own tuned_skx)" ;; esac
done
for m in $MODELS; do case $m in mlp | cnn | resnet) ;; *) die "unknown model $m (mlp cnn resnet)" ;; esac; done
for t in $THREADS; do [[ $t =~ ^[1-9][0-9]*$ ]] || die "THREADS: '$t' is not a positive integer"; done
for s in "$STEPS_MLP" "$STEPS_CNN" "$STEPS_RESNET"; do
    if ! [[ $s =~ ^[0-9]+$ ]] || [ "$s" -le 5 ]; then
        die "steps must exceed the 5 warm-up steps (STEPS_MLP=$STEPS_MLP STEPS_CNN=$STEPS_CNN STEPS_RESNET=$STEPS_RESNET)"
    fi
done
if [ "$SKIP_DPTRAIN" = 1 ]; then
    VARIANTS=$(echo "$VARIANTS" | tr ' ' '\n' | grep -vx dptrain | tr '\n' ' ' || true)
    note "SKIP_DPTRAIN=1: running the PyTorch half only"
else
    [ -x "$DPTRAIN" ] || die "$DPTRAIN not found or not executable: build it first (make), set DPTRAIN=PATH, or SKIP_DPTRAIN=1 for the PyTorch half only"
    "$DPTRAIN" train --help >/dev/null 2>&1 || die "'$DPTRAIN train --help' fails: is the binary working?"
fi
[ -n "${VARIANTS// /}" ] || die "no variants to run"

steps_for() {
    case $1 in mlp) echo "$STEPS_MLP" ;; cnn) echo "$STEPS_CNN" ;; resnet) echo "$STEPS_RESNET" ;; *) die "unknown model $1" ;; esac
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/train_vs_pytorch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
RAW=$WORK/raw.tsv   # variant model threads rep samples_per_s cpu_cores maxrss_kb
: >"$RAW"

# The command line of one variant, into the array CMD.
build_cmd() {
    local variant=$1 model=$2 threads=$3 steps=$4
    local pin=(OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads")
    local tuned=(OMP_WAIT_POLICY=PASSIVE GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}$TUNED_MALLOC")
    local pyargs=("$PY" bench/pytorch_train.py --model "$model" --threads "$threads" --batch 128 --lr 0.05
                  --momentum 0.9 --epochs 1 --max-steps "$steps" --no-eval)
    case $variant in
    dptrain) CMD=(env "${pin[@]}" "$DPTRAIN" train --model "$model" --workers 1 --threads "$threads" --batch 128 --lr 0.05
                  --momentum 0.9 --epochs 1 --max-steps "$steps" --progress none) ;;
    installed) CMD=(env "${pin[@]}" "${pyargs[@]}") ;;
    avx512) CMD=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "${pin[@]}" "${pyargs[@]}") ;;
    tuned_own) CMD=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "${pin[@]}" "${tuned[@]}" "${pyargs[@]}") ;;
    tuned_skx) CMD=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_CORETYPE=SkylakeX "${pin[@]}" "${tuned[@]}"
                    "${pyargs[@]}") ;;
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
    printf '  %-9s %-6s T=%s rep %s: %s samples/s (%s cores busy, max RSS %s KiB)\n' \
        "$variant" "$model" "$threads" "$rep" "$sps" "$cpu" "$rss" >&2
}

# ---- throughput -------------------------------------------------------------------
read -r -a VARR <<<"$VARIANTS"
NV=${#VARR[@]}
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T_START=$(date +%s)
# what the environment carried in (the installed variant runs in it as is)
ENV_IN="OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-(unset)} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-(unset)} GLIBC_TUNABLES=${GLIBC_TUNABLES-(unset)} OMP_WAIT_POLICY=${OMP_WAIT_POLICY-(unset)}"
note "variants: ${VARR[*]}; models: $MODELS; threads: $THREADS; $REPS repetitions;" \
     "steps mlp $STEPS_MLP, cnn $STEPS_CNN, resnet $STEPS_RESNET"
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
export RAW MEMRAW REPS STEPS_MLP STEPS_CNN STEPS_RESNET MODELS LOAD0 T_START ENV_IN TUNED_MALLOC
TORCH_VER=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo unknown)
DPTRAIN_BIN=$DPTRAIN
export LOAD1 CPU_MODEL NCPU GIT_REV TORCH_VER DPTRAIN_BIN
"$PY" - >"$OUTMD" <<'PYEOF'
import os, statistics, time

# Forward FLOPs per sample: 2 x the multiply-adds of the convolutions and fully connected layers
# (biases, BatchNorm, ReLU, pooling left out), for the models as dptrain and bench/pytorch_train.py
# build them on 1x28x28 inputs.  Training FLOPs per sample = 3 x forward (forward + two GEMMs
# in backward).
#   mlp     784-512-512-10
#   cnn     conv 1->32 3x3 at 28x28, pool, conv 32->64 3x3 at 14x14, pool, fc 3136-128, fc 128-10
#   resnet  resnet:8,32: conv1 1->32 3x3 at 28x28; layer1.0 two 32->32 3x3 at 28x28; layer2.0
#           32->64 3x3 stride 2 and 64->64 3x3 at 14x14, downsample 1x1 32->64 at 14x14;
#           layer3.0 64->128 3x3 stride 2 and 128->128 3x3 at 7x7, downsample 1x1 64->128 at
#           7x7; global average pool, fc 128-10
FWD = {"mlp": 2 * (784 * 512 + 512 * 512 + 512 * 10),
       "cnn": 2 * (28 * 28 * 32 * 9 + 14 * 14 * 64 * 32 * 9 + 3136 * 128 + 128 * 10),
       "resnet": 2 * (28 * 28 * 32 * 1 * 9
                      + 2 * 28 * 28 * 32 * 32 * 9
                      + 14 * 14 * 64 * 32 * 9 + 14 * 14 * 64 * 64 * 9 + 14 * 14 * 64 * 32
                      + 7 * 7 * 128 * 64 * 9 + 7 * 7 * 128 * 128 * 9 + 7 * 7 * 128 * 64
                      + 128 * 10)}
PEAK = float(os.environ.get("PEAK_GFLOPS") or 0) * 1e9  # fp32 FLOP/s per core, measured by dptrain
NAMES = {"dptrain": "dptrain", "installed": "PyTorch as installed", "avx512": "PyTorch, OpenBLAS's own kernels",
         "tuned_own": "PyTorch tuned, OpenBLAS's own kernels (a)", "tuned_skx": "PyTorch tuned, SkylakeX kernels (b)",
         "best": "**PyTorch best-tuned**"}
PT = ["installed", "avx512", "tuned_own", "tuned_skx"]
TUNED = ["tuned_own", "tuned_skx"]
SHORT = {"tuned_own": "a", "tuned_skx": "b"}

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
tuned = [v for v in TUNED if v in present]
cases = []
for r in rows:
    c = (r[1], int(r[2]))
    if c not in cases:
        cases.append(c)

# PyTorch best-tuned: per repetition the faster of tuned_own and tuned_skx (of the one with a
# figure, where the other has none); picks[(m, t)] counts which one it was.
picks, partial = {}, []
if tuned:
    for m, t in cases:
        reps = sorted({r for v in tuned for r in data.get((v, m, t), {})})
        best, pk = {}, {v: 0 for v in tuned}
        for r in reps:
            got = [(data[(v, m, t)][r], v) for v in tuned if r in data.get((v, m, t), {})]
            best[r], w = max(got)
            pk[w] += 1
            if len(got) < len(tuned):
                partial.append(f"{m} T={t} rep {r}")
        if best:
            data[("best", m, t)] = best
        picks[(m, t)] = pk
cols = variants + (["best"] if tuned else [])

def med(xs):
    return statistics.median(xs) if xs else None

def fmt(x, f="{:.0f}"):
    return f.format(x) if x is not None else "n/a"

models = os.environ["MODELS"].split()
steps = {"mlp": os.environ["STEPS_MLP"], "cnn": os.environ["STEPS_CNN"], "resnet": os.environ["STEPS_RESNET"]}
out = []
p = out.append
p(f"# Training throughput: dptrain vs PyTorch {os.environ['TORCH_VER']}")
p("")
p(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, wall {time.time() - int(os.environ['T_START']):.0f}s; "
  f"dptrain `{os.environ['DPTRAIN_BIN']}` at git `{os.environ['GIT_REV']}`")
p(f"- machine: {os.environ['CPU_MODEL']}, {os.environ['NCPU']} CPUs; load average at start "
  f"{os.environ['LOAD0']}, at end {os.environ['LOAD1']}")
p("- recipe: batch 128, SGD lr 0.05 momentum 0.9, fp32; "
  + ", ".join(f"{steps[m]} steps ({m})" for m in models)
  + "; samples/s over the steps after the 5th, no evaluation")
p(f"- {os.environ['REPS']} repetitions, variants interleaved; figures are medians over the repetitions; "
  "ratios are medians of the per-repetition ratios (min..max in brackets)")
p(f"- environment inherited (the installed variant's): `{os.environ['ENV_IN']}`")
p("- every variant: OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = MKL_NUM_THREADS = threads "
  "(PyTorch also torch.set_num_threads)")
if tuned:
    p("- PyTorch tuned: OMP_WAIT_POLICY=PASSIVE, GLIBC_TUNABLES=`" + os.environ["TUNED_MALLOC"] + "` (dptrain's "
      "allocator policy), OPENBLAS_L2_SIZE unset; (a) `tuned_own`: OPENBLAS_CORETYPE unset (OpenBLAS's own kernel "
      "choice), (b) `tuned_skx`: OPENBLAS_CORETYPE=SkylakeX.  **PyTorch best-tuned** = per repetition the faster "
      "of " + " and ".join(f"({SHORT[v]})" for v in tuned) + ": the headline baseline")
    if len(tuned) < 2:
        p(f"- **only {tuned[0]} ran: best-tuned is that variant alone, not the faster of the pair**")
    if partial:
        p(f"- **best-tuned from one run only (the other gave no figure)**: {', '.join(partial)}")
p("")
p("## Samples/s (median)")
p("")
pickcol = bool(tuned)
p("| model | threads | " + " | ".join(NAMES[v] for v in cols) + (" | best-tuned was (repetitions) |" if pickcol else " |"))
p("|---|---:|" + "---:|" * len(cols) + ("---|" if pickcol else ""))
for m, t in cases:
    row = f"| {m} | {t} | " + " | ".join(fmt(med(list(data.get((v, m, t), {}).values()))) for v in cols) + " |"
    if pickcol:
        pk = picks[(m, t)]
        row += " " + ", ".join(f"({SHORT[v]}) {n}" for v, n in pk.items()) + f" of {sum(pk.values())} |"
    p(row)
p("")
if "dptrain" in variants:
    pts = [v for v in cols if v != "dptrain"]
    pts = (["best"] if "best" in pts else []) + [v for v in pts if v != "best"]
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
            c = f"{med(rs):.2f}x [{min(rs):.2f}..{max(rs):.2f}]" if rs else "n/a"
            cells.append(f"**{c}**" if v == "best" and rs else c)
        p(f"| {m} | {t} | " + " | ".join(cells) + " |")
    p("")
p(f"## Model FLOP utilisation (median samples/s x 3 x forward FLOPs / ({PEAK / 1e9:.0f} GFLOP/s x threads))")
p("")
p("The peak per core is the one dptrain measured at start in this run (an FMA loop on the CPU's widest ISA). "
  "Forward FLOPs: 2 x the multiply-adds of the convolutions and fully connected layers (no bias, BatchNorm, "
  "ReLU or pooling), so dptrain's own MFU line (which counts those too) reads slightly higher."
  if PEAK > 0 else "No peak was measured in this run (no dptrain log with an MFU line): MFU is not given.")
p("")
p("| model | threads | train MFLOP/sample | " + " | ".join(NAMES[v] for v in cols) + " |")
p("|---|---:|---:|" + "---:|" * len(cols))
for m, t in cases:
    fl = 3 * FWD[m]
    cells = []
    for v in cols:
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
    ptm = [v for v in PT if memd.get(v, "NA") != "NA"]
    if memd.get("dptrain", "NA") != "NA" and ptm:
        p("")
        p("Peak RSS, PyTorch / dptrain: "
          + "; ".join(f"{NAMES[v]} {int(memd[v]) / int(memd['dptrain']):.2f}x" for v in ptm)
          + ".  Both hold the normalised fp32 training and test sets (about 219 MiB).")
    p("")
print("\n".join(out))
PYEOF
cat "$OUTMD"
RAWOUT=${OUTMD%.md}.tsv
{ printf 'variant\tmodel\tthreads\trep\tsamples_per_s\tcpu_cores\tmaxrss_kb\n'; cat "$RAW"; } >"$RAWOUT"
note "report written to $OUTMD (raw figures in $RAWOUT)"
