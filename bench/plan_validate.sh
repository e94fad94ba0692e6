#!/usr/bin/env bash
# Validation of `dptrain plan` against measured steps (issue 14, G2 "Validation"): for every case,
# in this order and in the same run (so the machine's load weighs on both alike):
#
#   1. dptrain calibrate ... --model M --batch N --algo ring --metrics --out prof.json
#        the profile (docs/plan.md), calibrate's own measurements alone: its steps with the
#        trainer's reducer, update and metrics all-gather; independent of the run below
#   2. dptrain plan --model M --workers P --batch N --optim sgd --algo ring --metrics
#        --profile prof.json --json                                   the prediction
#   3. dptrain train --model M --workers P (or P hosts) --batch N --optim sgd --momentum 0.9
#        --algo ring --max-steps STEPS --out run                      metrics.jsonl
#   measured step = the median of step_s over rank 0's step records after the WARMUP-th
#   error = (predicted - measured) / measured
# With CAL_STEPS > 0 also, before 3: a calibration run of the same training (CAL_STEPS steps,
# --out calrun), calibrate ... --run calrun (the step terms from its records) and plan from that
# profile: its figures go to separate columns, "from a run of the same configuration": a
# consistency check of the model, not a prediction (the terms come from a run like the measured one).
#
# Cases:
#   threads   MODELS (cnn mlp) at P = 2 worker threads of one process, global batch BATCH (128)
#   netns     the emulated hosts of tests/netns (cluster.sh: one network namespace per host, its
#             own cores, links shaped by tbf, Open MPI over TCP): HOSTS (2 4) hosts x RATES
#             (1gbit 100mbit), one process with one worker per host, global batch PERHOST x P;
#             calibrate runs under the same mpirun (--backend mpi: the process level's alpha and
#             beta, the compute measured on every host at once).  Only as root with network
#             namespaces (cluster_check); otherwise the section says skipped and why.
# Every run uses --threads 1 (one compute thread per worker), SGD lr 0.05 momentum 0.9.
#
# Usage (after make):  bash bench/plan_validate.sh
#   the threads cases alone (the quiet rerun):  NETNS=0 REPS=3 bash bench/plan_validate.sh
#   one emulated-hosts case:  MODELS=mlp HOSTS=2 RATES=1gbit bash bench/plan_validate.sh
#   knobs (environment): MODELS="cnn mlp" STEPS=40 WARMUP=5 REPS=1 BATCH=128 PERHOST=64
#   HOSTS="2 4" RATES="1gbit 100mbit" NETNS=1 (0: threads only) CAL_ITERS=10 (per size)
#   CAL_COMPUTE=20 (compute iterations) CAL_STEPS=0 (> 0: also the calibration run of that many
#   steps and the consistency check from it) DPTRAIN=build/dptrain RESULTS=bench/results
# Writes bench/results/plan_validate-<stamp>.md (the table) and .tsv (every case's figures,
# predicted and measured breakdown); prints the table.
set -uo pipefail  # (not -e: tests/netns/cluster.sh relies on failing greps)
cd "$(dirname "$0")/.." || exit 1
# shellcheck disable=SC2034  # bench_facts reads it
ROOT=$PWD
MODELS=${MODELS:-cnn mlp}
STEPS=${STEPS:-40}
WARMUP=${WARMUP:-5}
REPS=${REPS:-1}
BATCH=${BATCH:-128}
PERHOST=${PERHOST:-64}
HOSTS=${HOSTS:-2 4}
RATES=${RATES:-1gbit 100mbit}
NETNS=${NETNS:-1}
CAL_ITERS=${CAL_ITERS:-10}
CAL_COMPUTE=${CAL_COMPUTE:-20}
CAL_STEPS=${CAL_STEPS:-0}
DPTRAIN=${DPTRAIN:-$PWD/build/dptrain}
RESULTS=${RESULTS:-bench/results}
DATA=${DP_DATA:-/usr/share/datasets/fashion-mnist}

