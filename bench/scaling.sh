#!/usr/bin/env bash
# Data-parallel scaling on this machine: dptrain P=2 vs P=1, PyTorch 1.13 DDP (gloo)
# 2 processes vs 1, side by side in one run.
#
#   bench/scaling.sh                          # REPS=3, mlp + cnn
#   REPS=5 STEPS_CNN=300 bench/scaling.sh
#   ACCURACY=1 bench/scaling.sh               # plus the P=2 vs P=1 accuracy check (cnn, 5 epochs)
#
# For each model (mlp, cnn), REPS repetitions of four variants, interleaved within a
# repetition (the order rotates from one repetition to the next), all with global batch
# 128, SGD lr 0.05 momentum 0.9, one thread per worker/process, one epoch cut off by
# --max-steps S (S = 400 for mlp, 150 for cnn, 30 for resnet):
#
#   dp1   ./build/dptrain train --workers 1 --threads 1 ...            (batch 128)
#   dp2   ./build/dptrain train --workers 2 --threads 1 ...            (64 per worker; the default
#         --comm-progress auto: caller where the 2 workers fill the cores, as on a 2-core machine)
#   pt1   bench/pytorch_ddp.py --world 1 --threads 1 ...   plain PyTorch, no DDP (batch 128)
#   pt2   bench/pytorch_ddp.py --world 2 --threads 1 ...   DDP, gloo, 2 processes (64 per process)
#   ind2  (with VARIANTS including it) two independent `dptrain --workers 1 --batch 64 --prefetch 0`
#         processes at once, no communication at all: their summed samples/s over 2 x dp1 is the ceiling
#         of any replicated data parallelism on this machine (two cores sharing caches and
#         memory bandwidth, each paying its own optimizer step and 64-row GEMMs); the report
#         adds ind2sync = 2 x the slower process's samples/s: with equal shares a step barrier
#         runs both workers at the slower core's pace, so that is their bound where the cores'
#         speeds differ (ind2p: ind2psync).  --prefetch 0: what dp2's --prefetch auto resolves to on
#         a machine its workers fill (no loader thread); each process of the pair alone would resolve
#         2, but the pair fills the cores as dp2 does
#   dp2f, ind2f  (with VARIANTS including them) dp2 and ind2 with --prefetch 2: a loader thread per
#         worker, the default before --prefetch auto (docs/results.md "The loader thread on a full
#         machine")
#   zero1 (with VARIANTS including it) dp2 with --zero 1 (the optimizer step sharded): issue 13
#         asks for mlp's --zero 1 throughput against ind2's ceiling, side by side
#   dp2t  (with VARIANTS including it) dp2 with --comm-progress thread (the default before auto)
#   dp2s  (with VARIANTS including it) dp2 with --comm-spin-us 10: a waiting worker spins 10 µs and
#         sleeps, the wait before the default's long spin while a worker has its core to itself
#         (docs/ddp.md "Who runs the reduction")
#   dp2c  (with VARIANTS including it) dp2 with --comm-progress caller: the workers sum their own
#         blocks of each bucket between layers, no communication thread (issue 9)
#   dp2cs (with VARIANTS including it) dp2c that spins SPIN_US (200) µs before it sleeps at a wait
#   dp2p, dp2cp, ind2p  (with VARIANTS including them) dp2, dp2c and ind2 pinned: --pin-threads
#         (worker r on the r-th core the process may use), and each ind2 process given its own
#         core (`taskset -c`, the k-th of this script's cores) with the same flag: the same
#         pinning on both sides of the ratio (issue 9)
#   dp2pb, dp2cpb  (with VARIANTS including them) dp2p and dp2cp with --balance: each worker's
#         share of the batch follows its measured speed and update time (docs/ddp.md "Balanced shares"), as
#         each independent ind2p process runs at its own core's speed (issue 9)
#   det, det8, det32  (with VARIANTS including them) dp2 with --deterministic at the default
#         chunk (dp_det_chunk_auto: 32 at batch 128) / --det-chunk 8 / 32: what the bit-exact
#         mode costs against dp2 (docs/ddp.md, "Deterministic mode")
#
# PyTorch runs "at its best" (PT_ENV=tuned): thread pools pinned to 1 (OMP_NUM_THREADS,
# OPENBLAS_NUM_THREADS, MKL_NUM_THREADS, torch.set_num_threads), OpenBLAS free to use its
# AVX-512 kernels (env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE), OMP_WAIT_POLICY=PASSIVE
# and glibc malloc on huge pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1): the "tuned"
# variant of bench/train_vs_pytorch.sh.  PT_ENV=installed runs it in the environment as is.
#
# Throughput: global samples/s over the steps after the 5th (dptrain's `throughput:` line,
# pytorch_ddp.py's RESULT line).  Scaling efficiency = throughput(2) / (2 x throughput(1)),
# per repetition (runs made side by side), median over the repetitions [min..max].
# Targets: dptrain efficiency >= 90%, dptrain P=2 >= 1.5x PyTorch DDP 2 processes.
#
# ACCURACY=1 adds the equivalence check: dptrain cnn, ACC_EPOCHS (5) epochs, global batch
# 128, --workers 1 vs --workers 2 (1 thread each), the final test accuracy from the last
# `epoch 5/5 ... test acc XX.XX%` line; target: within +-0.3 points.  ACC_PYTORCH=1 also
# runs pytorch_ddp.py --world 1 and --world 2 on the same recipe.
#
# Environment knobs:
#   REPS=3  STEPS_MLP=400  STEPS_CNN=150  STEPS_RESNET=30  MODELS="mlp cnn"  VARIANTS="dp1 dp2 pt1 pt2"  SPIN_US=200
#   PT_ENV=tuned|installed  SEED=1
#   ACCURACY=0  ACC_EPOCHS=5  ACC_SEEDS="1"  ACC_TOL=0.3  ACC_PYTORCH=0
#   ACC_EXTRA="..."  (appended to the accuracy command lines, e.g. --train-limit 5000 for a smoke test)
#   DPTRAIN=./build/dptrain  PY=/usr/bin/python3  RESULTS=bench/results
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

