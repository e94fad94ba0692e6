#!/usr/bin/env bash
# Pipeline against data parallelism across 2 emulated hosts (issue 31, Q4): where the link is slow,
# a pipeline sends each micro-batch's activations across it, data parallelism the whole gradient.
#
#   bash bench/netns_pipeline.sh            # as root, after make; RATES="1gbit 200mbit" REPS=3 STEPS=24
#   MODEL=gpt:layers=4,heads=4,dim=128,ctx=64 bash bench/netns_pipeline.sh
#
# Hosts: tests/netns/cluster.sh, 2 network namespaces joined by veth links shaped to RATE by tbf
# (both ways), Open MPI over TCP only, each host on its own core.  For each rate, REPS repetitions
# of (the order rotates):
#
#   dp    cluster_run -np 2 dptrain train --workers 1 ...                 2 replicas, ring all-reduce
#   pp    cluster_run -np 2 dptrain train --workers 1 --pp 2 --micro-batches M ...   2 stages, 1f1b
#   one   one process, one worker, on host h0's core (no network): the reference
#
# MODEL (default gpt:layers=4,heads=4,dim=256,ctx=16: 3.2M parameters, so 12.9 MB of gradient
# against 1 MB of activations per step each way), global batch 64 windows of the fortunes token
# file, AdamW lr 1e-3, --max-steps STEPS; samples/s after the 5th step (the `throughput:` line).
# Per step, the bytes each host sends: dp's ring all-reduce 2(P-1)/P x 4 x parameters; pp's
# activations batch x ctx x dim x 4 forward and as much backward, the tied embedding's gradient
# and values (vocab x dim x 4, twice), the agreement's 32 bytes.  At rate B the link alone takes
# bytes / B: printed beside the measurements.
# Output: bench/results/netns_pipeline-<stamp>.md and .tsv.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
RESULTS=${RESULTS:-$ROOT/bench/results}
DPTRAIN=${DPTRAIN:-$ROOT/build/dptrain}
RATES=${RATES:-1gbit 200mbit}
REPS=${REPS:-3}
STEPS=${STEPS:-24}
MICRO=${MICRO:-8}
MODEL=${MODEL:-gpt:layers=4,heads=4,dim=256,ctx=16}
TOKENS=${TOKENS:-}
PY=${PY:-python3}
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
bench_facts netns_pipeline
die() { echo "netns_pipeline: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }
[[ $STEPS =~ ^[0-9]+$ ]] && ((STEPS > 10)) || die "STEPS must exceed 10 (the first 5 steps are not counted)"
# shellcheck source=../tests/netns/cluster.sh
source tests/netns/cluster.sh
why=$(cluster_check) || die "$why"
[[ -x $DPTRAIN ]] || die "$DPTRAIN not built (make)"
[[ $("$DPTRAIN" --help 2>&1) == *"mpi (built in)"* ]] || die "$DPTRAIN was built without MPI"
for r in $RATES; do _cl_rate_bytes "$r" >/dev/null || die "bad rate '$r' (tc syntax: 1gbit, 200mbit)"; done
WORK=$(mktemp -d /tmp/netns_pipeline.XXXXXX)
bench_cleanup() { rm -rf "$WORK"; }
# shellcheck disable=SC2034  # used by cluster_trap
EXTRA_CLEANUP=bench_cleanup
# shellcheck disable=SC2034  # cluster_up reads it
CLUSTER_PREFIX=dpp-$$
cluster_trap
bench_tokens
cp "$TOKENS" "$WORK/tokens.bin" # (on a path every host sees: the same file system)
COMMON=(--model "$MODEL" --data "$WORK/tokens.bin" --batch 64 --optim adamw --lr 1e-3 --max-steps "$STEPS"
        --progress none --threads 1)
NP=$("$DPTRAIN" plan --model "$MODEL" --workers 1 --json 2>/dev/null | sed -n 's/.*"grad_bytes": \([0-9]*\),.*/\1/p')
[[ -n $NP ]] || die "cannot read the gradient's size of $MODEL (dptrain plan --json)"
NP=$((NP / 4)) # (fp32)
TSV=${OUTMD%.md}.tsv
printf 'rate\tvariant\trep\tsamples_s\n' >"$TSV"
cluster_up 2 "${RATES%% *}" >/dev/null || die "cannot build the emulated hosts"
note "netns_pipeline: $CPU_MODEL, $NCPU CPUs; hosts' cores: $(cluster_cpus 0) and $(cluster_cpus 1); $MODEL, $NP parameters"
layout=""
for rate in $RATES; do
  cluster_shape "$rate" >/dev/null || die "cannot shape the links to $rate"
  for rep in $(seq 1 "$REPS"); do
    vs=(dp pp one)
    for i in 0 1 2; do
      v=${vs[$(((i + rep) % 3))]} log=$WORK/$rate-$v-$rep.log
      case $v in
        dp) cluster_run -np 2 "$DPTRAIN" train "${COMMON[@]}" --workers 1 >"$log" 2>&1 ;;
        pp) cluster_run -np 2 "$DPTRAIN" train "${COMMON[@]}" --workers 1 --pp 2 --micro-batches "$MICRO" >"$log" 2>&1 ;;
        one) taskset -c "$(cluster_cpus 0)" "$DPTRAIN" train "${COMMON[@]}" --workers 1 >"$log" 2>&1 ;;
      esac || { tail -3 "$log" >&2; die "$v at $rate failed"; }
      [[ $v == pp && -z $layout ]] && layout=$(sed -n 's/^pipeline: //p' "$log" | head -1)
      printf '%s\t%s\t%s\t%s\n' "$rate" "$v" "$rep" "$(dptrain_sps "$log")" >>"$TSV"
    done
  done
