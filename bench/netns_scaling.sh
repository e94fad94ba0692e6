#!/usr/bin/env bash
# Training across emulated machines: network namespaces ("hosts") joined by shaped links
# (tests/netns/cluster.sh: veth pairs shaped by tbf, Open MPI over TCP only, each host on its own
# cores: see "cores" below), one dptrain process with one worker thread per host.  For every
# host count in HOSTS and every link rate in RATES, side by side, REPS repetitions (the order
# rotates):
#
#   overlap     mpirun (P hosts) dptrain train --backend mpi --workers 1 ...      buckets reduced during backward
#   nooverlap   the same with --no-overlap                                          all reductions after backward
#   one         one process, one worker, on host h0's cores (no network)           the single-host baseline
#
# all with MODEL (cnn), PERHOST samples per host and step (global batch N = PERHOST x P; the
# one-host run takes PERHOST: weak scaling, each host does the same work per step), SGD lr 0.05
# momentum 0.9, --max-steps STEPS, --threads 1.  Throughput: global samples/s after the 5th step
# (the `throughput:` line); measured step time = N / samples/s.
#
# Cores: cluster_up gives host k its own cores (disjoint blocks of the cores this script may use;
# round-robin single cores when P > cores, so hosts share cores only then).  The header of each
# section lists them.  With P > cores the hosts' compute is slowed by sharing, and the scaling
# efficiency is capped near cores / P.
#
# Reported per (P, rate):
#   t_compute  compute seconds per step on a host (forward + backward + optimizer, rank 0's step
#              metrics after the 5th step), median of the --no-overlap runs: nothing else runs
#              during their forward/backward, so it is the host's pure compute.  (The overlap
#              run's compute is in the table too: it is longer by what the communication thread
#              and the kernel's TCP work take from the same cores.)
#   t_link     the link-bound reduction time: a ring all-reduce sends (and receives) 2(P-1)/P x n
#              bytes per host and step, n = 4 bytes x parameters (fp32 gradient; recursive
#              halving-doubling moves the same), so at link rate B (bytes/s, each direction of
#              each host's link is shaped to B) it takes at least t_link = 2(P-1)/P x n / B.
#   ideal      the step with full overlap and nothing else: t_ideal = max(t_compute, t_link).
#   overlap ratio            = no-overlap step time / overlap step time (per repetition, paired;
#                              median [min..max]).  Target (issue 8): >= 1.3x at P = 2 at the
#                              rate where t_link ~ t_compute.
#   fraction of the ideal    = t_ideal / measured step time (1 = the links' and the cores' bound).
#   scaling efficiency       = samples/s(P hosts) / (P x samples/s(one host)).
#   exposed / total comm     from rank 0's per-step metrics (after the 5th step).
#   structural ceiling       from the overlap runs' timelines (--timeline, rank 0, steps after the
#                            5th): bucket k's all-reduce cannot start before backward reaches it
#                            (r_k after backward starts) and the buckets from k on need their link
#                            time on the link, so an overlap step takes at least
#                            F + max_k (r_k + t_link(bytes of buckets k, k+1, ...)) + optimizer,
#                            F the forward time; no-overlap step / that bound is the most overlap can
#                            gain with this model and bucket plan, even with a network stack that
#                            costs the host's cores nothing.
#   backward growth          backward per step with overlap minus without: the CPU time that the
#                            communication (MPI, the kernel's TCP and the shaping) takes from the
#                            host's cores while backward runs.
#
# RATE "auto": the rate where t_link = t_compute, B = 2(P-1)/P x n / t_compute, with t_compute
# measured first by a --no-overlap calibration run of CAL_STEPS steps on the unshaped cluster of
# P hosts (rounded to whole Mbit/s).  That is where overlap can gain most: up to 2x.
#
# Usage (as root, after make):
#   bash bench/netns_scaling.sh [--hosts "2 4"] [--rates "1gbit 200mbit auto"] [--reps N]
#        [--steps N] [--perhost N] [--algo A] [--model M] [--extra "DPTRAIN ARGS"]
# or the same as environment variables HOSTS, RATES (or RATE), REPS, STEPS, PERHOST, ALGO, MODEL,
# EXTRA (extra train options for every run, e.g. --extra "--bucket-cap-mb 25");
# lists take spaces or commas.  Defaults: HOSTS=4 RATES=1gbit REPS=3 STEPS=60 PERHOST=32 ALGO=auto
# MODEL=cnn.  One run (variant) takes about 5-12 s on cnn with 60 steps and 64 per host (mpirun's
# start, loading the data, the steps; longer at low rates and with more hosts than cores), so a
# (P, rate) pair takes about 3 x REPS x 10 s, plus one calibration run for "auto".
# Writes bench/results/netns_scaling-<date>.md (the report) and .tsv (every run's raw figures).
set -uo pipefail  # (not -e: tests/netns/cluster.sh relies on failing greps)
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/lib.sh
. bench/lib.sh

