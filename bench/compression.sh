#!/usr/bin/env bash
# Gradient compression (--compress, issue 12): speed on emulated hosts, the PyTorch DDP peer with
# its comm hooks, accuracy with and without error feedback, and resnet.  Four parts, run separately or
# together (the accuracy and resnet parts do not depend on the link, so they run on threads, one machine,
# and can run in the background, niced, while the others run):
#
#   speed     tests/netns/cluster.sh: P hosts (one core each where the cores allow), tbf-shaped
#             links at RATE, Open MPI over TCP; mpirun dptrain train --backend mpi --workers 1
#             --threads 1 per host, cnn, global batch BATCH, --max-steps STEPS.  Variants
#             none (fp32), bf16, fp16, topk:0.01, sign, powersgd:4, interleaved (the order rotates
#             each repetition), REPS repetitions.  Per run: step time = global batch / the
#             `throughput:` line (steps after the 5th), rank 0's metrics.jsonl step records after
#             the 5th: median bytes_sent (wire bytes per worker and step), compute per step
#             (forward + backward + optimizer), comm_exposed_s, compress_s + decompress_s.
#             t_link = 2(P-1)/P x 4 x parameters / rate: the fp32 all-reduce's link time.
#   peer      the same hosts, link and batch: PyTorch 1.13 DDP over gloo (bench/pytorch_ddp.py, one
#             rank per host, started in the host's namespace on its cores), hooks none,
#             fp16 (fp16_compress_hook), bf16 (bf16_compress_hook), powersgd (powerSGD_hook, rank
#             4, start_powerSGD_iter 2).  A hook that fails to run is reported as failed, with its
#             error line.  Interleaved with the same rotation, REPS repetitions.
#   accuracy  dptrain train --backend thread --workers 2 --threads 1, cnn, EPOCHS epochs, batch
#             128, SGD lr 0.05 momentum 0.9, seed SEED (1); test accuracy on the full test set after the
#             last epoch.  Variants none, bf16, powersgd:4, topk:0.01, sign, the last three also
#             with --no-error-feedback.
#   resnet    the same recipe on resnet (BatchNorm, residual blocks, 1-D tensors), short:
#             RESNET_EPOCHS epochs (1) on the first RESNET_LIMIT training samples (all if 0), for
#             none, bf16, fp16, powersgd:4, topk:0.01, sign (RESNET_VARIANTS): every scheme runs, its
#             accuracy against fp32's after the same steps (pick RESNET_LIMIT and RESNET_EPOCHS long
#             enough for fp32 to be clearly trained: a short run shows convergence starting, not the end).
#
# Usage (as root for speed/peer, after make):
#   bash bench/compression.sh [--parts "speed peer accuracy resnet"] [--hosts "2"] [--rate 100mbit]
#        [--reps 3] [--steps 40] [--batch 128] [--epochs 5] [--resnet-epochs 1] [--resnet-limit N]
#        [--cnn-limit N]   (--*-limit N: train on the first N samples only; for a quick smoke run)
# Environment: DPTRAIN (./build/dptrain; copied to a temporary directory first, so a rebuild
# during the run does not change it), PY (/usr/bin/python3), RESULTS (bench/results), NICE (10,
# for the accuracy part), CNN_VARIANTS (the accuracy part's cnn runs, "SPEC" or "SPEC/noef" for
# --no-error-feedback; all eight by default), RESNET_VARIANTS (the resnet part's runs, the same form; all six
# by default), SEED (1: the accuracy and resnet parts' --seed), PEER_TIMEOUT (300 s per PyTorch run; a hung run is reported as failed).
# Output: RESULTS/compression-STAMP.md with the raw rows of every part in
# RESULTS/compression-STAMP.tsv (part, hosts, rate, variant, rep, and the part's figures), and the
# runs' logs in RESULTS/compression-STAMP/ (the accuracy runs' epoch lines).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck disable=SC2034  # bench_facts reads it
ROOT=$PWD
DPTRAIN=${DPTRAIN:-./build/dptrain}
PY=${PY:-/usr/bin/python3}
RESULTS=${RESULTS:-bench/results}
NICE=${NICE:-10}
CNN_VARIANTS=${CNN_VARIANTS:-"none bf16 powersgd:4 topk:0.01 sign powersgd:4/noef topk:0.01/noef sign/noef"}
RESNET_VARIANTS=${RESNET_VARIANTS:-"none bf16 fp16 powersgd:4 topk:0.01 sign"}
SEED=${SEED:-1}  # the accuracy and resnet parts' --seed
PEER_TIMEOUT=${PEER_TIMEOUT:-300}  # seconds per PyTorch run: powerSGD_hook on gloo can hang
PARTS="speed peer accuracy resnet" HOSTS=2 RATE=100mbit REPS=3 STEPS=40 BATCH=128 EPOCHS=5
RESNET_EPOCHS=1 RESNET_LIMIT=0 CNN_LIMIT=0
die() { echo "compression: error: $*" >&2; exit 1; }
note() { echo "compression: $*" >&2; }
while (($#)); do
  [[ $# -ge 2 ]] || die "option $1 needs a value"
  case $1 in
    --parts) PARTS=$2 ;;
    --hosts) HOSTS=$2 ;;
    --rate) RATE=$2 ;;
    --reps) REPS=$2 ;;
    --steps) STEPS=$2 ;;
    --batch) BATCH=$2 ;;
    --epochs) EPOCHS=$2 ;;
    --resnet-epochs) RESNET_EPOCHS=$2 ;;
    --resnet-limit) RESNET_LIMIT=$2 ;;
    --cnn-limit) CNN_LIMIT=$2 ;;
    *) die "unknown option $1 (see the header of $0)" ;;
  esac
  shift 2