REPS=${REPS:-3}
STEPS_MLP=${STEPS_MLP:-400}
STEPS_CNN=${STEPS_CNN:-150}
STEPS_RESNET=${STEPS_RESNET:-30}
SPIN_US=${SPIN_US:-200}
MODELS=${MODELS:-"mlp cnn"}
VARIANTS=${VARIANTS:-"dp1 dp2 pt1 pt2"}
PT_ENV=${PT_ENV:-tuned}
SEED=${SEED:-1}
ACCURACY=${ACCURACY:-0}
ACC_EPOCHS=${ACC_EPOCHS:-5}
ACC_SEEDS=${ACC_SEEDS:-1}
ACC_TOL=${ACC_TOL:-0.3}
ACC_PYTORCH=${ACC_PYTORCH:-0}
ACC_EXTRA=${ACC_EXTRA:-}
DPTRAIN=${DPTRAIN:-./build/dptrain}
PY=${PY:-/usr/bin/python3}
RESULTS=${RESULTS:-bench/results}
TIME=/usr/bin/time

die() { echo "scaling: error: $*" >&2; exit 1; }
note() { echo "scaling: $*" >&2; }

# ---- preconditions ----------------------------------------------------------------
[ -x "$TIME" ] || die "$TIME not found (Debian package 'time')"
[ -x "$DPTRAIN" ] || die "$DPTRAIN not found or not executable: build it first (make) or set DPTRAIN=PATH"
[[ $("$DPTRAIN" train --help 2>&1) == *--workers* ]] || die "'$DPTRAIN train --help' does not list --workers: is the binary current?"
"$PY" -c 'import torch, torch.distributed as d, numpy; assert d.is_available() and d.is_gloo_available()' 2>/dev/null ||
    die "$PY cannot import torch (with gloo) and numpy (python3-torch python3-numpy; the pyenv python3 on PATH has no torch)"
case $PT_ENV in tuned | installed) ;; *) die "PT_ENV must be tuned or installed" ;; esac
for v in $VARIANTS; do case $v in dp1 | dp2 | dp2t | dp2s | dp2f | dp2c | dp2cs | dp2p | dp2cp | dp2pb | dp2cpb | pt1 | pt2 | ind2 | ind2p | ind2f | zero1 | det | det8 | det32) ;; *) die "unknown variant $v (dp1 dp2 dp2t dp2s dp2f dp2c dp2cs dp2p dp2cp dp2pb dp2cpb pt1 pt2 ind2 ind2p ind2f zero1 det det8 det32)" ;; esac; done
# the cores this script may use, for ind2p's taskset (one per process)
read -r -a CORES <<<"$("$PY" -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))))')"
[ -n "${VARIANTS// /}" ] || die "no variants to run"