HOSTS=${HOSTS:-4}
RATES=${RATES:-${RATE:-1gbit}}
REPS=${REPS:-3}
STEPS=${STEPS:-60}
PERHOST=${PERHOST:-32}
ALGO=${ALGO:-auto}
MODEL=${MODEL:-cnn}
EXTRA=${EXTRA:-}
CAL_STEPS=${CAL_STEPS:-30}
DPTRAIN=${DPTRAIN:-$PWD/build/dptrain}
RESULTS=${RESULTS:-bench/results}

die() { echo "netns_scaling: error: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  [[ $1 == -h || $1 == --help || $# -ge 2 ]] || die "$1 needs a value"
  case $1 in
    --hosts) HOSTS=$2 ;;
    --rates | --rate) RATES=$2 ;;
    --reps) REPS=$2 ;;
    --steps) STEPS=$2 ;;
    --perhost) PERHOST=$2 ;;
    --algo) ALGO=$2 ;;
    --model) MODEL=$2 ;;
    --extra) EXTRA=$2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (--help)" ;;
  esac
  shift 2
done
HOSTS=${HOSTS//,/ } RATES=${RATES//,/ }
for v in $HOSTS $REPS $STEPS $PERHOST $CAL_STEPS; do [[ $v =~ ^[1-9][0-9]*$ ]] || die "'$v' is not a positive count"; done
((STEPS > 10 && CAL_STEPS > 10)) || die "STEPS and CAL_STEPS must exceed 10 (the first 5 steps are not counted)"

# shellcheck source=../tests/netns/cluster.sh
source tests/netns/cluster.sh
why=$(cluster_check) || die "$why"
[[ -x $DPTRAIN ]] || die "$DPTRAIN not built (make)"
[[ $("$DPTRAIN" --help 2>&1) == *"mpi (built in)"* ]] || die "$DPTRAIN was built without MPI"
for r in $RATES; do
  [[ $r == auto ]] || _cl_rate_bytes "$r" >/dev/null || die "bad rate '$r' (tc syntax: 1gbit, 200mbit; or auto)"
done

WORK=$(mktemp -d /tmp/netns_scaling.XXXXXX)
bench_cleanup() { rm -rf "$WORK"; }
# shellcheck disable=SC2034  # used by cluster_trap
EXTRA_CLEANUP=bench_cleanup
# shellcheck disable=SC2034  # cluster_up reads it
CLUSTER_PREFIX=dpb-$$
cluster_trap  # whatever happens, the cluster and WORK go at the end

NP=$("$DPTRAIN" plan --model "$MODEL" --workers 1 2>/dev/null | sed -n 's/^model \([0-9]*\) parameters.*/\1/p' | head -1)
[[ -n $NP ]] || die "cannot read the parameter count"

RAW=$WORK/raw.tsv META=$WORK/meta.tsv
printf 'hosts\trate\tvariant\trep\tsamples_s\tcompute_s\tcomm_s\texposed_s\tsteps\tbackward_s\tbound_s\tbig_bytes\tbig_dur_s\n' >"$RAW"
: >"$META"

# stepsums OUT: rank 0's step records after the 5th: "compute comm exposed count backward" (seconds,
# summed; compute = forward + backward + optimizer)
stepsums() {
  /usr/bin/python3 -c '
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1]) if "\"kind\": \"step\"" in l][5:]
print(sum(r["forward_s"] + r["backward_s"] + r["optimizer_s"] for r in rs), sum(r["comm_s"] for r in rs),
      sum(r["comm_exposed_s"] for r in rs), len(rs), sum(r["backward_s"] for r in rs))' "$1/metrics.jsonl" 2>/dev/null ||
    echo "0 0 0 0 0"
}
# ceiling OUT P B: from OUT/tl.json (rank 0's timeline), medians over the steps after the 5th:
# "bound_s big_bytes big_dur_s": the structural lower bound of the overlap step (see the header), the
# largest bucket's bytes and its all-reduce's duration; "NA NA NA" without a timeline.  B: link bytes
# per second.  Every step has one forward, one backward, one optimizer event and one all-reduce per
# bucket (no accumulation here), so the k-th backward and the k-th group of buckets (by start
# time) are the same step.
ceiling() {
  /usr/bin/python3 -c '
import json, sys, statistics as st
out, P, B = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
ev = json.load(open(out + "/tl.json"))["traceEvents"]
def track(name, tid): return sorted((e for e in ev if e.get("ph") == "X" and e["name"] == name and e["tid"] == tid), key=lambda e: e["ts"])
fw, bw, op, ar = track("forward", 0), track("backward", 0), track("optimizer", 0), track("all-reduce", 1)
nb = 1 + max(e["args"]["bucket"] for e in ar)
groups = [ar[i:i + nb] for i in range(0, len(ar) - nb + 1, nb)]
tl = lambda nbytes: 2 * (P - 1) / P * nbytes / B
bounds, bigs = [], []
for f, b, o, bk in list(zip(fw, bw, op, groups))[5:]:
    need = max((e["ts"] - b["ts"]) / 1e6 + tl(sum(x["args"]["bytes"] for x in bk[k:])) for k, e in enumerate(bk))
    bounds.append(f["dur"] / 1e6 + need + o["dur"] / 1e6)
    big = max(bk, key=lambda e: e["args"]["bytes"]); bigs.append((big["args"]["bytes"], big["dur"] / 1e6))
print(st.median(bounds), st.median(x[0] for x in bigs), st.median(x[1] for x in bigs))' "$1" "$2" "$3" 2>/dev/null ||
    echo "NA NA NA"
}
# train VARIANT OUT LOG STEPS: one run of VARIANT on the current cluster (P hosts)
train() {
  local v=$1 out=$2 log=$3 steps=$4
  local common=(--model "$MODEL" --lr 0.05 --momentum 0.9 --seed 1 --epochs 1 --max-steps "$steps"
    --threads 1 --progress none --test-limit 1 --out "$out")
  # shellcheck disable=SC2206  # EXTRA is a list of options, split on spaces
  local extra=($EXTRA)
  common+=("${extra[@]}")
  local mpi=(--backend mpi --workers 1 --algo "$ALGO" --batch $((PERHOST * P)))
  case $v in
    overlap) cluster_run -np "$P" "$DPTRAIN" train "${mpi[@]}" --timeline "$out/tl.json" "${common[@]}" ;;
    nooverlap) cluster_run -np "$P" "$DPTRAIN" train "${mpi[@]}" --no-overlap "${common[@]}" ;;
    one) taskset -c "$(cluster_cpus 0)" "$DPTRAIN" train --backend thread --workers 1 --batch "$PERHOST" "${common[@]}" ;;
  esac >"$log" 2>&1
}
run_variant() { # run_variant VARIANT REP
  local v=$1 rep=$2 tag=$P-$RATE-$1-$2
  local log=$WORK/$tag.log out=$WORK/$tag
  train "$v" "$out" "$log" "$STEPS" || { echo "  $v rep $rep failed:" >&2; tail -5 "$log" >&2; }
  local sps rec
  sps=$(dptrain_sps "$log")
  rec=$(stepsums "$out")
  local ceil="NA NA NA"
  [[ $v == overlap ]] && ceil=$(ceiling "$out" "$P" "$(_cl_rate_bytes "$RATE")")
  printf '%s\t%s\t%s\t%s\t%s\t%s %s\n' "$P" "$RATE" "$v" "$rep" "${sps:-NA}" "$rec" "$ceil" | tr ' ' '\t' >>"$RAW"
  echo "  $P hosts $RATE $v rep $rep: ${sps:-NA} samples/s (compute, comm, exposed s, steps: $rec)" >&2
}
# auto_rate: the rate (whole Mbit/s) where t_link = t_compute on the current cluster, from a
# --no-overlap calibration run on unshaped links
auto_rate() {
  local rec
  cluster_shape off
  train nooverlap "$WORK/cal-$P" "$WORK/cal-$P.log" "$CAL_STEPS" || { tail -5 "$WORK/cal-$P.log" >&2; return 1; }
  rec=$(stepsums "$WORK/cal-$P")
  awk -v r="$rec" -v p="$P" -v np="$NP" 'BEGIN {
    split(r, f, " "); if (f[4] < 1 || f[1] <= 0) exit 1
    tc = f[1] / f[4]; bits = 8 * 2 * (p - 1) / p * 4 * np / tc
    printf "%dmbit %.1f\n", (bits / 1e6 < 1 ? 1 : bits / 1e6 + 0.5), tc * 1e3 }'
}

