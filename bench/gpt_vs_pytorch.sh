#!/usr/bin/env bash
# GPT training on text: dptrain vs PyTorch 1.13, side by side in one run (issue 10, Targets).
#
#   bench/gpt_vs_pytorch.sh                   # REPS=3, STEPS=200: throughput
#   REPS=5 STEPS=400 bench/gpt_vs_pytorch.sh
#   VAL=1 bench/gpt_vs_pytorch.sh             # validation loss after 2000 steps, both sides
#
# Workload: gpt:layers=4,heads=4,dim=128,ctx=64 (834,304 parameters) on the fortunes token file
# (`dptrain prepare-text --out F`, the default corpus; TOKENS=F to reuse one), global batch 32
# windows, AdamW lr 1e-3 with dptrain's defaults (betas 0.9/0.999, eps 1e-8, weight decay 0;
# bench/pytorch_gpt.py passes the same), seed 1, one thread per worker/process.
#
# Throughput mode: REPS repetitions of the variants below, interleaved within a repetition (the
# order rotates from one repetition to the next) so that the noise of a shared machine hits all
# alike, each training STEPS steps of one epoch (STEPS must be below the steps of an epoch, 1177
# here, so that neither side evaluates on the way).  The PyTorch variants, torch1 and ddp2, run once
# per PyTorch environment (PT_ENV, below) in every repetition: twice with the default best-tuned pair.
#
#   dp1    ./build/dptrain train --workers 1 --threads 1 --batch 32 ...
#   torch1 bench/pytorch_gpt.py --threads 1 --batch 32 ...          plain PyTorch
#   dp2    ./build/dptrain train --workers 2 --threads 1 --batch 32 ...   (16 per worker)
#   ddp2   bench/pytorch_gpt.py --world 2 --threads 1 --batch 32 ...  DDP over gloo (16 per process)
#   ind2   two independent `dptrain --workers 1 --batch 16` processes at once, pinned to two
#          different cores (taskset), no communication: their summed tokens/s is the ceiling of
#          any replicated data parallelism on this machine (bench/scaling.sh's ind2)
#
# PyTorch's baseline is "best-tuned", as in bench/train_vs_pytorch.sh: each PyTorch variant runs
# twice per repetition, with thread pools pinned to 1 (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
# MKL_NUM_THREADS, torch.set_num_threads), OMP_WAIT_POLICY=PASSIVE, dptrain's allocator policy
# (GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184:
# glibc.malloc.hugetlb=1, appended with ':' to any GLIBC_TUNABLES already set) and
#   (a) own  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE (OpenBLAS's own kernel choice)
#   (b) skx  the same with OPENBLAS_CORETYPE=SkylakeX (OPENBLAS_L2_SIZE unset)
# and the faster of the two in each repetition is the baseline (torch1, ddp2; the report gives
# both runs and the best).  PT_ENV=tuned_own or tuned_skx runs only (a) or (b); PT_ENV=installed
# runs PyTorch once, pinned, in the environment as is.  VAL=1 uses (a) (or the PT_ENV given).
#
# Tokens/s, both sides measured alike: global windows x ctx over the wall time from the end of step
# 5 to the end of the last step (dptrain's `throughput: N samples/s` line, times ctx; pytorch_gpt.py's
# RESULT tokens_per_s).  dptrain's epoch line also prints tokens/s, but over the whole epoch with
# the first steps: not the comparable figure.  Ratios are taken per repetition (runs made side by
# side), median over the repetitions [min..max]; torch1 and ddp2 are the per-repetition best of the
# PyTorch environments.  Targets: dp1/torch1 >= 1.5, dp2/ddp2 >= 1.5, dp2/ind2 >= 0.9.
#
# VAL=1: both sides train VAL_STEPS (2000) steps with the same recipe, VAL_STEPS x 32 windows in
# equal epochs no longer than the training part allows (2 epochs of 32000 here: --epochs 2
# --train-limit 32000), AdamW lr 1e-3 with warmup + cosine
# (--schedule cosine --warmup VAL_WARMUP --min-lr 0; both follow src/optim/sched.c step for step;
# VAL_SCHEDULE=constant for a constant lr), 1 worker x 1 thread each, and from the same initial
# weights (PyTorch's N(0, 0.02) draw, exported by pytorch_gpt.py --export-init and read by dptrain
# --init-from; VAL_SAME_INIT=0: each side its own).  The windows differ (dptrain draws them with
# Philox, PyTorch with torch.randint: the same distribution).  Both report the loss per token on
# the same fixed validation windows (dptrain's: the last 5% of the tokens cut into consecutive
# windows of ctx, 2013 of them; pytorch_gpt.py mirrors them exactly): dptrain's val_loss from its
# metrics.jsonl, PyTorch's from its RESULT line.  The two runs go side by side, each pinned to its
# own core when there are two (VAL_PARALLEL=0: one after the other).
#
# Environment knobs:
#   REPS=3  STEPS=200  VARIANTS="dp1 torch1 dp2 ddp2 ind2"  MODEL=gpt:layers=4,heads=4,dim=128,ctx=64
#   BATCH=32  LR=1e-3  SEED=1  PT_ENV=tuned|tuned_own|tuned_skx|installed  TOKENS=(prepared into a temp dir)
#   CPUS="0 1" (ind2's and VAL's two cores [the first two this process may run on])
#   VAL=0  VAL_STEPS=2000  VAL_WARMUP=100  VAL_SCHEDULE=cosine|constant  VAL_SAME_INIT=1  VAL_PARALLEL=1
#   DPTRAIN=./build/dptrain  PY=/usr/bin/python3  RESULTS=bench/results
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