steps_for() { case $1 in mlp) echo "$STEPS_MLP" ;; cnn) echo "$STEPS_CNN" ;; resnet) echo "$STEPS_RESNET" ;; *) die "unknown model $1 (mlp, cnn, resnet)" ;; esac; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/scaling.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
RAW=$WORK/raw.tsv   # variant model rep samples_per_s cpu_cores
ACCRAW=$WORK/acc.tsv   # side workers seed acc% epoch time_s
: >"$RAW"
: >"$ACCRAW"

PIN=(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1)
if [ "$PT_ENV" = tuned ]; then
    PTENV=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "${PIN[@]}" OMP_WAIT_POLICY=PASSIVE
           GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1")
else
    PTENV=(env "${PIN[@]}")
fi
RECIPE=(--batch 128 --lr 0.05 --momentum 0.9 --seed "$SEED")

# The command line of one variant, into the array CMD.
build_cmd() {
    local variant=$1 model=$2 steps=$3
    case $variant in
    dp1 | dp2) CMD=(env "${PIN[@]}" "$DPTRAIN" train --model "$model" --workers "${variant#dp}" --threads 1
                    "${RECIPE[@]}" --epochs 1 --max-steps "$steps" --progress none) ;;
    dp2t) CMD=(env "${PIN[@]}" "$DPTRAIN" train --model "$model" --workers 2 --threads 1 --comm-progress thread
               "${RECIPE[@]}" --epochs 1 --max-steps "$steps" --progress none) ;;
    dp2s) CMD=(env "${PIN[@]}" "$DPTRAIN" train --model "$model" --workers 2 --threads 1 --comm-spin-us 10
               "${RECIPE[@]}" --epochs 1 --max-steps "$steps" --progress none) ;;
    dp2f) CMD=(env "${PIN[@]}" "$DPTRAIN" train --model "$model" --workers 2 --threads 1 --prefetch 2
               "${RECIPE[@]}" --epochs 1 --max-steps "$steps" --progress none) ;;
    dp2c | dp2cs | dp2cp | dp2cpb) CMD=(env "${PIN[@]}" "$DPTRAIN" train --model "$model" --workers 2 --threads 1
                               --comm-progress caller "${RECIPE[@]}" --epochs 1 --max-steps "$steps" --progress none)
                  [[ $variant != dp2cs ]] || CMD+=(--comm-spin-us "$SPIN_US")
                  [[ $variant != dp2cp* ]] || CMD+=(--pin-threads)
                  [[ $variant != dp2cpb ]] || CMD+=(--balance) ;;
    dp2p | dp2pb) CMD=(env "${PIN[@]}" "$DPTRAIN" train --model "$model" --workers 2 --threads 1 --pin-threads
                       "${RECIPE[@]}" --epochs 1 --max-steps "$steps" --progress none)
                  [[ $variant != dp2pb ]] || CMD+=(--balance) ;;
    zero1) CMD=(env "${PIN[@]}" "$DPTRAIN" train --model "$model" --workers 2 --threads 1 --zero 1
                "${RECIPE[@]}" --epochs 1 --max-steps "$steps" --progress none) ;;
    det | det8 | det32) CMD=(env "${PIN[@]}" "$DPTRAIN" train --model "$model" --workers 2 --threads 1
                             --deterministic "${RECIPE[@]}" --epochs 1 --max-steps "$steps" --progress none)
                         [[ $variant == det ]] || CMD+=(--det-chunk "${variant#det}") ;;
    ind2 | ind2p | ind2f) CMD=(env "${PIN[@]}" "$DPTRAIN" train --model "$model" --workers 1 --threads 1
                               "${RECIPE[@]}" --batch 64 --epochs 1 --max-steps "$steps" --progress none)
                  [[ $variant == ind2f ]] && CMD+=(--prefetch 2) || CMD+=(--prefetch 0)
                  [[ $variant != ind2p ]] || CMD+=(--pin-threads) ;;
    pt1 | pt2) CMD=("${PTENV[@]}" "$PY" bench/pytorch_ddp.py --model "$model" --world "${variant#pt}" --threads 1
                    "${RECIPE[@]}" --epochs 1 --max-steps "$steps" --no-eval) ;;
    esac
}