t0=$(date +%s)
for P in $HOSTS; do
  cluster_down
  cluster_up "$P" off >/dev/null || die "cluster_up $P failed"
  cpus=$(awk '{printf "%s%s: %s", (NR > 1 ? "; " : ""), $1, $2}' "$CLUSTER_STATE/cpus")
  echo "$P hosts, cores: $cpus" >&2
  for RATE in $RATES; do
    note=''
    if [[ $RATE == auto ]]; then
      ((P >= 2)) || die "rate auto needs 2 or more hosts"
      read -r RATE tcal < <(auto_rate) || die "calibration run failed ($P hosts)"
      note="auto: t_link = t_compute for the calibration's t_compute = $tcal ms ($CAL_STEPS-step --no-overlap run, unshaped)"
      echo "  $P hosts, rate auto -> $RATE ($note)" >&2
    fi
    cluster_shape "$RATE" || die "cannot shape to $RATE"
    printf '%s\t%s\t%s\t%s\t%s\n' "$P" "$RATE" "$(_cl_rate_bytes "$RATE")" "$cpus" "$note" >>"$META"
    VARS=(overlap nooverlap one)
    for rep in $(seq 1 "$REPS"); do
      for k in 0 1 2; do run_variant "${VARS[$(((k + rep - 1) % 3))]}" "$rep"; done
    done
  done