done
HOSTS=${HOSTS//,/ } PARTS=${PARTS//,/ }
for v in $HOSTS $REPS $STEPS $BATCH $EPOCHS; do [[ $v =~ ^[1-9][0-9]*$ ]] || die "'$v' is not a positive count"; done
[[ $SEED =~ ^[0-9]+$ && $RESNET_EPOCHS =~ ^[0-9]+$ && $RESNET_LIMIT =~ ^[0-9]+$ && $CNN_LIMIT =~ ^[0-9]+$ ]] ||
  die "bad --resnet-epochs/--resnet-limit/--cnn-limit or SEED"
((STEPS > 10)) || die "--steps must exceed 10 (the first 5 steps are not counted)"
for p in $PARTS; do [[ $p == speed || $p == peer || $p == accuracy || $p == resnet ]] || die "unknown part '$p'"; done
[[ -x $DPTRAIN ]] || die "$DPTRAIN not built (make)"

# shellcheck source=bench/lib.sh
source bench/lib.sh
bench_facts compression
BASE=${OUTMD%.md}
LOGS=$BASE
mkdir -p "$LOGS"
WORK=$(mktemp -d /tmp/compression.XXXXXX)
cp "$DPTRAIN" "$WORK/dptrain" || die "cannot copy $DPTRAIN"
BIN=$WORK/dptrain
RAW=$BASE.tsv
printf 'part\thosts\trate\tvariant\trep\tstep_s\tbytes_sent\tcompute_s\texposed_s\tcompress_s\ttest_acc\ttime_s\tnote\n' >"$RAW"
row() { local IFS=$'\t'; echo "$*" >>"$RAW"; }
t0=$(date +%s)

# stepstats OUT: from rank 0's step records after the 5th, medians:
# "bytes_sent compute_s exposed_s compress_s" (compress_s: compress + decompress)
stepstats() {
  "$PY" -c '
import json, sys, statistics as st
rs = [json.loads(l) for l in open(sys.argv[1]) if "\"kind\": \"step\"" in l][5:]
m = lambda f: st.median(f(r) for r in rs)
print(m(lambda r: r.get("bytes_sent", 0)), m(lambda r: r["forward_s"] + r["backward_s"] + r["optimizer_s"]),
      m(lambda r: r["comm_exposed_s"]), m(lambda r: r.get("compress_s", 0) + r.get("decompress_s", 0)))' \
    "$1/metrics.jsonl" 2>/dev/null || echo "NA NA NA NA"
}

# ---- accuracy (threads, one machine) ----
acc_run() { # acc_run MODEL VARIANT EPOCHS [LIMIT]
  local model=$1 v=$2 ep=$3 lim=${4:-0} spec=${2%/noef} args=() tag
  tag=$model-${2//[:\/]/_}
  [[ $v == */noef ]] && args+=(--no-error-feedback)
  ((lim > 0)) && args+=(--train-limit "$lim")
  [[ $spec == none ]] || args+=(--compress "$spec")
  local s=$SECONDS
  nice -n "$NICE" "$BIN" train --model "$model" --backend thread --workers 2 --threads 1 --batch 128 --lr 0.05 \
    --momentum 0.9 --seed "$SEED" --epochs "$ep" --progress lines "${args[@]}" --out "$WORK/$tag" >"$LOGS/acc-$tag.log" 2>&1
  local rc=$? acc
  acc=$(sed -n 's/^done: .*test acc \([0-9.]*\)%.*/\1/p' "$LOGS/acc-$tag.log" | tail -1)
  ((rc == 0)) || note "accuracy $model $v failed (rc $rc): $(tail -1 "$LOGS/acc-$tag.log")"
  row accuracy 1 threads "$model:$v" 1 NA NA NA NA NA "${acc:-NA}" $((SECONDS - s)) "epochs $ep limit $lim rc $rc"
  note "accuracy $model $v: ${acc:-NA}% ($((SECONDS - s)) s)"
}
part_accuracy() {
  local v
  for v in $CNN_VARIANTS; do acc_run cnn "$v" "$EPOCHS" "$CNN_LIMIT"; done
}
part_resnet() {
  local v
  ((RESNET_EPOCHS > 0)) || return 0
  for v in $RESNET_VARIANTS; do acc_run resnet "$v" "$RESNET_EPOCHS" "$RESNET_LIMIT"; done
}

# ---- speed and peer (emulated hosts) ----
SPEED_VARS=(none bf16 fp16 topk:0.01 sign powersgd:4)
PEER_VARS=(none fp16 bf16 powersgd)
speed_run() { # speed_run VARIANT REP
  local v=$1 rep=$2 tag=$P-${1//:/_}-$2 args=()
  [[ $v == none ]] || args+=(--compress "$v")
  cluster_run -np "$P" "$BIN" train --backend mpi --workers 1 --threads 1 --model cnn --batch "$BATCH" --lr 0.05 \
    --momentum 0.9 --seed 1 --epochs 1 --max-steps "$STEPS" --progress none --test-limit 1 "${args[@]}" \
    --timeline "$WORK/$tag/tl.json" --out "$WORK/$tag" >"$LOGS/speed-$tag.log" 2>&1 ||
    note "speed $v rep $rep failed: $(tail -1 "$LOGS/speed-$tag.log")"
  local sps st
  sps=$(dptrain_sps "$LOGS/speed-$tag.log")
  read -r -a st < <(stepstats "$WORK/$tag")
  local step=NA
  [[ -n $sps ]] && step=$(awk -v n="$BATCH" -v s="$sps" 'BEGIN { printf "%.5f", n / s }')
  row speed "$P" "$RATE" "$v" "$rep" "$step" "${st[0]}" "${st[1]}" "${st[2]}" "${st[3]}" NA NA ""
  [[ -f $WORK/$tag/tl.json ]] && cp "$WORK/$tag/tl.json" "$LOGS/speed-$tag.tl.json"
  note "speed $P hosts $RATE $v rep $rep: step ${step} s, bytes ${st[0]}, compute ${st[1]} s, exposed ${st[2]} s"
}
peer_run() { # peer_run HOOK REP: one pytorch_ddp.py rank per host, in the host's namespace, on its cores
  local hook=$1 rep=$2 tag=$P-pt-$1-$2 port=$((29500 + RANDOM % 1000)) k pids=() ns ip0
  ip0=$(awk '$1 == "h0" {print $2}' "$CLUSTER_STATE/hosts")
  for ((k = 0; k < P; k++)); do
    ns=$(awk -v h="h$k" '$1 == h {print $3}' "$CLUSTER_STATE/hosts")
    GLOO_SOCKET_IFNAME=eth0 timeout "$PEER_TIMEOUT" ip netns exec "$ns" taskset -c "$(cluster_cpus "$k")" "$PY" bench/pytorch_ddp.py \
      --model cnn --world "$P" --rank "$k" --port "$port" --master-addr "$ip0" --threads 1 --batch "$BATCH" \
      --lr 0.05 --momentum 0.9 --seed 1 --max-steps "$STEPS" --no-eval --comm-hook "$hook" --powersgd-rank 4 \
      >"$LOGS/peer-$tag-r$k.log" 2>&1 &
    pids+=($!)
  done
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  local sps err=''
  sps=$(sed -n 's/^RESULT .*samples_per_s=\([0-9.]*\) .*/\1/p' "$LOGS/peer-$tag-r0.log" | tail -1)
  if ((rc != 0)) || [[ -z $sps ]]; then
    err=$(grep -h -m1 -E 'Error|error|enforce' "$LOGS"/peer-"$tag"-r*.log | head -1 | cut -c1-160)
    note "peer $hook rep $rep failed (rc $rc): $err"
  fi
  local step=NA
  [[ -n $sps ]] && step=$(awk -v n="$BATCH" -v s="$sps" 'BEGIN { printf "%.5f", n / s }')
  row peer "$P" "$RATE" "pytorch:$hook" "$rep" "$step" NA NA NA NA NA NA "${err:+failed: $err}"
  note "peer $P hosts $RATE $hook rep $rep: step $step s"
}
if [[ " $PARTS " == *" speed "* || " $PARTS " == *" peer "* ]]; then
  # shellcheck source=tests/netns/cluster.sh
  source tests/netns/cluster.sh
  why=$(cluster_check) || die "$why"
  [[ $("$BIN" --help 2>&1) == *"mpi (built in)"* ]] || die "$DPTRAIN was built without MPI"
  _cl_rate_bytes "$RATE" >/dev/null || die "bad rate '$RATE' (tc syntax: 100mbit)"
  # shellcheck disable=SC2034  # used by cluster_trap / cluster_up
  EXTRA_CLEANUP="rm -rf $WORK" CLUSTER_PREFIX=dpc-$$
  cluster_trap
else
  trap 'rm -rf "$WORK"' EXIT
fi
NP=$("$BIN" plan --model cnn --workers 1 2>/dev/null | sed -n 's/^model \([0-9]*\) parameters.*/\1/p' | head -1)
CPUS_NOTE=''
for P in $HOSTS; do
  [[ " $PARTS " == *" speed "* || " $PARTS " == *" peer "* ]] || break
  cluster_down
  cluster_up "$P" "$RATE" >/dev/null || die "cluster_up $P failed"
  CPUS_NOTE+="$P hosts: $(awk '{printf "%s%s: %s", (NR > 1 ? "; " : ""), $1, $2}' "$CLUSTER_STATE/cpus"). "
  for rep in $(seq 1 "$REPS"); do
    if [[ " $PARTS " == *" speed "* ]]; then
      n=${#SPEED_VARS[@]}
      for ((k = 0; k < n; k++)); do speed_run "${SPEED_VARS[$(((k + rep - 1) % n))]}" "$rep"; done
    fi
    if [[ " $PARTS " == *" peer "* ]]; then
      n=${#PEER_VARS[@]}
      for ((k = 0; k < n; k++)); do peer_run "${PEER_VARS[$(((k + rep - 1) % n))]}" "$rep"; done
    fi
  done
done
[[ " $PARTS " == *" accuracy "* ]] && part_accuracy
[[ " $PARTS " == *" resnet "* ]] && part_resnet

# ---- report ----
export SEED RAW NP BATCH STEPS REPS EPOCHS RESNET_EPOCHS RESNET_LIMIT CNN_LIMIT CPU_MODEL NCPU GIT_REV LOAD1 CPUS_NOTE
export LOAD2 WALL=$(($(date +%s) - t0)) NAME=${BASE##*/} PARTS
LOAD2=$(cut -d' ' -f1-3 /proc/loadavg)
"$PY" - >"$OUTMD" <<'EOF'
import os, statistics as st
E = os.environ
rows = [l.rstrip("\n").split("\t") for l in open(E["RAW"])][1:]
H = "part hosts rate variant rep step_s bytes_sent compute_s exposed_s compress_s test_acc time_s note".split()
rows = [dict(zip(H, r)) for r in rows if len(r) >= len(H) - 1]
def f(x):
    try: return float(x)
    except (TypeError, ValueError): return float("nan")
def med(xs):
    xs = [x for x in xs if x == x]
    return st.median(xs) if xs else float("nan")
np_ = int(E["NP"] or 0)
print("# Gradient compression: speed on emulated hosts, PyTorch DDP peer, accuracy\n")
print(f"- CPU: {E['CPU_MODEL']}, {E['NCPU']} cores; git `{E['GIT_REV']}`; load average at start {E['LOAD1']}, at end "
      f"{E['LOAD2']}; {E['WALL']} s in all; parts: {E['PARTS']}")
print(f"- raw rows: `{E['NAME']}.tsv`; logs: `{E['NAME']}/`")
if E["CPUS_NOTE"]: print(f"- cores per emulated host: {E['CPUS_NOTE']}")
print()
for part in ("speed", "peer"):
    rs = [r for r in rows if r["part"] == part]
    if not rs: continue
    keys = sorted({(r["hosts"], r["rate"]) for r in rs})
    for hosts, rate in keys:
        P = int(hosts)
        sub = [r for r in rs if (r["hosts"], r["rate"]) == (hosts, rate)]
        order = list(dict.fromkeys(r["variant"] for r in sub))
        by = {v: [r for r in sub if r["variant"] == v] for v in order}
        if part == "speed":
            mult = {"k": 1e3, "m": 1e6, "g": 1e9}
            rl = rate.lower().replace("bit", "")
            B = float(rl[:-1]) * mult[rl[-1]] / 8 if rl[-1] in mult else float(rl) / 8
            tl = 2 * (P - 1) / P * 4 * np_ / B
            base = by.get("none", [])
            tc = med([f(r["compute_s"]) for r in base])
            print(f"## Speed: {P} hosts, {rate} links, cnn ({np_} parameters), global batch {E['BATCH']}, {E['STEPS']} steps "
                  f"(first 5 not counted), {E['REPS']} interleaved repetitions, medians [min..max]\n")
            print(f"- fp32 all-reduce link time t_link = 2(P-1)/P x 4 x {np_} B / {rate} = {tl*1e3:.1f} ms; compute per step "
                  f"(fp32 run, rank 0) {tc*1e3:.1f} ms: t_link / compute = {tl/tc:.2f}\n")
            print("| variant | step | speedup vs fp32 | wire bytes/step (worker 0) | bytes cut | compute/step | exposed comm/step | compress+decompress/step |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            b0 = med([f(r["bytes_sent"]) for r in base])
            s0 = {r["rep"]: f(r["step_s"]) for r in base}
            for v in order:
                xs = by[v]
                steps = [f(r["step_s"]) for r in xs]
                sp = [s0[r["rep"]] / f(r["step_s"]) for r in xs if r["rep"] in s0 and f(r["step_s"]) > 0]
                sp = [x for x in sp if x == x]
                b = med([f(r["bytes_sent"]) for r in xs])
                spc = f"{med(sp):.2f}x [{min(sp):.2f}..{max(sp):.2f}]" if sp else "n/a"
                stp = f"{med(steps)*1e3:.1f} ms [{min(steps)*1e3:.0f}..{max(steps)*1e3:.0f}]" if any(s == s for s in steps) else "failed"
                print(f"| {'none (fp32)' if v == 'none' else v} | {stp} | {spc} | {b/1e3:.1f} kB | {b0/b if b else float('nan'):.1f}x | "
                      f"{med([f(r['compute_s']) for r in xs])*1e3:.1f} ms | {med([f(r['exposed_s']) for r in xs])*1e3:.1f} ms | "
                      f"{med([f(r['compress_s']) for r in xs])*1e3:.1f} ms |")
            print()
        else:
            print(f"## Peer: PyTorch 1.13 DDP over gloo, {P} hosts, {rate} links, cnn, global batch {E['BATCH']}, "
                  f"{E['STEPS']} steps, {E['REPS']} interleaved repetitions\n")
            print("| PyTorch hook | step | note |")
            print("|---|---:|---|")
            for v in order:
                xs = by[v]
                steps = [f(r["step_s"]) for r in xs if f(r["step_s"]) == f(r["step_s"])]
                notes = "; ".join(sorted({r["note"] for r in xs if r.get("note")}))
                stp = f"{med(steps)*1e3:.1f} ms [{min(steps)*1e3:.0f}..{max(steps)*1e3:.0f}]" if steps else "failed"
                print(f"| {v.split(':', 1)[1]} | {stp} | {notes} |")
            print()
rs = [r for r in rows if r["part"] == "accuracy"]
if rs:
    cnn = any(r["variant"].startswith("cnn:") for r in rs)
    res = any(r["variant"].startswith("resnet:") for r in rs)
    print(f"## Accuracy: threads (--workers 2 --threads 1, one machine), batch 128, SGD lr 0.05 momentum 0.9, seed {E['SEED']}; "
          + (f"cnn {E['EPOCHS']} epochs" + (f" on the first {E['CNN_LIMIT']} training samples" if E["CNN_LIMIT"] != "0" else "") if cnn else "")
          + ("; " if cnn and res else "")
          + (f"resnet {E['RESNET_EPOCHS']} epoch(s)"
             + (f" on the first {E['RESNET_LIMIT']} training samples" if E["RESNET_LIMIT"] != "0" else "") if res else "")
          + "; full test set\n")
    print("| model | scheme | error feedback | test acc | vs fp32 | time |")
    print("|---|---|---|---:|---:|---:|")
    base = {}
    for r in rs:
        m, v = r["variant"].split(":", 1)
        if v == "none": base[m] = f(r["test_acc"])
    for r in rs:
        m, v = r["variant"].split(":", 1)
        ef = "no" if v.endswith("/noef") else ("yes" if v.split(":")[0] in ("topk", "sign", "powersgd") else "-")
        a = f(r["test_acc"])
        d = a - base.get(m, float("nan"))
        print(f"| {m} | {v.replace('/noef', '') if v != 'none' else 'none (fp32)'} | {ef} | {a:.2f}% | "
              f"{'' if v == 'none' else f'{d:+.2f}'} | {r['time_s']} s |")
    print()
EOF
cat "$OUTMD"
note "report: $OUTMD (raw: $RAW)"