is_pos() { [ -n "$1" ] && awk -v x="$1" 'BEGIN { exit !(x + 0 > 0) }'; }

# Global samples/s from a log; empty if none found.
parse_sps() {
    local variant=$1 log=$2 v=""
    case $variant in
    dp* | ind* | det* | zero*) v=$(dptrain_sps "$log") ;;
    pt*) v=$(sed -n 's/^RESULT .*[[:space:]]samples_per_s=\([0-9][0-9.eE+-]*\).*/\1/p' "$log" | tail -n 1) ;;
    esac
    if is_pos "$v"; then echo "$v"; fi
}

run_one() {
    local variant=$1 model=$2 rep=$3 steps
    steps=$(steps_for "$model")
    local log=$WORK/$variant-$model-r$rep.log
    build_cmd "$variant" "$model" "$steps"
    local rc=0
    local sps cpu
    if [ "$variant" = ind2 ] || [ "$variant" = ind2p ] || [ "$variant" = ind2f ]; then
        # two independent processes at once; samples/s summed (ind2p: each on its own core)
        local ta=() tb=()
        if [ "$variant" = ind2p ]; then ta=(taskset -c "${CORES[0]}") tb=(taskset -c "${CORES[$((1 % ${#CORES[@]}))]}"); fi
        "$TIME" -f '%e %U %S' -o "$log.time" "${ta[@]}" "${CMD[@]}" >"$log" 2>&1 & local pid=$!
        "${tb[@]}" "${CMD[@]}" >"$log.b" 2>&1 || rc=$?
        wait "$pid" || rc=$?
        local a b
        a=$(parse_sps "$variant" "$log"); b=$(parse_sps "$variant" "$log.b")
        sps=""
        if [ -n "$a" ] && [ -n "$b" ]; then
            sps=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.1f", a + b }')
            # the pace of a step barrier between them: 2 x the slower one ("<variant>sync")
            awk -v v="${variant}sync" -v m="$model" -v r="$rep" -v a="$a" -v b="$b" \
                'BEGIN { printf "%s\t%s\t%s\t%.1f\tNA\n", v, m, r, 2 * (a < b ? a : b) }' >>"$RAW"
        fi
    else
        "$TIME" -f '%e %U %S' -o "$log.time" "${CMD[@]}" >"$log" 2>&1 || rc=$?
        sps=$(parse_sps "$variant" "$log")
    fi
    cpu=$(cpu_busy "$log.time")
    if [ "$rc" != 0 ] || [ -z "$sps" ]; then
        note "$variant $model rep=$rep: no throughput (exit $rc); last lines of its output:"
        tail -n 5 "$log" | sed 's/^/    /' >&2
        sps=NA
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$variant" "$model" "$rep" "$sps" "$cpu" >>"$RAW"
    printf '  %-4s %-3s rep %s: %s samples/s (%s cores busy over the whole process)\n' \
        "$variant" "$model" "$rep" "$sps" "$cpu" >&2
}

