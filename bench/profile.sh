#!/usr/bin/env bash
# Where each model's step goes (issue 32, S1): one worker, one thread, `perf record` (cpu-clock
# samples at 1999 Hz, after DELAY_MS of start-up: data loading and initialisation are not the
# step) over about SECONDS of training, for each model of MODELS:
#
#   mlp      --model mlp --batch 128                       (Fashion-MNIST)
#   cnn      --model cnn --batch 128
#   resnet   --model resnet --batch 128
#   gpt      --model gpt:layers=4,heads=4,dim=128,ctx=64 --batch 32 --optim adamw  (the fortunes tokens)
#
# and a model with a suffix: M/dp2 runs 2 workers of 1 thread, M/det2 the same with
# --deterministic (where deterministic mode's cost goes: issue 32, S4).
#
# Each model's samples are grouped into kernels by symbol (the table in classify() below: oneDNN's
# JIT code, which perf cannot name, is its GEMMs and convolutions) and reported as shares of the
# profiled time.  Efficiencies:
#   matmul   (model FLOPs per second) / (share of the matmul kernels x measured peak): every
#            FLOP the MFU counts is in them (GEMMs, and convolutions as im2col + GEMM), so
#            their own FLOP rate is MFU / share
#   optimizer the bytes it moves per step (SGD with momentum: read w, g, m, write w, m: 20 B per
#            parameter; AdamW: 28 B) over its time per step (the metrics' optimizer_s), against
#            a copy of the same working set (numpy, one array into another, read + write bytes
#            per second, the best of 30): the bandwidth of the cache level that set lives in
# The peak is the one dptrain measures at start (its throughput line); the table says which.
#
#   bash bench/profile.sh                     # about 2 minutes
#   MODELS="mlp gpt" SECONDS_RUN=20 bash bench/profile.sh
# Writes bench/results/profile-<date>.md, and the perf reports (text, symbols of 0.01% and more) in
# bench/results/profile-<date>/MODEL.txt.  Needs perf (linux-perf) and `make`.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
MODELS=${MODELS:-mlp cnn resnet gpt}
SECONDS_RUN=${SECONDS_RUN:-10}
DELAY_MS=${DELAY_MS:-3000}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
RESULTS=${RESULTS:-bench/results}
DPTRAIN=${DPTRAIN:-./build/dptrain}
PY=${PY:-/usr/bin/python3}
TOKENS=${TOKENS:-}
GPT=gpt:layers=4,heads=4,dim=128,ctx=64
# shellcheck disable=SC2034 # (lib.sh reads $ROOT)
ROOT=$PWD
# shellcheck source=lib.sh
source bench/lib.sh
bench_start profile
command -v perf >/dev/null || die "perf not found (Debian package linux-perf)"
[[ -x $DPTRAIN ]] || die "build $DPTRAIN first (make)"
DIR=$RESULTS/profile-$STAMP
mkdir -p "$DIR"
[[ $MODELS == *gpt* ]] && bench_tokens