done

"$PY" - "$TSV" "$OUTMD" "$CPU_MODEL" "$NCPU" "$LOAD1" "$GIT_REV" "$MODEL" "$NP" "$STEPS" "$MICRO" "$layout" <<'PYEOF'
import csv, re, statistics, sys
tsv, out, cpu, ncpu, load, rev, model, np_, steps, micro, layout = sys.argv[1:]
rows = list(csv.DictReader(open(tsv), delimiter="\t"))
kv = dict(re.findall(r"(\w+)=(\d+)", model))
dim, ctx, vocab = int(kv.get("dim", 0)), int(kv.get("ctx", 0)), int(kv.get("vocab", 256))
P, N = 2, int(np_)
dp_bytes = 2 * (P - 1) / P * 4 * N
pp_bytes = 64 * ctx * dim * 4 + 2 * vocab * dim * 4 + 32  # each host sends one way's activations (or gradients), one tied tensor
def rate_bytes(r):
    m = re.match(r"(\d+(?:\.\d+)?)(k|m|g)?bit", r)
    return float(m.group(1)) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8
med = lambda xs: statistics.median(xs) if xs else float("nan")
lines = ["# Pipeline against data parallelism across 2 emulated hosts", "",
         f"CPU: {cpu}, {ncpu} CPUs (load at start {load}); dptrain {rev}; {model} ({N} parameters), batch 64,"
         f" AdamW, {steps} steps (samples/s after the 5th), pp: --pp 2 --micro-batches {micro} (1f1b);"
         " medians of the repetitions.", "", f"Pipeline layout: {layout}", "",
         f"Bytes each host sends per step: data parallelism {dp_bytes / 1e6:.1f} MB (ring all-reduce of the"
         f" gradient); pipeline {pp_bytes / 1e6:.2f} MB (activations or their gradients, and the tied embedding).", "",
         "| link | one host (samples/s) | dp 2 hosts | pp 2 hosts | pp / dp | link time per step dp / pp (ms) |",
         "|---|---:|---:|---:|---:|---:|"]
for rate in dict.fromkeys(r["rate"] for r in rows):
    g = lambda v: med([float(r["samples_s"]) for r in rows if r["rate"] == rate and r["variant"] == v and r["samples_s"]])
    one, dp, pp = g("one"), g("dp"), g("pp")
    B = rate_bytes(rate)
    lines.append(f"| {rate} | {one:.1f} | {dp:.1f} | {pp:.1f} | {pp / dp:.2f}× | {dp_bytes / B * 1e3:.0f} / {pp_bytes / B * 1e3:.0f} |")
lines += ["", f"Raw rows: {tsv.split('/')[-1]}."]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
echo "wrote $OUTMD" >&2