done

mkdir -p "$RESULTS"
BASE=$RESULTS/netns_scaling-$(date +%Y-%m-%d-%H%M%S)
cp "$RAW" "$BASE.tsv"
CORES=$(_cl_cpus_avail)
export RAW META NP STEPS ALGO MODEL REPS PERHOST CORES BASE
export ARGS="--hosts \"$HOSTS\" --rates \"$RATES\" --reps $REPS --steps $STEPS --perhost $PERHOST --algo $ALGO --model $MODEL${EXTRA:+ --extra \"$EXTRA\"}"
export WALL=$(($(date +%s) - t0))
/usr/bin/python3 - >"$BASE.md" <<'EOF'
import os, statistics as st
E = os.environ
rows = [l.rstrip("\n").split("\t") for l in open(E["RAW"]) if l.strip()][1:]
d = {}  # (hosts, rate) -> variant -> rep -> (samples/s, compute, comm, exposed per step)
num = lambda x: float(x) if x != "NA" else float("nan")
for p, rate, v, rep, sps, comp, comm, exp_, steps, bwd, bound, bigb, bigd in rows:
    if sps == "NA": continue
    k = max(int(float(steps)), 1)
    d.setdefault((int(p), rate), {}).setdefault(v, {})[int(rep)] = (
        float(sps), float(comp) / k, float(comm) / k, float(exp_) / k, float(bwd) / k, num(bound), num(bigb), num(bigd))
meta = [l.rstrip("\n").split("\t") for l in open(E["META"]) if l.strip()]
n = 4 * int(E["NP"]); per = int(E["PERHOST"]); cores = E["CORES"].split()
def med(xs): return st.median(xs) if xs else float("nan")
def cell(rs, pct=False):
    if not rs: return "n/a"
    m = med(rs)
    return f"{100*m:.0f}% [{100*min(rs):.0f}..{100*max(rs):.0f}]" if pct else f"{m:.2f}x [{min(rs):.2f}..{max(rs):.2f}]"
print(f"# Training across emulated hosts (tbf-shaped links, TCP, Open MPI)\n")
print(f"- model {E['MODEL']} ({E['NP']} parameters, n = {n/1e6:.2f} MB of fp32 gradient), {per} samples per host and step "
      f"(the one-host run: {per}), {E['STEPS']} steps (the first 5 not counted), 1 process x 1 worker thread x 1 compute thread "
      f"per host, --algo {E['ALGO']}; {E['REPS']} repetitions per variant, medians [min..max]; {len(cores)} cores available ({' '.join(cores)}); "
      f"{int(E['WALL'])} s in all")
print(f"- `bash bench/netns_scaling.sh {E['ARGS']}` as root; raw figures: `{os.path.basename(E['BASE'])}.tsv`")
print("- t_link = 2(P-1)/P x n / B (ring all-reduce bytes per host over the link rate); t_compute = compute per step "
      "of the --no-overlap runs (rank 0); ideal step = max(t_compute, t_link); overlap ratio = no-overlap step / overlap step; "
      "fraction of ideal = ideal step / measured step (step = global batch / samples/s)\n")