REPS=${REPS:-3}
STEPS=${STEPS:-200}
VARIANTS=${VARIANTS:-"dp1 torch1 dp2 ddp2 ind2"}
MODEL=${MODEL:-gpt:layers=4,heads=4,dim=128,ctx=64}
BATCH=${BATCH:-32}
LR=${LR:-1e-3}
SEED=${SEED:-1}
PT_ENV=${PT_ENV:-tuned}
TOKENS=${TOKENS:-}
VAL=${VAL:-0}
VAL_STEPS=${VAL_STEPS:-2000}
VAL_WARMUP=${VAL_WARMUP:-100}
VAL_SCHEDULE=${VAL_SCHEDULE:-cosine}
VAL_SAME_INIT=${VAL_SAME_INIT:-1}
VAL_PARALLEL=${VAL_PARALLEL:-1}
DPTRAIN=${DPTRAIN:-./build/dptrain}
PY=${PY:-/usr/bin/python3}
RESULTS=${RESULTS:-bench/results}
TIME=/usr/bin/time

die() { echo "gpt_vs_pytorch: error: $*" >&2; exit 1; }
note() { echo "gpt_vs_pytorch: $*" >&2; }

# ---- preconditions ----------------------------------------------------------------
[ -x "$TIME" ] || die "$TIME not found (Debian package 'time')"
[ -x "$DPTRAIN" ] || die "$DPTRAIN not found or not executable: build it first (make) or set DPTRAIN=PATH"
[[ $("$DPTRAIN" train --help 2>&1) == *gpt:* ]] || die "'$DPTRAIN train --help' does not list gpt: is the binary current?"
"$PY" -c 'import torch, torch.distributed as d, numpy; assert d.is_available() and d.is_gloo_available()' 2>/dev/null ||
    die "$PY cannot import torch (with gloo) and numpy (python3-torch python3-numpy; the pyenv python3 on PATH has no torch)"
case $PT_ENV in
tuned) PT_ENVS=(own skx) ;;
tuned_own) PT_ENVS=(own) ;;
tuned_skx) PT_ENVS=(skx) ;;
installed) PT_ENVS=(installed) ;;
*) die "PT_ENV must be tuned (the best of tuned_own and tuned_skx), tuned_own, tuned_skx or installed" ;;
esac
case $VAL_SCHEDULE in cosine | constant) ;; *) die "VAL_SCHEDULE must be cosine or constant" ;; esac
for v in $VARIANTS; do case $v in dp1 | torch1 | dp2 | ddp2 | ind2) ;; *) die "unknown variant $v (dp1 torch1 dp2 ddp2 ind2)" ;; esac; done
[ "$VAL" = 1 ] || [ -n "${VARIANTS// /}" ] || die "no variants to run"
[[ $MODEL == gpt:* ]] || die "MODEL must be gpt:layers=L,heads=H,dim=D,ctx=T"
CTX=$(sed -n 's/.*ctx=\([0-9]*\).*/\1/p' <<<"$MODEL")
[ -n "$CTX" ] || die "MODEL $MODEL has no ctx="
[ $((BATCH % 2)) = 0 ] || die "BATCH must be even (ind2 runs two processes at BATCH/2)"