die() { echo "plan_validate: error: $*" >&2; exit 1; }
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts plan_validate
[[ -x $DPTRAIN ]] || die "$DPTRAIN not built (make)"
TSV=${OUTMD%.md}.tsv
WORK=$(mktemp -d /tmp/plan_validate.XXXXXX)

printf 'case\tmodel\tworkers\trate\trep\tbatch\tpred_step_ms\tmeas_step_ms\terr_pct\trunc_step_ms\trunc_err_pct\tpred_fwd_ms\tmeas_fwd_ms\tpred_bwd_ms\tmeas_bwd_ms\tpred_exposed_ms\tmeas_exposed_ms\tpred_opt_ms\tmeas_opt_ms\tpred_other_ms\tmeas_other_ms\tcomm_cpu\tmeas_steps\tpred_steal_ms\tpred_straggle_ms\tpred_gather_ms\tcalrun_step_ms\tcalrun_err_pct\tcalrun_other_ms\n' >"$TSV"
NOTES=()

# runcompute PROF RUN P BATCH WARM OUT: the profile with the run's own compute in place of the
# calibrated one (forward, backward per sample and the optimizer per parameter: rank 0's medians),
# so that plan from it shows the error of the rest of the model (communication, overlap, the
# other terms) apart from how well calibration caught the compute of the run; comm_cpu 0, as the
# run's backward has the steal in it already
runcompute() {
  /usr/bin/python3 - "$@" <<'PY'
import json, statistics as st, sys
prof, run, P, batch, warm, out, nparams = sys.argv[1:8]
c = json.load(open(prof))
rs = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"kind": "step"' in l][int(warm):]
b = int(batch) / int(P)
c["fwd_sample_s"] = st.median(r["forward_s"] for r in rs) / b
c["bwd_sample_s"] = st.median(r["backward_s"] for r in rs) / b
c["sgd_param_s"] = st.median(r["optimizer_s"] for r in rs) / int(nparams)
c["comm_cpu"] = 0
json.dump(c, open(out, "w"))
PY
}
# nparams PLAN: the model's parameter count, from plan's bucket sizes
nparams() { /usr/bin/python3 -c 'import json,sys; p=json.loads(open(sys.argv[1]).readline()); print(round(sum(p["bucket_bytes"]) / 4))' "$1"; }

# compare CASE MODEL P RATE REP BATCH PROF PLAN RUN WARM PLANRUN PLANCAL: one row of the TSV from the profile,
# the plan's JSON and the run's metrics; PLANCAL the plan from the --run calibration ("-": none).  The plan's columns as the run times them: backward + the compute lost to
# the all-reduces beside it (the run's backward has it inside), exposed + the straggler wait (rank 0's
# comm_exposed_s runs from its backward's end, waiting for the slowest worker too), other = data +
# zeroing + metrics gather; in the run, other = step - forward - backward - exposed - optimizer
compare() {
  /usr/bin/python3 - "$@" >>"$TSV" <<'PY'
import json, statistics as st, sys
case, model, P, rate, rep, batch, prof, plan, run, warm, planrun, plancal = sys.argv[1:13]
c = json.load(open(prof)); p = json.loads(open(plan).readline()); q = json.loads(open(planrun).readline())
rs = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"kind": "step"' in l][int(warm):]
if not rs: raise SystemExit("no step records after the warm-up in " + run)
m = lambda k: st.median(r[k] for r in rs) * 1e3
other = st.median((r["step_s"] - r["forward_s"] - r["backward_s"] - r["comm_exposed_s"] - r["optimizer_s"]) for r in rs) * 1e3
pred, meas = p["step_s"] * 1e3, m("step_s")
row = [case, model, P, rate, rep, batch, "%.3f" % pred, "%.3f" % meas, "%.1f" % (100 * (pred - meas) / meas),
       "%.3f" % (q["step_s"] * 1e3), "%.1f" % (100 * (q["step_s"] * 1e3 - meas) / meas),
       "%.3f" % (p["fwd_s"] * 1e3), "%.3f" % m("forward_s"), "%.3f" % ((p["bwd_s"] + p["steal_s"]) * 1e3), "%.3f" % m("backward_s"),
       "%.3f" % ((p["exposed_s"] + p.get("straggle_s", 0)) * 1e3), "%.3f" % m("comm_exposed_s"), "%.3f" % (p["opt_s"] * 1e3), "%.3f" % m("optimizer_s"),
       "%.3f" % ((p["data_s"] + p["zero_s"] + p["gather_s"]) * 1e3), "%.3f" % other, "%.2f" % c.get("comm_cpu", 0),
       str(len(rs)), "%.3f" % (p["steal_s"] * 1e3), "%.3f" % (p.get("straggle_s", 0) * 1e3), "%.3f" % (p["gather_s"] * 1e3)]
if plancal != "-":
    k = json.loads(open(plancal).readline())
    row += ["%.3f" % (k["step_s"] * 1e3), "%.1f" % (100 * (k["step_s"] * 1e3 - meas) / meas),
            "%.3f" % ((k["data_s"] + k["zero_s"] + k["gather_s"]) * 1e3)]
else:
    row += ["-", "-", "-"]
print("\t".join(row))
PY
}