# ---- throughput -------------------------------------------------------------------
read -r -a VARR <<<"$VARIANTS"
NV=${#VARR[@]}
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T_START=$(date +%s)
note "variants: ${VARR[*]}; models: $MODELS; $REPS repetition(s); steps mlp $STEPS_MLP, cnn $STEPS_CNN; PyTorch env $PT_ENV"
for rep in $(seq 1 "$REPS"); do
    note "repetition $rep/$REPS"
    for model in $MODELS; do
        for k in $(seq 0 $((NV - 1))); do
            run_one "${VARR[$(((k + rep - 1) % NV))]}" "$model" "$rep"
        done
    done
done

# ---- optional: accuracy equivalence, P=2 vs P=1 --------------------------------------
# "ACC EPOCH" from the last "epoch K/E ... test acc XX.XX% ..." line.
final_acc() { sed -n 's/^epoch \([0-9]*\)\/[0-9]* .*test acc \([0-9.]*\)%.*/\2 \1/p' "$1" | tail -n 1; }

if [ "$ACCURACY" = 1 ]; then
    # shellcheck disable=SC2206
    extra=($ACC_EXTRA)
    sides="dptrain"
    [ "$ACC_PYTORCH" = 1 ] && sides="dptrain pytorch"
    for seed in $ACC_SEEDS; do
        for side in $sides; do
            for p in 1 2; do
                log=$WORK/acc-$side-p$p-s$seed.log
                if [ "$side" = dptrain ]; then
                    cmd=(env "${PIN[@]}" "$DPTRAIN" train --model cnn --workers "$p" --threads 1 --batch 128
                         --lr 0.05 --momentum 0.9 --seed "$seed" --epochs "$ACC_EPOCHS" "${extra[@]}" --progress none)
                else
                    cmd=("${PTENV[@]}" "$PY" bench/pytorch_ddp.py --model cnn --world "$p" --threads 1 --batch 128
                         --lr 0.05 --momentum 0.9 --seed "$seed" --epochs "$ACC_EPOCHS" "${extra[@]}")
                fi
                note "accuracy: $side P=$p seed $seed, cnn $ACC_EPOCHS epochs"
                t0=$(date +%s.%N)
                rc=0
                "${cmd[@]}" >"$log" 2>&1 || rc=$?
                t1=$(date +%s.%N)
                read -r acc ep <<<"$(final_acc "$log")" || true
                if [ "$rc" != 0 ] || [ -z "${acc:-}" ]; then
                    note "  $side P=$p seed $seed: no final accuracy (exit $rc); last lines:"
                    tail -n 5 "$log" | sed 's/^/    /' >&2
                    acc=NA ep=0
                fi
                tt=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')
                printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$side" "$p" "$seed" "$acc" "${ep:-0}" "$tt" >>"$ACCRAW"
                note "  test acc ${acc}% after epoch ${ep:-0}/$ACC_EPOCHS (${tt}s)"
            done
        done
    done
fi

# ---- report -----------------------------------------------------------------------
bench_facts scaling
TORCH_VER=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo unknown)
DPTRAIN_BIN=$DPTRAIN
export RAW ACCRAW REPS STEPS_MLP STEPS_CNN STEPS_RESNET SPIN_US LOAD0 LOAD1 T_START CPU_MODEL NCPU GIT_REV TORCH_VER DPTRAIN_BIN
export PT_ENV ACC_EPOCHS ACC_TOL ACC_EXTRA SEED
"$PY" - >"$OUTMD" <<'EOF'
import os, statistics, time

E = os.environ
rows = [l.rstrip("\n").split("\t") for l in open(E["RAW"]) if l.strip()]
data, cpu = {}, {}   # (variant, model) -> {rep: sps}, [cores]
models = []
for variant, model, rep, sps, c in rows:
    if model not in models:
        models.append(model)
    if sps != "NA":
        data.setdefault((variant, model), {})[int(rep)] = float(sps)
    if c != "NA":
        cpu.setdefault((variant, model), []).append(float(c))
steps = {"mlp": E["STEPS_MLP"], "cnn": E["STEPS_CNN"], "resnet": E["STEPS_RESNET"]}

def med(xs):
    return statistics.median(xs) if xs else None

def fmt(x, f="{:.0f}"):
    return f.format(x) if x is not None else "n/a"

def ratios(a, b, model, scale):
    """Per-repetition a / (scale x b), runs made side by side."""
    da, db = data.get((a, model), {}), data.get((b, model), {})
    return [da[r] / (scale * db[r]) for r in da if r in db and db[r] > 0]

def cell(rs, pct, target=None):
    if not rs:
        return "n/a"
    m = med(rs)
    if pct:
        s = f"{100 * m:.1f}% [{100 * min(rs):.0f}..{100 * max(rs):.0f}]"
    else:
        s = f"{m:.2f}x [{min(rs):.2f}..{max(rs):.2f}]"
    if target is not None:
        s += " ok" if m >= target else " **below target**"
    return s

out = []
p = out.append
p(f"# Data-parallel scaling: dptrain vs PyTorch {E['TORCH_VER']} DDP (gloo)")
p("")
p(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, wall {time.time() - int(E['T_START']):.0f}s; "
  f"dptrain `{E['DPTRAIN_BIN']}` at git `{E['GIT_REV']}`")