# Two cores for ind2 and the VAL runs: the first two this process may run on.
if [ -z "${CPUS:-}" ]; then
    CPUS=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status | tr ',' '\n' |
        awk -F- '{ hi = NF > 1 ? $2 : $1; for (c = $1; c <= hi; c++) print c }' | head -n 2 | tr '\n' ' ')
fi
read -r -a CPUA <<<"$CPUS"
PINNED=0
if command -v taskset >/dev/null && [ "${#CPUA[@]}" -ge 2 ]; then PINNED=1; fi
pin() { # pin K CMD...: run CMD on the K-th of CPUS (as is without taskset or a second core)
    local k=$1
    shift
    if [ "$PINNED" = 1 ]; then taskset -c "${CPUA[$k]}" "$@"; else "$@"; fi
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpt_vs_pytorch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
RAW=$WORK/raw.tsv   # variant rep tokens_per_s cpu_cores
VALRAW=$WORK/val.tsv   # side val_loss steps time_s
: >"$RAW"
: >"$VALRAW"

bench_tokens
# The split and epoch as dptrain takes them (docs/text.md): count = (size - 32) / 2, the last
# floor(count x 0.05) validate, an epoch is floor(train_n / (ctx + 1)) windows.
NTOK=$(( ($(stat -c %s "$TOKENS") - 32) / 2 ))
SPE=$(awk -v n="$NTOK" -v c="$CTX" -v b="$BATCH" 'BEGIN { tr = n - int(n * 0.05); w = int(tr / (c + 1)); print int((w + b - 1) / b) }')
if [ "$VAL" != 1 ] && [ "$STEPS" -ge "$SPE" ]; then
    die "STEPS=$STEPS must be below the $SPE steps of an epoch (the end of an epoch evaluates: not training time)"
fi
[ "$STEPS" -gt 5 ] || die "STEPS must exceed the 5 warm-up steps"

PIN=(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1)
# dptrain's allocator policy (it sets the same with mallopt at start), for the tuned environments
TUNED_MALLOC=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184:glibc.malloc.hugetlb=1
# ptenv E: the environment of PyTorch environment E (own, skx, installed), into the array PTENV.
ptenv() {
    local tuned=(OMP_WAIT_POLICY=PASSIVE GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}$TUNED_MALLOC")
    case $1 in
    own) PTENV=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "${PIN[@]}" "${tuned[@]}") ;;
    skx) PTENV=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_CORETYPE=SkylakeX "${PIN[@]}" "${tuned[@]}") ;;
    installed) PTENV=(env "${PIN[@]}") ;;
    esac
}
ptenv "${PT_ENVS[0]}"   # VAL=1 and --export-init run in the first (own for the best-tuned pair)
DPCOMMON=(--model "$MODEL" --data "$TOKENS" --optim adamw --lr "$LR" --seed "$SEED" --threads 1 --progress none)
PTCOMMON=(--model "$MODEL" --data "$TOKENS" --lr "$LR" --seed "$SEED" --threads 1)

# The command line of one variant, into the array CMD; torch1_E and ddp2_E run PyTorch in
# environment E (ptenv).
build_cmd() {
    case $1 in torch1_* | ddp2_*) ptenv "${1#*_}" ;; esac
    case $1 in
    dp1 | dp2) CMD=(env "${PIN[@]}" "$DPTRAIN" train "${DPCOMMON[@]}" --workers "${1#dp}" --batch "$BATCH"
                    --epochs 1 --max-steps "$STEPS") ;;
    ind2) CMD=(env "${PIN[@]}" "$DPTRAIN" train "${DPCOMMON[@]}" --workers 1 --batch $((BATCH / 2))
               --epochs 1 --max-steps "$STEPS") ;;
    torch1_*) CMD=("${PTENV[@]}" "$PY" bench/pytorch_gpt.py "${PTCOMMON[@]}" --world 1 --batch "$BATCH"
                 --epochs 1 --max-steps "$STEPS" --no-eval) ;;
    ddp2_*) CMD=("${PTENV[@]}" "$PY" bench/pytorch_gpt.py "${PTCOMMON[@]}" --world 2 --batch "$BATCH"
               --epochs 1 --max-steps "$STEPS" --no-eval) ;;
    esac
}

is_pos() { [ -n "$1" ] && awk -v x="$1" 'BEGIN { exit !(x + 0 > 0) }'; }