train_common=(--optim sgd --lr 0.05 --momentum 0.9 --seed 1 --epochs 1 --threads 1
  --algo ring --progress none --test-limit 100 --data "$DATA")

# ---- threads ----------------------------------------------------------------------------
for rep in $(seq 1 "$REPS"); do
  for model in $MODELS; do
    d=$WORK/thr-$model-$rep
    mkdir -p "$d"
    echo "threads: $model P=2 rep $rep" >&2
    cal=(calibrate --workers 2 --threads 1 --model "$model" --batch "$BATCH" --algo ring --max-bytes 4194304
      --iters "$CAL_ITERS" --compute-iters "$CAL_COMPUTE" --metrics)
    pl=(plan --model "$model" --workers 2 --batch "$BATCH" --optim sgd --algo ring --metrics --json)
    "$DPTRAIN" "${cal[@]}" --out "$d/prof.json" >"$d/cal.log" 2>&1 || { cat "$d/cal.log" >&2; die "calibrate failed ($model)"; }
    "$DPTRAIN" "${pl[@]}" --profile "$d/prof.json" >"$d/plan.json" 2>"$d/plan.log" || { cat "$d/plan.log" >&2; die "plan failed"; }
    plancal=-
    if ((CAL_STEPS > 0)); then
      "$DPTRAIN" train --model "$model" --workers 2 --batch "$BATCH" --train-limit $((BATCH * (CAL_STEPS + 1))) \
        --max-steps "$CAL_STEPS" "${train_common[@]}" --out "$d/calrun" >"$d/calrun.log" 2>&1 ||
        { tail -5 "$d/calrun.log" >&2; die "calibration run failed ($model)"; }
      "$DPTRAIN" "${cal[@]}" --run "$d/calrun" --out "$d/profcal.json" >"$d/calr.log" 2>&1 ||
        { cat "$d/calr.log" >&2; die "calibrate --run failed ($model)"; }
      plancal=$d/plancal.json
      "$DPTRAIN" "${pl[@]}" --profile "$d/profcal.json" >"$plancal" 2>>"$d/plan.log" || { cat "$d/plan.log" >&2; die "plan failed"; }
    fi
    "$DPTRAIN" train --model "$model" --workers 2 --batch "$BATCH" --train-limit $((BATCH * (STEPS + 1))) \
      --max-steps "$STEPS" "${train_common[@]}" --out "$d/run" >"$d/train.log" 2>&1 || { tail -5 "$d/train.log" >&2; die "train failed"; }
    runcompute "$d/prof.json" "$d/run" 2 "$BATCH" "$WARMUP" "$d/profrun.json" "$(nparams "$d/plan.json")" &&
      "$DPTRAIN" plan --model "$model" --workers 2 --batch "$BATCH" --optim sgd --algo ring --metrics \
        --profile "$d/profrun.json" --json >"$d/planrun.json" 2>>"$d/plan.log" ||
      { cat "$d/plan.log" >&2; die "plan with the run's compute failed"; }
    compare threads "$model" 2 - "$rep" "$BATCH" "$d/prof.json" "$d/plan.json" "$d/run" "$WARMUP" "$d/planrun.json" "$plancal" ||
      die "compare failed ($d)"
    cp "$d/prof.json" "$WORK/profile-threads-$model-$rep.json"
    [[ $plancal == - ]] || cp "$d/profcal.json" "$WORK/profile-threads-$model-$rep-run.json"
  done