p(f"- machine: {E['CPU_MODEL']}, {E['NCPU']} CPUs; load average at start {E['LOAD0']}, at end {E['LOAD1']}")
p(f"- recipe: global batch 128 (64 per worker/process at P=2), SGD lr 0.05 momentum 0.9, seed {E['SEED']}, fp32, "
  f"1 thread per worker/process; {E['STEPS_MLP']} steps (mlp), {E['STEPS_CNN']} steps (cnn), {E['STEPS_RESNET']} (resnet); "
  "global samples/s over the steps after the 5th, no evaluation")
p(f"- PyTorch: `bench/pytorch_ddp.py`, environment `{E['PT_ENV']}`"
  + (" (AVX-512 OpenBLAS, OMP_WAIT_POLICY=PASSIVE, glibc.malloc.hugetlb=1)" if E["PT_ENV"] == "tuned" else "")
  + "; 1 process = plain PyTorch without DDP, 2 processes = DDP (bucket_cap_mb 25) over gloo on loopback")
p(f"- {E['REPS']} repetition(s), variants interleaved; samples/s are medians over the repetitions; "
  "efficiencies and ratios are medians of the per-repetition values (min..max in brackets)")
p("")
p("## Samples/s (global, median)")
p("")
p("| model | steps | dptrain P=1 | dptrain P=2 | PyTorch 1 process | PyTorch DDP 2 processes |")
p("|---|---:|---:|---:|---:|---:|")
for m in models:
    p(f"| {m} | {steps.get(m, '?')} | " + " | ".join(fmt(med(list(data.get((v, m), {}).values())))
                                              for v in ("dp1", "dp2", "pt1", "pt2")) + " |")
p("")
p("## Scaling efficiency and dptrain / PyTorch DDP")
p("")
p("efficiency = samples/s at 2 / (2 x samples/s at 1); target for dptrain >= 90%. "
  "dptrain P=2 / PyTorch DDP 2 processes: target >= 1.5x.")
p("")
p("| model | dptrain efficiency | PyTorch DDP efficiency | dptrain P=2 / PyTorch DDP | dptrain P=1 / PyTorch 1 process |")
p("|---|---:|---:|---:|---:|")
for m in models:
    p(f"| {m} | {cell(ratios('dp2', 'dp1', m, 2), True, 0.90)} | {cell(ratios('pt2', 'pt1', m, 2), True)} | "
      f"{cell(ratios('dp2', 'pt2', m, 1), False, 1.5)} | {cell(ratios('dp1', 'pt1', m, 1), False)} |")
p("")
if any(v == "ind2" for v, _ in data):
    p("## The ceiling: two independent single-worker processes (batch 64 each), no communication")
    p("")
    p("ceiling = their summed samples/s / (2 x dptrain P=1); dptrain P=2 / ceiling = the share of the "
      "attainable scaling that dptrain reaches (communication and synchronisation are the only difference).")
    p("")
    p("| model | independent 2 x batch 64, samples/s | ceiling efficiency | dptrain P=2 / ceiling | --zero 1 samples/s | --zero 1 / ceiling |")
    p("|---|---:|---:|---:|---:|---:|")
    for m in models:
        p(f"| {m} | {fmt(med(list(data.get(('ind2', m), {}).values())))} | {cell(ratios('ind2', 'dp1', m, 2), True)} | "
          f"{cell(ratios('dp2', 'ind2', m, 1), True)} | {fmt(med(list(data.get(('zero1', m), {}).values())))} | "
          f"{cell(ratios('zero1', 'ind2', m, 1), True)} |")
    p("")
    p("Where the two cores do not run at the same speed, the ceiling sums a fast and a slow process, "
      "while a step barrier (synchronous data parallelism with equal shares) runs both workers at the "
      "slower one's pace: `ind2sync` = 2 x the slower process's samples/s in the same run, the bound of "
      "equal shares; `ind2sync / ind2` is what the cores' difference costs them; only unequal shares "
      "(`--balance`) can go above it.")
    p("")
    p("| model | ind2sync / ind2 | dptrain P=2 / ind2sync |")
    p("|---|---:|---:|")
    for m in models:
        p(f"| {m} | {cell(ratios('ind2sync', 'ind2', m, 1), True)} | {cell(ratios('dp2', 'ind2sync', m, 1), True)} |")
    p("")
    if any(v.startswith("dp2c") for v, _ in data):
        p(f"Caller progress (`--comm-progress caller`, no communication thread; dp2cs also `--comm-spin-us {E['SPIN_US']}`), "
          "side by side with the same ceiling (issue 9 targets: cnn and resnet >= 97%, mlp >= 93%):")
        p("")
        p("| model | dptrain P=2 / ceiling | dp2c samples/s | dp2c / ceiling | dp2c / dptrain P=2 | dp2cs samples/s | dp2cs / ceiling |")
        p("|---|---:|---:|---:|---:|---:|---:|")
        for m in models:
            p(f"| {m} | {cell(ratios('dp2', 'ind2', m, 1), True)} | {fmt(med(list(data.get(('dp2c', m), {}).values())))} | "
              f"{cell(ratios('dp2c', 'ind2', m, 1), True)} | {cell(ratios('dp2c', 'dp2', m, 1), False)} | "
              f"{fmt(med(list(data.get(('dp2cs', m), {}).values())))} | {cell(ratios('dp2cs', 'ind2', m, 1), True)} |")
        p("")