summary = []
for p, rate, B, cpus, note in meta:
    p, B = int(p), float(B)
    r = d.get((p, rate), {})
    ov, no, one = r.get("overlap", {}), r.get("nooverlap", {}), r.get("one", {})
    N = per * p
    t_link = 2 * (p - 1) / p * n / B
    tc = med([x[1] for x in no.values()])
    ideal = max(tc, t_link)
    step = lambda xs: [N / x[0] for x in xs.values() if x[0] > 0]
    ratio = [ov[k][0] / no[k][0] for k in ov if k in no]
    f_ov = [ideal / s for s in step(ov)]; f_no = [ideal / s for s in step(no)]
    eff = [ov[k][0] / (p * one[k][0]) for k in ov if k in one]
    print(f"## {p} hosts, {rate} links\n")
    print(f"- cores per host: {cpus}" + (f" ({p} hosts on {len(cores)} cores: hosts share cores)" if p > len(cores) else ""))
    if note: print(f"- rate {note}")
    print(f"- global batch {N}; t_compute {tc*1e3:.1f} ms, t_link {t_link*1e3:.1f} ms at {rate}, ideal step {ideal*1e3:.1f} ms "
          f"({'link' if t_link > tc else 'compute'}-bound)\n")
    print("| variant | samples/s | step | compute per step | comm total per step | comm exposed per step |")
    print("|---|---:|---:|---:|---:|---:|")
    names = {"overlap": f"{p} hosts, overlap", "nooverlap": f"{p} hosts, --no-overlap", "one": "1 host (one process)"}
    for v in ("overlap", "nooverlap", "one"):
        xs = list(r.get(v, {}).values())
        if not xs: print(f"| {names[v]} | n/a | | | | |"); continue
        nn = per if v == "one" else N
        pm = lambda i: med([x[i] for x in xs]) * 1e3
        print(f"| {names[v]} | {med([x[0] for x in xs]):.0f} | {med([nn / x[0] for x in xs]) * 1e3:.1f} ms | {pm(1):.1f} ms | {pm(2):.1f} ms | {pm(3):.1f} ms |")
    cap = min(1.0, len(cores) / p)
    print()
    print(f"- overlap / no-overlap: {cell(ratio)}" + (" (target at t_link ~ t_compute, 2 hosts: >= 1.3x)" if p == 2 and note else ""))
    print(f"- fraction of the ideal: overlap {cell(f_ov, True)}, no-overlap {cell(f_no, True)}")
    print(f"- scaling efficiency against one host: {cell(eff, True)}" + (f" (hosts share cores: compute alone caps it near {100*cap:.0f}%)" if cap < 1 else ""))
    bound = med([x[5] for x in ov.values() if x[5] == x[5]])
    ceil = [no[k2][0] and (N / no[k2][0]) / ov[k2][5] for k2 in ov if k2 in no and ov[k2][5] == ov[k2][5]]
    grow = med([x[4] for x in ov.values()]) - med([x[4] for x in no.values()])
    bigb = med([x[6] for x in ov.values() if x[6] == x[6]]); bigd = med([x[7] for x in ov.values() if x[7] == x[7]])
    if ceil:
        print(f"- structural ceiling (timeline): an overlap step takes at least {bound*1e3:.1f} ms, so overlap / no-overlap "
              f"<= {cell(ceil)}; measured {cell(ratio)}")
        print(f"- largest bucket ({bigb/1e6:.2f} MB): its all-reduce took {bigd*1e3:.1f} ms during backward, against "
              f"{2*(p-1)/p*bigb/B*1e3:.1f} ms of link time")
    print(f"- backward per step: {med([x[4] for x in ov.values()])*1e3:.1f} ms with overlap, {med([x[4] for x in no.values()])*1e3:.1f} ms "
          f"without: {grow*1e3:+.1f} ms of the host's cores go to the communication while backward runs")
    print()
    summary.append((p, rate, cpus, tc, t_link, ideal, med(step(ov)), med(step(no)), cell(ratio), cell(f_ov, True), cell(eff, True),
                    cell(ceil) if ceil else "n/a", grow))
print("## Summary\n")
print("| hosts | rate | cores per host | t_compute | t_link | ideal step | overlap step | no-overlap step | overlap / no-overlap | structural ceiling | backward growth | fraction of ideal (overlap) | efficiency |")
print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for p, rate, cpus, tc, tl, ideal, so, sn, ratio, fo, eff, ceil, grow in summary:
    print(f"| {p} | {rate} | {cpus} | {tc*1e3:.1f} ms | {tl*1e3:.1f} ms | {ideal*1e3:.1f} ms | {so*1e3:.1f} ms | {sn*1e3:.1f} ms | {ratio} | {ceil} | {grow*1e3:+.1f} ms | {fo} | {eff} |")
EOF
cat "$BASE.md"
echo "report: $BASE.md (raw: $BASE.tsv)" >&2