# steps for about SECONDS_RUN of training at this machine's rate (a first guess per model, from
# docs/results.md's single-worker rates), plus the start-up skipped
for name in $MODELS; do
    m=${name%%/*} more=()
    case $name in
    */dp2) more=(--workers 2) ;;
    */det2) more=(--workers 2 --deterministic) ;;
    */*) die "unknown variant $name (M/dp2, M/det2)" ;;
    *) more=(--workers 1) ;;
    esac
    case $m in
    mlp) opts=(--model mlp --data "$DATA" --batch 128 --lr 0.05 --momentum 0.9) rate=250 ;;
    cnn) opts=(--model cnn --data "$DATA" --batch 128 --lr 0.05 --momentum 0.9) rate=22 ;;
    resnet) opts=(--model resnet --data "$DATA" --batch 128 --lr 0.05 --momentum 0.9) rate=3 ;;
    gpt) opts=(--model "$GPT" --data "$TOKENS" --batch 32 --optim adamw --lr 1e-3) rate=11 ;;
    *) die "unknown model $m" ;;
    esac
    steps=$((rate * SECONDS_RUN + rate * DELAY_MS / 1000 + 10))
    f=${name//\//-}
    note "$name: $steps steps"
    perf record -F 1999 -D "$DELAY_MS" -o "$WORK/$f.data" -- "$DPTRAIN" train "${opts[@]}" "${more[@]}" --threads 1 \
        --epochs 1000 --max-steps "$steps" --test-limit 100 --progress none --out "$WORK/$f" >"$WORK/$f.log" 2>&1 ||
        { cat "$WORK/$f.log" >&2; die "$name failed"; }
    # the report, after the run's throughput line (as a comment, which perf's own lines are too)
    { sed -n 's/^throughput:/# dptrain throughput:/p' "$WORK/$f.log"
      perf report -i "$WORK/$f.data" --no-children --sort dso,sym --stdio --percent-limit 0.01 2>/dev/null; } >"$DIR/$f.txt"
    # oneDNN's JIT code has no symbols: each address is a line of its own, and the blocked
    # convolutions spread their samples over thousands below the 0.01% limit.  Their sum is
    # one line more, from the report by dso.
    jit_all=$(perf report -i "$WORK/$f.data" --no-children --sort dso --stdio 2>/dev/null |
      awk '/\[JIT\]/ {sub("%", "", $1); s += $1} END {printf "%.2f", s}')
    jit_listed=$(awk '!/^#/ && /\[JIT\]/ {sub("%", "", $1); s += $1} END {printf "%.2f", s}' "$DIR/$f.txt")
    awk -v a="$jit_all" -v b="$jit_listed" 'BEGIN {if (a - b > 0.005) printf "    %6.2f%%  [JIT] tid 0  [.] (the addresses below 0.01%% each)\n", a - b}' >>"$DIR/$f.txt"
done

"$PY" - "$DIR" "$WORK" "$CPU_MODEL" "$NCPU" "$LOAD1" "$GIT_REV" $MODELS <<'PYEOF' >"$RESULTS/profile-$STAMP.md"
import json, re, statistics, sys, time
import numpy as np
d, work, cpu, ncpu, load, rev = sys.argv[1:7]
models = sys.argv[7:]

def copy_bw(nbytes):
    """read + write bytes per second of a copy whose two arrays hold nbytes together"""
    n = max(1024, nbytes // 8)
    src, dst = np.ones(n, np.float32), np.zeros(n, np.float32)
    best = float("inf")
    for _ in range(30):
        t0 = time.perf_counter(); np.copyto(dst, src); best = min(best, time.perf_counter() - t0)
    return 8 * n / best

# symbol -> kernel group, first match wins
groups = [
    ("matmul (oneDNN JIT: GEMMs, convolutions)", r"^\[JIT\]"),
    ("matmul (library)", r"gemm|sgemm|dnnl|jit_|libopenblas"),
    ("im2col / col2im", r"im2col|col2im"),
    ("convolution (own loops: bias, small kernels)", r"conv_|fwd_chunk|bwd_chunk"),
    ("bias and activation on the GEMM's tiles", r"_post_tile"),
    ("bias sums, residual blocks' own loops", r"colsum|resblock_|block_forward|block_backward|same_range"),
    ("attention", r"attn|attention|softmax"),
    ("normalisation", r"batchnorm|layernorm|bn_|\bln_|_norm"),
    ("activation", r"relu|gelu|tanh|sigmoid"),
    ("pooling", r"pool"),
    ("loss", r"cross_entropy|loss|log_softmax|xent"),
    ("optimizer", r"sgd|adamw|adam|optim"),
    ("embedding", r"embed"),
    ("data (loader, batch)", r"loader|batch_of|normalize|shuffle|philox|rng|load_|gather_rows"),
    ("memcpy / memset", r"memmove|memcpy|memset"),
    ("checks (finite, norms)", r"nonfinite|sumsq|norm2"),
    ("deterministic sums (fixed point)", r"fixed|det_|sync_mean"),
    ("communication", r"comm_|allreduce|reduce_|ring_|rhd_"),
    ("allocator (malloc, free)", r"^_int_|malloc|cfree|memalign|unlink_chunk"),
    ("threads (libgomp, scheduler)", r"libgomp|gomp_|sched_yield|futex|__schedule|pthread_"),
    ("kernel (page faults, syscalls)", r"\[kernel"),
]

def classify(dso, sym):
    key = f"{dso} {sym}"
    if dso.startswith("[JIT]"): return groups[0][0]
    for name, rx in groups[1:]:
        if re.search(rx, key, re.I): return name
    return "other"

print(f"# Where the step goes: bash bench/profile.sh at {rev}")
print()
print(f"CPU: {cpu}, {ncpu} cores; load average at the start: {load}.")
print("One worker, one thread; perf record at 1999 Hz after the start-up; shares of the profiled time.")
for name in models:
    m = name.replace("/", "-")
    rows, total = {}, 0.0
    top = []
    for line in open(f"{d}/{m}.txt"):
        mm = re.match(r"\s*([0-9.]+)%\s+(\S+(?: tid \d+)?)\s+\[(.)\]\s+(.*\S)", line)
        if not mm: continue
        pct, dso, _, sym = float(mm.group(1)), mm.group(2), mm.group(3), mm.group(4)
        g = classify(dso, sym)
        rows[g] = rows.get(g, 0) + pct
        total += pct
        if len(top) < 8: top.append((pct, dso, sym))
    thr = next((l[len("# dptrain "):].strip() for l in open(f"{d}/{m}.txt") if l.startswith("# dptrain throughput:")), "")
    mt = re.search(r"([0-9.]+) (samples|tokens)/s.*MFU ([0-9.]+)% of \d+ x (\d+) GFLOP/s", thr)
    mfu = float(mt.group(3)) / 100 if mt else float("nan")
    peak = float(mt.group(4)) if mt else float("nan")
    print()
    print(f"## {name}")
    print()
    print(f"`{thr}`")
    print()
    print("| kernel | share of the step | own efficiency |")
    print("|---|---:|---|")
    mat = rows.get(groups[0][0], 0) + rows.get(groups[1][0], 0)
    opt_eff = ""
    try:
        recs = [json.loads(l) for l in open(f"{work}/{m}/metrics.jsonl")]
        st = [r for r in recs if r.get("kind") == "step"][5:]
        opt_s = statistics.median(r["optimizer_s"] for r in st)
        nparams = int(re.search(r"\((\d+) parameters", open(f"{work}/{m}.log").read()).group(1))
        per = 28 if m.startswith("gpt") else 20
        bw = copy_bw(per * nparams)
        if opt_s > 0:
            rate = per * nparams / opt_s
            opt_eff = (f"{rate / 1e9:.1f} GB/s ({per} B x {nparams} parameters in {opt_s * 1e3:.2f} ms per step) = "
                       f"{100 * rate / bw:.0f}% of a copy of that working set ({bw / 1e9:.1f} GB/s)")
    except Exception as e:  # (a model without step metrics: no optimizer figure)
        opt_eff = f"n/a ({e})"
    for g, _ in groups + [("other", "")]:
        if g not in rows: continue
        eff = ""
        if g.startswith("matmul") and mat > 0 and mfu == mfu:
            eff = f"together {100 * mfu / (mat / 100):.0f}% of the {peak:.0f} GFLOP/s peak (MFU / their share)" if g == groups[0][0] else "(with the line above)"
        if g == "optimizer": eff = opt_eff
        print(f"| {g} | {rows[g]:.1f}% | {eff} |")
    print()
    print("Top symbols: " + "; ".join(f"{p:.1f}% {s if not dso.startswith('[JIT]') else '(oneDNN JIT code)'}" for p, dso, s in top))
PYEOF
echo "wrote $RESULTS/profile-$STAMP.md and $DIR/"