if any(v == "ind2p" for v, _ in data):
    p("## Pinned: --pin-threads (worker r on the r-th core), against the ceiling pinned the same way")
    p("")
    p("ind2p = the two independent processes, each on its own core (taskset) with --pin-threads. "
      "Issue 9 targets: cnn and resnet >= 97%, mlp >= 93% of the ceiling.")
    p("")
    p("| model | ind2p samples/s | ind2p / ind2 | dp2p / ind2p | dp2cp (caller) / ind2p | dp2 / ind2 (unpinned) | dp2c / ind2 (unpinned) |")
    p("|---|---:|---:|---:|---:|---:|---:|")
    for m in models:
        p(f"| {m} | {fmt(med(list(data.get(('ind2p', m), {}).values())))} | {cell(ratios('ind2p', 'ind2', m, 1), False)} | "
          f"{cell(ratios('dp2p', 'ind2p', m, 1), True)} | {cell(ratios('dp2cp', 'ind2p', m, 1), True)} | "
          f"{cell(ratios('dp2', 'ind2', m, 1), True)} | {cell(ratios('dp2c', 'ind2', m, 1), True)} |")
    p("")
def against_default(other, title):
    """dp2 (the default) against a variant of it, both against the ceiling, side by side."""
    if not (any(v == other for v, _ in data) and any(v == "ind2" for v, _ in data)):
        return
    p(f"## {title}")
    p("")
    p(f"| model | dp2 / ind2 | {other} / ind2 | dp2 / {other} |")
    p("|---|---:|---:|---:|")
    for m in models:
        p(f"| {m} | {cell(ratios('dp2', 'ind2', m, 1), True)} | {cell(ratios(other, 'ind2', m, 1), True)} | "
          f"{cell(ratios('dp2', other, m, 1), False)} |")
    p("")
against_default("dp2t", "The default's progress: --comm-progress auto (dp2) against thread (dp2t)")
against_default("dp2s", "The default's wait: the long spin (dp2) against 10 µs then sleep (dp2s)")
against_default("dp2f", "The default's loader on a full machine: none, --prefetch auto (dp2), against a loader "
                "thread, --prefetch 2 (dp2f)")
if any(v == "ind2f" for v, _ in data) and any(v == "ind2" for v, _ in data):
    p("## The ceiling's loader: --prefetch 0 (ind2) against a loader thread per process (ind2f)")
    p("")
    p("| model | ind2 / ind2f | dp2 / ind2f |")
    p("|---|---:|---:|")
    for m in models:
        p(f"| {m} | {cell(ratios('ind2', 'ind2f', m, 1), False)} | {cell(ratios('dp2', 'ind2f', m, 1), True)} |")
    p("")