done

# ---- emulated hosts ------------------------------------------------------------------------
netns_note=""
if [[ $NETNS != 1 ]]; then
  netns_note="skipped: NETNS=$NETNS"
else
  # shellcheck source=../tests/netns/cluster.sh
  source tests/netns/cluster.sh
  if ! why=$(cluster_check); then
    netns_note="skipped: $why"
  elif [[ $("$DPTRAIN" --help 2>&1) != *"mpi (built in)"* ]]; then
    netns_note="skipped: $DPTRAIN was built without MPI"
  fi
fi
if [[ -z $netns_note ]]; then
  bench_cleanup() { rm -rf "$WORK"; }
  # shellcheck disable=SC2034  # used by cluster_trap
  EXTRA_CLEANUP=bench_cleanup
  # shellcheck disable=SC2034  # cluster_up reads it
  CLUSTER_PREFIX=dpv-$$
  cluster_trap
  for P in $HOSTS; do
    cluster_down
    cluster_up "$P" off >/dev/null || die "cluster_up $P failed"
    cpus=$(awk '{printf "%s%s: %s", (NR > 1 ? "; " : ""), $1, $2}' "$CLUSTER_STATE/cpus")
    NOTES+=("$P hosts, cores: $cpus")
    N=$((PERHOST * P))
    for RATE in $RATES; do
      cluster_shape "$RATE" || die "cannot shape to $RATE"
      for rep in $(seq 1 "$REPS"); do
        for model in $MODELS; do
          d=$WORK/ns-$P-$RATE-$model-$rep
          mkdir -p "$d"
          echo "netns: $model $P hosts $RATE rep $rep" >&2
          cal=(calibrate --backend mpi --threads 1 --model "$model" --batch "$N" --algo ring --max-bytes 4194304
            --iters "$CAL_ITERS" --compute-iters "$CAL_COMPUTE" --metrics)
          pl=(plan --model "$model" --workers "$P" --batch "$N" --optim sgd --algo ring --metrics --json)
          cluster_run -np "$P" "$DPTRAIN" "${cal[@]}" --out "$d/prof.json" >"$d/cal.log" 2>&1 ||
            { tail -5 "$d/cal.log" >&2; die "calibrate failed ($model, $P hosts, $RATE)"; }
          "$DPTRAIN" "${pl[@]}" --profile "$d/prof.json" >"$d/plan.json" 2>"$d/plan.log" || { cat "$d/plan.log" >&2; die "plan failed"; }
          plancal=-
          if ((CAL_STEPS > 0)); then
            cluster_run -np "$P" "$DPTRAIN" train --backend mpi --workers 1 --model "$model" --batch "$N" \
              --train-limit $((N * (CAL_STEPS + 1))) --max-steps "$CAL_STEPS" "${train_common[@]}" --out "$d/calrun" \
              >"$d/calrun.log" 2>&1 || { tail -5 "$d/calrun.log" >&2; die "calibration run failed ($model, $P hosts, $RATE)"; }
            cluster_run -np "$P" "$DPTRAIN" "${cal[@]}" --run "$d/calrun" --out "$d/profcal.json" >"$d/calr.log" 2>&1 ||
              { tail -5 "$d/calr.log" >&2; die "calibrate --run failed ($model, $P hosts, $RATE)"; }
            plancal=$d/plancal.json
            "$DPTRAIN" "${pl[@]}" --profile "$d/profcal.json" >"$plancal" 2>>"$d/plan.log" || { cat "$d/plan.log" >&2; die "plan failed"; }
          fi
          cluster_run -np "$P" "$DPTRAIN" train --backend mpi --workers 1 --model "$model" --batch "$N" \
            --train-limit $((N * (STEPS + 1))) --max-steps "$STEPS" "${train_common[@]}" --out "$d/run" >"$d/train.log" 2>&1 ||
            { tail -5 "$d/train.log" >&2; die "train failed ($model, $P hosts, $RATE)"; }
          runcompute "$d/prof.json" "$d/run" "$P" "$N" "$WARMUP" "$d/profrun.json" "$(nparams "$d/plan.json")" &&
            "$DPTRAIN" plan --model "$model" --workers "$P" --batch "$N" --optim sgd --algo ring --metrics \
              --profile "$d/profrun.json" --json >"$d/planrun.json" 2>>"$d/plan.log" ||
            { cat "$d/plan.log" >&2; die "plan with the run's compute failed"; }
          compare netns "$model" "$P" "$RATE" "$rep" "$N" "$d/prof.json" "$d/plan.json" "$d/run" "$WARMUP" "$d/planrun.json" "$plancal" ||
            die "compare failed ($d)"
          cp "$d/prof.json" "$WORK/profile-netns-$P-$RATE-$model-$rep.json"
          [[ $plancal == - ]] || cp "$d/profcal.json" "$WORK/profile-netns-$P-$RATE-$model-$rep-run.json"
        done
      done
    done
  done
  cluster_down