# Global tokens/s from a log; empty if none found.  dptrain: its throughput line's samples/s
# (windows after the 5th step) x ctx, unrounded (the line's own tokens/s is rounded).
parse_tps() {
    local variant=$1 log=$2 v=""
    case $variant in
    dp* | ind*) v=$(dptrain_sps "$log")
                is_pos "$v" && v=$(awk -v s="$v" -v c="$CTX" 'BEGIN { printf "%.1f", s * c }') ;;
    *) v=$(sed -n 's/^RESULT .*[[:space:]]tokens_per_s=\([0-9][0-9.eE+-]*\).*/\1/p' "$log" | tail -n 1) ;;
    esac
    if is_pos "$v"; then echo "$v"; fi
}

run_one() {
    local variant=$1 rep=$2
    local log=$WORK/$variant-r$rep.log
    build_cmd "$variant"
    local rc=0 tps cpu
    if [ "$variant" = ind2 ]; then
        # two independent processes at once, one per core; tokens/s summed
        pin 0 "$TIME" -f '%e %U %S' -o "$log.time" "${CMD[@]}" >"$log" 2>&1 & local pid=$!
        pin 1 "${CMD[@]}" >"$log.b" 2>&1 || rc=$?
        wait "$pid" || rc=$?
        local a b
        a=$(parse_tps "$variant" "$log"); b=$(parse_tps "$variant" "$log.b")
        tps=""
        if [ -n "$a" ] && [ -n "$b" ]; then tps=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.1f", a + b }'); fi
    else
        "$TIME" -f '%e %U %S' -o "$log.time" "${CMD[@]}" >"$log" 2>&1 || rc=$?
        tps=$(parse_tps "$variant" "$log")
    fi
    cpu=$(cpu_busy "$log.time")
    if [ "$rc" != 0 ] || [ -z "$tps" ]; then
        note "$variant rep=$rep: no throughput (exit $rc); last lines of its output:"
        tail -n 5 "$log" | sed 's/^/    /' >&2
        tps=NA
    fi
    printf '%s\t%s\t%s\t%s\n' "$variant" "$rep" "$tps" "$cpu" >>"$RAW"
    printf '  %-13s rep %s: %s tokens/s (%s cores busy over the whole process)\n' "$variant" "$rep" "$tps" "$cpu" >&2
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T_START=$(date +%s)

# ---- throughput -------------------------------------------------------------------
if [ "$VAL" != 1 ]; then
    # torch1 and ddp2 once per PyTorch environment: torch1_own torch1_skx ... (interleaved like the rest)
    VARR=()
    for v in $VARIANTS; do
        case $v in
        torch1 | ddp2) for e in "${PT_ENVS[@]}"; do VARR+=("${v}_$e"); done ;;
        *) VARR+=("$v") ;;
        esac
    done
    NV=${#VARR[@]}
    note "variants: ${VARR[*]}; $MODEL, batch $BATCH, $STEPS steps, $REPS repetition(s); PyTorch env $PT_ENV;" \
         "ind2 on CPUs ${CPUA[*]:0:2} (pinned: $PINNED)"
    for rep in $(seq 1 "$REPS"); do
        note "repetition $rep/$REPS"
        for k in $(seq 0 $((NV - 1))); do
            run_one "${VARR[$(((k + rep - 1) % NV))]}" "$rep"
        done
    done
fi

# ---- VAL=1: validation loss after VAL_STEPS steps, both sides -------------------------
if [ "$VAL" = 1 ]; then
    # VAL_STEPS x BATCH windows in all.  An epoch holds at most W windows (as many as fit side by
    # side in the training part), so the run is VAL_EPOCHS equal epochs of LIMIT windows each
    # (2 x 32000 for 2000 steps of 32 here); both sides evaluate at each epoch's end and the last
    # evaluation is reported.
    W=$(awk -v n="$NTOK" -v c="$CTX" 'BEGIN { tr = n - int(n * 0.05); print int(tr / (c + 1)) }')
    TOTAL=$((VAL_STEPS * BATCH))
    VAL_EPOCHS=$(((TOTAL + W - 1) / W))
    LIMIT=$((TOTAL / VAL_EPOCHS))
    if [ $((LIMIT * VAL_EPOCHS)) -ne "$TOTAL" ] || [ $((LIMIT % BATCH)) -ne 0 ]; then
        die "VAL_STEPS=$VAL_STEPS x batch $BATCH = $TOTAL windows does not split into $VAL_EPOCHS equal epochs of whole batches (at most $W windows each): pick another VAL_STEPS"
    fi
    SCHED=(--schedule "$VAL_SCHEDULE")
    [ "$VAL_SCHEDULE" = cosine ] && SCHED+=(--warmup "$VAL_WARMUP" --min-lr 0)
    DPINIT=()
    if [ "$VAL_SAME_INIT" = 1 ]; then
        "${PTENV[@]}" "$PY" bench/pytorch_gpt.py "${PTCOMMON[@]}" --epochs 0 --no-eval \
            --export-init "$WORK/init.safetensors" >"$WORK/init.log" 2>&1 ||
            { cat "$WORK/init.log" >&2; die "pytorch_gpt.py --export-init failed"; }
        DPINIT=(--init-from "$WORK/init.safetensors")
    fi
    DPCMD=(env "${PIN[@]}" "$DPTRAIN" train "${DPCOMMON[@]}" --workers 1 --batch "$BATCH" --epochs "$VAL_EPOCHS"
           --train-limit "$LIMIT" "${SCHED[@]}" "${DPINIT[@]}" --out "$WORK/val-dp")
    PTCMD=("${PTENV[@]}" "$PY" bench/pytorch_gpt.py "${PTCOMMON[@]}" --world 1 --batch "$BATCH" --epochs "$VAL_EPOCHS"
           --train-limit "$LIMIT" "${SCHED[@]}")
    [ "$VAL_SAME_INIT" = 1 ] && PTCMD+=(--init-from "$WORK/init.safetensors")
    note "VAL: $VAL_STEPS steps, schedule ${SCHED[*]}, lr $LR, same init: $VAL_SAME_INIT, side by side: $VAL_PARALLEL"
    t0=$(date +%s)
    rcd=0 rcp=0
    if [ "$VAL_PARALLEL" = 1 ]; then
        pin 0 "${DPCMD[@]}" >"$WORK/val-dp.log" 2>&1 & pid=$!
        pin 1 "${PTCMD[@]}" >"$WORK/val-pt.log" 2>&1 || rcp=$?
        wait "$pid" || rcd=$?
    else
        "${DPCMD[@]}" >"$WORK/val-dp.log" 2>&1 || rcd=$?
        "${PTCMD[@]}" >"$WORK/val-pt.log" 2>&1 || rcp=$?
    fi
    t1=$(date +%s)
    # dptrain: the last epoch record of metrics.jsonl (6 decimals; the epoch line has 4)
    vd=$(grep '"kind": "epoch"' "$WORK/val-dp/metrics.jsonl" 2>/dev/null | tail -n 1 |
        sed -n 's/.*"val_loss": \([0-9.eE+-]*\).*/\1/p')
    sd=$(grep '"kind": "epoch"' "$WORK/val-dp/metrics.jsonl" 2>/dev/null | tail -n 1 |
        sed -n 's/.*"step": \([0-9]*\).*/\1/p')
    vp=$(sed -n 's/^RESULT .*[[:space:]]val_loss=\([0-9.eE+-]*\).*/\1/p' "$WORK/val-pt.log" | tail -n 1)
    sp=$(sed -n 's/^RESULT .*[[:space:]]steps=\([0-9]*\).*/\1/p' "$WORK/val-pt.log" | tail -n 1)
    for side in dp pt; do
        r=$rcd v=$vd s=$sd
        [ "$side" = pt ] && r=$rcp v=$vp s=$sp
        if [ "$r" != 0 ] || [ -z "$v" ]; then
            note "VAL $side: no validation loss (exit $r); last lines of its output:"
            tail -n 5 "$WORK/val-$side.log" | sed 's/^/    /' >&2
            v=NA
        fi
        printf '%s\t%s\t%s\t%s\n' "$side" "$v" "${s:-NA}" "$((t1 - t0))" >>"$VALRAW"
        note "  $side: val loss $v after ${s:-?} steps"
    done
fi

# ---- report -----------------------------------------------------------------------
bench_facts gpt_vs_pytorch
[ "$VAL" = 1 ] && OUTMD=$RESULTS/gpt_vs_pytorch-val-$STAMP.md
TORCH_VER=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo unknown)
NPARAMS=$(sed -n 's/^dptrain: model .* (\([0-9]*\) parameters.*/\1/p' "$WORK"/*.log 2>/dev/null | head -n 1 || true)
DPTRAIN_BIN=$DPTRAIN
PT_ENVS_S="${PT_ENVS[*]}"
export RAW VALRAW REPS STEPS MODEL BATCH LR SEED PT_ENV PT_ENVS_S TUNED_MALLOC LOAD0 LOAD1 T_START CPU_MODEL NCPU GIT_REV TORCH_VER
export VAL_EPOCHS=${VAL_EPOCHS:-1} LIMIT=${LIMIT:-0}
export DPTRAIN_BIN NPARAMS NTOK VAL VAL_STEPS VAL_WARMUP VAL_SCHEDULE VAL_SAME_INIT VAL_PARALLEL PINNED CPUS
"$PY" - >"$OUTMD" <<'EOF'
import os, statistics, time

E = os.environ
rows = [l.rstrip("\n").split("\t") for l in open(E["RAW"]) if l.strip()]
data, cpu = {}, {}   # variant -> {rep: tokens/s}, [cores]
for variant, rep, tps, c in rows:
    if tps != "NA":
        data.setdefault(variant, {})[int(rep)] = float(tps)
    if c != "NA":
        cpu.setdefault(variant, []).append(float(c))
ENVS = E["PT_ENVS_S"].split()   # own skx (best-tuned), or one of own, skx, installed
ENVNAME = {"own": "(a) OpenBLAS's own kernels", "skx": "(b) SkylakeX kernels", "installed": "as installed"}
BEST = len(ENVS) > 1
NAMES = {"dp1": "dptrain 1 worker", "torch1": "PyTorch 1 process", "dp2": "dptrain 2 workers",
         "ddp2": "PyTorch DDP 2 processes", "ind2": "2 independent dptrain (batch/2 each)"}
for b in ("torch1", "ddp2"):
    for e in ENVS:
        NAMES[f"{b}_{e}"] = f"{NAMES[b]}, {ENVNAME[e]}"
    NAMES[b] += ", best-tuned" if BEST else f" ({ENVNAME[ENVS[0]]})"
    if not BEST:
        NAMES[f"{b}_{ENVS[0]}"] = NAMES[b]
# torch1 and ddp2: per repetition the faster of their runs in the PyTorch environments (of those
# with a figure); picks[b][e] counts the repetitions environment e gave it.
present = {r[0] for r in rows}
picks, partial = {}, []
for b in ("torch1", "ddp2"):
    runs = [f"{b}_{e}" for e in ENVS if f"{b}_{e}" in present]
    if not runs:
        continue
    picks[b] = {e: 0 for e in ENVS}
    for r in sorted({r for v in runs for r in data.get(v, {})}):
        got = [(data[v][r], v) for v in runs if r in data.get(v, {})]
        data.setdefault(b, {})[r], w = max(got)
        picks[b][w[len(b) + 1:]] += 1
        if len(got) < len(ENVS):
            partial.append(f"{b} rep {r}")
order, runs_order = [], []   # the tokens/s columns; what ran (the CPU table)
for v in ("dp1", "torch1", "dp2", "ddp2", "ind2"):
    runs = [f"{v}_{e}" for e in ENVS if f"{v}_{e}" in present] if v in picks else [v] if v in present else []
    runs_order += runs
    if v in picks:
        order += (runs if BEST else []) + [v]
    else:
        order += runs

def med(xs):
    return statistics.median(xs) if xs else None

def fmt(x, f="{:.0f}"):
    return f.format(x) if x is not None else "n/a"

def ratios(a, b, scale=1.0):
    """Per-repetition a / (scale x b), runs made side by side."""
    da, db = data.get(a, {}), data.get(b, {})
    return [da[r] / (scale * db[r]) for r in da if r in db and db[r] > 0]

def cell(rs, pct=False, target=None):
    if not rs:
        return "n/a"
    m = med(rs)
    s = f"{100 * m:.1f}% [{100 * min(rs):.1f}..{100 * max(rs):.1f}]" if pct else f"{m:.2f}x [{min(rs):.2f}..{max(rs):.2f}]"
    if target is not None:
        s += " ok" if m >= target else " **below target**"
    return s

out = []
p = out.append
val = E["VAL"] == "1"
p(f"# GPT on text: dptrain vs PyTorch {E['TORCH_VER']}" + (" -- validation loss" if val else " -- tokens/s"))
p("")
p(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, wall {time.time() - int(E['T_START']):.0f}s; "
  f"dptrain `{E['DPTRAIN_BIN']}` at git `{E['GIT_REV']}`")
p(f"- machine: **{E['CPU_MODEL']}**, {E['NCPU']} CPUs; load average at start {E['LOAD0']}, at end {E['LOAD1']}")
p(f"- model `{E['MODEL']}` ({E['NPARAMS'] or '?'} parameters), fortunes token file ({E['NTOK']} tokens, the last 5% "
  f"validate), global batch {E['BATCH']} windows, AdamW lr {E['LR']} (betas 0.9/0.999, eps 1e-8, weight decay 0), "
  f"seed {E['SEED']}, fp32, 1 thread per worker/process")
tuned_env = (f"OMP_WAIT_POLICY=PASSIVE, GLIBC_TUNABLES=`{E['TUNED_MALLOC']}` (dptrain's allocator policy), "
             "OPENBLAS_L2_SIZE unset, and OPENBLAS_CORETYPE ")
envdesc = {"own": "unset (OpenBLAS's own kernel choice)", "skx": "=SkylakeX"}
if E["PT_ENV"] == "installed":
    pdesc = " (the environment as is, thread pools pinned to 1)"
elif BEST and val:
    pdesc = f" (run (a) of the best-tuned pair: {tuned_env}{envdesc['own']})"
elif BEST:
    pdesc = (f" (best-tuned: {tuned_env}unset (a) or =SkylakeX (b), both run every repetition; "
             "the PyTorch baselines are per repetition the faster of (a) and (b))")
else:
    pdesc = f" ({tuned_env}{envdesc[ENVS[0]]})"
p(f"- PyTorch: `bench/pytorch_gpt.py` (the module of tests/torch/ref.py), environment `{E['PT_ENV']}`"
  + pdesc + "; DDP: gloo on loopback, bucket_cap_mb 25")
if not val:
    p(f"- {E['STEPS']} steps per run; tokens/s = global windows x ctx over the steps after the 5th (dptrain's "
      "`throughput:` samples/s x ctx; pytorch_gpt.py's RESULT line), no evaluation; "
      f"{E['REPS']} repetition(s), variants interleaved in rotating order; tokens/s are medians over the "
      "repetitions, ratios medians of the per-repetition ratios (min..max in brackets)")
    p(f"- ind2: two `dptrain --workers 1 --batch {int(E['BATCH']) // 2}` processes at once"
      + (f", pinned to CPUs {' and '.join(E['CPUS'].split()[:2])} (taskset)" if E["PINNED"] == "1" else ", not pinned"))
    p("")
    p(f"## Tokens/s (global, median) -- {E['CPU_MODEL']}")
    p("")
    p("| " + " | ".join(f"**{NAMES[v]}**" if BEST and v in picks else NAMES[v] for v in order) + " |")
    p("|" + "---:|" * len(order))
    p("| " + " | ".join(fmt(med(list(data.get(v, {}).values()))) for v in order) + " |")
    p("")
    if BEST and picks:
        p("Best-tuned, which run was faster (repetitions): " + "; ".join(
            f"{NAMES[b]}: " + ", ".join(f"{ENVNAME[e].split(' ')[0]} {n}" for e, n in pk.items())
            + f" of {sum(pk.values())}" for b, pk in picks.items()) + ".")
        if partial:
            p(f"**From one run only (the other gave no figure)**: {', '.join(partial)}.")
        p("")
    p("## Ratios (median of per-repetition ratios)")
    p("")
    p("| ratio | value | target |")
    p("|---|---:|---:|")
    bt = ", best-tuned" if BEST else ""
    p(f"| dptrain 1 worker / PyTorch 1 process{bt} (dp1/torch1) | {cell(ratios('dp1', 'torch1'), False, 1.5)} | >= 1.5x |")
    p(f"| dptrain 2 workers / PyTorch DDP 2 processes{bt} (dp2/ddp2) | {cell(ratios('dp2', 'ddp2'), False, 1.5)} | >= 1.5x |")
    if BEST:
        for a, b in (("dp1", "torch1"), ("dp2", "ddp2")):
            for e in ENVS:
                if f"{b}_{e}" in present:
                    p(f"| {NAMES[a]} / {NAMES[b + '_' + e]} ({a}/{b}_{e}) | {cell(ratios(a, f'{b}_{e}'))} | |")
    p(f"| dptrain 2 workers / the ceiling (dp2/ind2) | {cell(ratios('dp2', 'ind2'), True, 0.9)} | >= 90% |")
    p(f"| dptrain scaling efficiency dp2 / (2 x dp1) | {cell(ratios('dp2', 'dp1', 2), True)} | |")
    p(f"| PyTorch DDP scaling efficiency ddp2 / (2 x torch1) | {cell(ratios('ddp2', 'torch1', 2), True)} | |")
    p(f"| ceiling efficiency ind2 / (2 x dp1) | {cell(ratios('ind2', 'dp1', 2), True)} | |")
    p("")
    p("## CPU cores busy per run (median of (user+sys)/wall over the whole process, start-up included; "
      "ind2: one of its two processes)")
    p("")
    p("| " + " | ".join(NAMES[v] for v in runs_order) + " |")
    p("|" + "---:|" * len(runs_order))
    p("| " + " | ".join(fmt(med(cpu.get(v, [])), "{:.2f}") for v in runs_order) + " |")
    p("")
else:
    vr = {r[0]: r for r in (l.rstrip("\n").split("\t") for l in open(E["VALRAW"]) if l.strip())}
    sched = (f"AdamW lr {E['LR']}, linear warmup {E['VAL_WARMUP']} steps then cosine to 0 over the run "
             "(src/optim/sched.c; pytorch_gpt.py applies the same formula per step)"
             if E["VAL_SCHEDULE"] == "cosine" else f"AdamW, constant lr {E['LR']}")
    p(f"- recipe: {E['VAL_STEPS']} steps, {E['VAL_STEPS']} x {E['BATCH']} training windows in {E['VAL_EPOCHS']} epoch(s) "
      f"(`--epochs {E['VAL_EPOCHS']} --train-limit {E['LIMIT']}`), {sched}; 1 worker x 1 thread each")
    p("- initial weights: " + ("the same on both sides (PyTorch's N(0, 0.02) draw, `pytorch_gpt.py --export-init`, "
                                "dptrain `--init-from`)" if E["VAL_SAME_INIT"] == "1" else "each side its own draw")
      + "; training windows: each side its own random draw (same distribution)")
    p("- validation: dptrain's fixed windows, the last 5% of the tokens cut into consecutive windows of ctx, "
      "loss per token (dptrain: `val_loss` of its last metrics.jsonl epoch record; PyTorch: the same windows, "
      "cross-entropy summed over every position / (windows x ctx))")
    p(f"- the two runs went {'side by side, one per core' if E['VAL_PARALLEL'] == '1' else 'one after the other'}")
    p("")
    p(f"## Validation loss after {E['VAL_STEPS']} steps -- {E['CPU_MODEL']}")
    p("")
    p("| side | steps | val loss | val perplexity |")
    p("|---|---:|---:|---:|")
    import math
    for side, name in (("dp", "dptrain"), ("pt", f"PyTorch {E['TORCH_VER']}")):
        r = vr.get(side)
        if not r or r[1] == "NA":
            p(f"| {name} | n/a | n/a | n/a |")
        else:
            p(f"| {name} | {r[2]} | {float(r[1]):.4f} | {math.exp(float(r[1])):.2f} |")
            if r[2] != E["VAL_STEPS"]:
                p(f"\n**{name} ran {r[2]} steps, not the {E['VAL_STEPS']} asked for.**\n")
    d, t = vr.get("dp"), vr.get("pt")
    if d and t and d[1] != "NA" and t[1] != "NA":
        p("")
        p(f"dptrain - PyTorch: {float(d[1]) - float(t[1]):+.4f} nats per token "
          f"({100 * (float(d[1]) / float(t[1]) - 1):+.2f}%).")
    p("")
print("\n".join(out))
EOF
cat "$OUTMD"
RAWOUT=${OUTMD%.md}.tsv
if [ "$VAL" = 1 ]; then
    { printf 'side\tval_loss\tsteps\twall_s\n'; cat "$VALRAW"; } >"$RAWOUT"
    # the two runs' full logs (epoch lines, loss curves in metrics.jsonl) beside the report
    mkdir -p "${OUTMD%.md}"
    cp "$WORK/val-dp.log" "$WORK/val-pt.log" "${OUTMD%.md}/"
    [ -f "$WORK/val-dp/metrics.jsonl" ] && cp "$WORK/val-dp/metrics.jsonl" "${OUTMD%.md}/dptrain-metrics.jsonl"
else
    { printf 'variant\trep\ttokens_per_s\tcpu_cores\n'; cat "$RAW"; } >"$RAWOUT"
fi
note "report written to $OUTMD (raw figures in $RAWOUT$([ "$VAL" = 1 ] && echo ", logs in ${OUTMD%.md}/"))"