if any(v in ("dp2pb", "dp2cpb") for v, _ in data):
    p("## Pinned and balanced: --pin-threads --balance, against the pinned ceiling")
    p("")
    p("--balance gives each worker a share of the global batch such that, at its measured speed and update time, every worker's step ends together "
      "(docs/ddp.md \"Balanced shares\"); each ind2p process runs at its own core's speed. "
      "Issue 9 targets: cnn and resnet >= 97%, mlp >= 93% of the ceiling.")
    p("")
    p("| model | dp2p / ind2p | dp2pb samples/s | dp2pb / ind2p | dp2pb / dp2p | dp2cp / ind2p | dp2cpb samples/s | dp2cpb / ind2p | dp2cpb / dp2cp |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in models:
        p(f"| {m} | {cell(ratios('dp2p', 'ind2p', m, 1), True)} | {fmt(med(list(data.get(('dp2pb', m), {}).values())))} | "
          f"{cell(ratios('dp2pb', 'ind2p', m, 1), True)} | {cell(ratios('dp2pb', 'dp2p', m, 1), False)} | "
          f"{cell(ratios('dp2cp', 'ind2p', m, 1), True)} | {fmt(med(list(data.get(('dp2cpb', m), {}).values())))} | "
          f"{cell(ratios('dp2cpb', 'ind2p', m, 1), True)} | {cell(ratios('dp2cpb', 'dp2cp', m, 1), False)} |")
    p("")
if any(v.startswith("det") for v, _ in data):
    p("## What deterministic mode costs: dptrain P=2 with --deterministic, against ordinary P=2")
    p("")
    p("| model | ordinary P=2 | deterministic, default chunk | / ordinary | deterministic, chunk 8 | / ordinary | deterministic, chunk 32 | / ordinary |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|")
    for m in models:
        p(f"| {m} | {fmt(med(list(data.get(('dp2', m), {}).values())))} | "
          f"{fmt(med(list(data.get(('det', m), {}).values())))} | {cell(ratios('det', 'dp2', m, 1), False)} | "
          f"{fmt(med(list(data.get(('det8', m), {}).values())))} | {cell(ratios('det8', 'dp2', m, 1), False)} | "
          f"{fmt(med(list(data.get(('det32', m), {}).values())))} | {cell(ratios('det32', 'dp2', m, 1), False)} |")
    p("")
p("## CPU cores busy per run (median of (user+sys)/wall over the whole process, start-up and data loading included)")
p("")
p("| model | dptrain P=1 | dptrain P=2 | PyTorch 1 process | PyTorch DDP 2 processes |")
p("|---|---:|---:|---:|---:|")
for m in models:
    p(f"| {m} | " + " | ".join(fmt(med(cpu.get((v, m), [])), "{:.2f}") for v in ("dp1", "dp2", "pt1", "pt2")) + " |")
p("")
acc = [l.rstrip("\n").split("\t") for l in open(E["ACCRAW"]) if l.strip()]
if acc:
    tol = float(E["ACC_TOL"])
    ne = int(E["ACC_EPOCHS"])
    extra = f", extra flags `{E['ACC_EXTRA']}`" if E["ACC_EXTRA"].strip() else ""
    p(f"## Accuracy equivalence: cnn, {ne} epochs, global batch 128, P=2 vs P=1{extra}")
    p("")
    p(f"Final test accuracy (last `epoch {ne}/{ne}` line); target |P=2 - P=1| <= {tol} points.")
    p("")
    p("| side | seed | P=1 test acc | P=2 test acc | P=2 - P=1 | time P=1 / P=2 |")
    p("|---|---:|---:|---:|---:|---:|")
    res = {}
    for side, w, seed, a, ep, tt in acc:
        res[(side, seed, w)] = (a, int(ep), tt)
    done = []
    for side, w, seed, a, ep, tt in acc:
        if (side, seed) in done:
            continue
        done.append((side, seed))
        r1, r2 = res.get((side, seed, "1")), res.get((side, seed, "2"))
        def show(r):
            if r is None or r[0] == "NA":
                return "n/a"
            return f"{float(r[0]):.2f}%" + ("" if r[1] == ne else f" (only {r[1]} epochs)")
        diff = "n/a"
        if r1 and r2 and r1[0] != "NA" and r2[0] != "NA" and r1[1] == ne and r2[1] == ne:
            d = float(r2[0]) - float(r1[0])
            diff = f"{d:+.2f}" + (" ok" if abs(d) <= tol + 1e-9 else " **outside target**")
        times = f"{r1[2] if r1 else '?'}s / {r2[2] if r2 else '?'}s"
        name = "dptrain" if side == "dptrain" else "PyTorch (1 process / DDP 2)"
        p(f"| {name} | {seed} | {show(r1)} | {show(r2)} | {diff} | {times} |")
    p("")
print("\n".join(out))
EOF
cat "$OUTMD"
RAWOUT=${OUTMD%.md}.tsv
{ printf 'variant\tmodel\trep\tsamples_per_s\tcpu_cores\n'; cat "$RAW"; } >"$RAWOUT"
note "report written to $OUTMD (raw figures in $RAWOUT)"