fi

# ---- the report -------------------------------------------------------------------------------
{
  echo "# plan against measured steps (bench/plan_validate.sh)"
  echo
  echo "CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1; git $GIT_REV; $STAMP"
  echo "Knobs: MODELS=\"$MODELS\" STEPS=$STEPS WARMUP=$WARMUP REPS=$REPS BATCH=$BATCH PERHOST=$PERHOST HOSTS=\"$HOSTS\" RATES=\"$RATES\" CAL_ITERS=$CAL_ITERS CAL_COMPUTE=$CAL_COMPUTE CAL_STEPS=$CAL_STEPS"
  echo "Emulated hosts: ${netns_note:-run}"
  for n in "${NOTES[@]}"; do echo "- $n"; done
  echo
  echo "Predicted (dptrain plan from the profile calibrated just before, calibrate's own measurements"
  echo "alone: a prediction) against measured (median step_s after the first $WARMUP steps); ms per step,"
  echo "error = (predicted - measured) / measured."
  echo "fwd, bwd, exp(osed comm), opt: predicted / measured; bwd predicted with the compute lost to the"
  echo "all-reduces beside it (steal), exp predicted with the straggler wait (straggle); other: data +"
  echo "zeroing + the metrics' all-gather (plan) / step - the four phases (run).  \"run's compute\": the"
  echo "plan again with the run's own forward, backward and optimizer medians in the profile (the error"
  echo "of the rest of the model, apart from how well calibration caught the run's compute); gather: the"
  echo "plan's metrics all-gather (in other).  \"calibrated on a run\" (CAL_STEPS > 0): plan from calibrate"
  echo "--run of a run of the same configuration (model, batch, P): a consistency check, not a prediction;"
  echo "its step (error) and other."
  echo
  echo "| case | model | P | rate | predicted | measured | error | with the run's compute | fwd | bwd | exp | opt | other | comm_cpu | steal | straggle | gather | calibrated on a run (check) | its other |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  tail -n +2 "$TSV" | awk -F'\t' '{c = $27 == "-" ? "-" : sprintf("%s (%+.1f%%)", $27, $28)
    printf "| %s | %s | %s | %s | %s | %s | %+.1f%% | %s (%+.1f%%) | %s / %s | %s / %s | %s / %s | %s / %s | %s / %s | %s | %s | %s | %s | %s | %s |\n",
    $1, $2, $3, $4, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $24, $25, $26, c, $29}'
  echo
  echo "Profiles (JSON, one per case; -run: the calibration on a run of the same configuration):"
  echo
  for f in "$WORK"/profile-*.json; do [[ -e $f ]] && { echo "    $(basename "$f"): $(cat "$f")"; }; done
} >"$OUTMD"
cat "$OUTMD"
echo "wrote $OUTMD and $TSV" >&2
rm -rf "$WORK"
