#!/usr/bin/env bash
# The parameter server across processes against synchronous training (issue 11, "MPI: 1 server +
# 2 workers under mpirun and on the emulated hosts (tests/netns) train to within 0.5 points of
# synchronous").
#
#   bench/ps_mpi_accuracy.sh                                  # cnn, 5 epochs, every variant
#   EPOCHS=1 EXTRA="--train-limit 12000" bench/ps_mpi_accuracy.sh    # a quick validation
#   REPS=3 VARIANTS="sync async-share-im" bench/ps_mpi_accuracy.sh    # medians of 3 async runs
#
# cnn, global batch 128, SGD lr 0.05 momentum 0.9, seed SEED, 1 thread per process, the whole
# Fashion-MNIST test set.  Variants (one after the other):
#   sync        mpirun -np 2 dptrain train --backend mpi --workers 1 ...            the reference
#   async       mpirun -np 3 ... --mode async                  (ranks 0, 1 work, rank 2 serves)
#   async-slr   mpirun -np 3 ... --mode async --staleness-lr
#   ssp1        mpirun -np 3 ... --staleness 1
#   ssp1-slr    mpirun -np 3 ... --staleness 1 --staleness-lr
#   async-share mpirun -np 3 ... --mode async --share-lr         (each push's lr x its samples / 128)
#   async-im    mpirun -np 3 ... --mode async --implicit-momentum  (server momentum 1 - 2 x 0.1 = 0.8)
#   async-share-im            ... --mode async --share-lr --implicit-momentum
#   async-im-slr              ... --mode async --implicit-momentum --staleness-lr
# in each environment of ENVS:
#   local       mpirun on this host (shared memory and TCP loopback: btl self,vader,tcp)
#   netns       the emulated hosts of tests/netns (one host per rank, TCP only over veth links
#               shaped to RATE; needs root and network namespaces: skipped with a note otherwise)
# Reported per run: the final test accuracy (the last `epoch N/N ... test acc` line), its
# difference to the same environment's sync run in points, the last epoch's staleness (mean, max)
# and the wall time.  Plain async applies each push of a worker's batch / 2 samples on its own
# (twice the updates of sync, each from parameters one push old on average) at the sync run's lr
# and momentum; --staleness-lr halves the lr of a stale push; SSP sums each clock's two pushes
# into one update (at most one clock stale).  --share-lr halves each push's lr (its 64 samples of the
# 128); --implicit-momentum takes asynchrony's implicit momentum 1 - 1/2 off the explicit 0.9.
#
# Async runs differ run to run with the interleaving of the pushes (1.6 points between two runs of
# one seed were seen): REPS runs each non-sync variant REPS times (sync gives the same bits every
# run: once) and closes each environment with a "# median" line per variant.
#
# Environment: EPOCHS=5 SEED=1 REPS=1 EXTRA="" VARIANTS="sync async async-slr ssp1 ssp1-slr async-share async-im async-share-im"
#              ENVS="local netns" RATE=1gbit DPTRAIN=./build/dptrain RESULTS=bench/results
set -uo pipefail  # (not -e: tests/netns/cluster.sh relies on failing greps)

cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

EPOCHS=${EPOCHS:-5}
SEED=${SEED:-1}
REPS=${REPS:-1}
EXTRA=${EXTRA:-}
VARIANTS=${VARIANTS:-sync async async-slr ssp1 ssp1-slr async-share async-im async-share-im}
ENVS=${ENVS:-local netns}
RATE=${RATE:-1gbit}
DPTRAIN=${DPTRAIN:-./build/dptrain}
RESULTS=${RESULTS:-bench/results}

die() { echo "ps_mpi_accuracy: error: $*" >&2; exit 1; }
note() { echo "ps_mpi_accuracy: $*" >&2; }

[[ -x $DPTRAIN ]] || die "$DPTRAIN not found or not executable: build it first (make) or set DPTRAIN=PATH"
[[ $("$DPTRAIN" --help 2>&1) == *"mpi (built in)"* ]] || die "$DPTRAIN was built without MPI"
command -v mpirun >/dev/null || die "no mpirun (apt-get install openmpi-bin)"
[[ $EPOCHS =~ ^[1-9][0-9]*$ ]] || die "EPOCHS must be a positive count (got '$EPOCHS')"
[[ $REPS =~ ^[1-9][0-9]*$ ]] || die "REPS must be a positive count (got '$REPS')"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}

WORK=$(mktemp -d /tmp/ps_mpi_accuracy.XXXXXX)
bench_cleanup() { rm -rf "$WORK"; }
# shellcheck disable=SC2034  # used by cluster_trap
EXTRA_CLEANUP=bench_cleanup
trap bench_cleanup EXIT
bench_facts ps_mpi_accuracy
OUT=${OUTMD%.md}.txt

NETNS_WHY=""
if [[ " $ENVS " == *" netns "* ]]; then
  # shellcheck source=../tests/netns/cluster.sh
  source tests/netns/cluster.sh
  if NETNS_WHY=$(cluster_check); then
    # shellcheck disable=SC2034  # cluster_up reads it
    CLUSTER_PREFIX=dpa-$$
    cluster_trap  # the cluster (and WORK) go at the end, whatever happens
    cluster_up 3 "$RATE" >"$WORK/cluster.log" 2>&1 || { cat "$WORK/cluster.log" >&2; die "cluster_up 3 $RATE failed"; }
  fi
fi

# shellcheck disable=SC2206  # EXTRA is a list of flags
extra=($EXTRA)
BASE=(train --backend mpi --workers 1 --threads 1 --model cnn --batch 128 --lr 0.05 --momentum 0.9
      --epochs "$EPOCHS" --seed "$SEED" --progress lines "${extra[@]}")
flags_of() {
  case $1 in
    sync) ;;
    async) echo --mode async ;;
    async-slr) echo --mode async --staleness-lr ;;
    ssp1) echo --staleness 1 ;;
    ssp1-slr) echo --staleness 1 --staleness-lr ;;
    async-share) echo --mode async --share-lr ;;
    async-im) echo --mode async --implicit-momentum ;;
    async-share-im) echo --mode async --share-lr --implicit-momentum ;;
    async-im-slr) echo --mode async --implicit-momentum --staleness-lr ;;
    *) die "unknown variant '$1'" ;;
  esac
}

{
  echo "# parameter server across processes vs sync: test accuracy, cnn, batch 128, $EPOCHS epochs (issue 11, MPI target: within 0.5 points)"
  echo "# machine: $CPU_MODEL, $NCPU CPUs; load $LOAD1; $STAMP; git $GIT_REV"
  echo "# command: mpirun -np (2 sync | 3: 2 workers + 1 server) $DPTRAIN ${BASE[*]} [variant flags]"
  echo "# local: mpirun --oversubscribe --mca btl self,vader,tcp; netns: tests/netns cluster_run, 3 hosts, links $RATE"
  echo "# env variant test_acc_percent delta_to_sync_points stale_mean stale_max wall_s"
} >"$OUT"

for env in $ENVS; do
  if [[ $env == netns && -z ${CLUSTER_STATE:-} ]]; then
    echo "# netns skipped: ${NETNS_WHY:-not set up}" | tee -a "$OUT" >&2
    continue
  fi
  [[ $env == local || $env == netns ]] || die "unknown environment '$env' (local, netns)"
  ref=""
  declare -A accs=()
  for v in $VARIANTS; do
    reps=$REPS
    [[ $v == sync ]] && reps=1
    for ((rep = 1; rep <= reps; rep++)); do
      np=3
      [[ $v == sync ]] && np=2
      read -ra fl <<<"$(flags_of "$v")"
      log=$WORK/$env-$v.log
      note "$env $v (run $rep/$reps): mpirun -np $np $DPTRAIN ${BASE[*]} ${fl[*]}"
      t0=$(date +%s.%N)
      if [[ $env == local ]]; then
        mpirun --oversubscribe --mca btl self,vader,tcp -np "$np" "$DPTRAIN" "${BASE[@]}" "${fl[@]}" >"$log" 2>&1
      else
        cluster_run -np "$np" "$DPTRAIN" "${BASE[@]}" "${fl[@]}" >"$log" 2>&1
      fi
      rc=$?
      t1=$(date +%s.%N)
      last=$(grep -E "^epoch $EPOCHS/$EPOCHS " "$log" | tail -1)
      if [[ $rc -ne 0 || -z $last ]]; then
        tail -5 "$log" >&2
        echo "$env $v FAILED (exit $rc) - - - -" | tee -a "$OUT"
        continue
      fi
      acc=$(sed -nE 's/.*test acc ([0-9.]+)%.*/\1/p' <<<"$last")
      smean=$(sed -nE 's/.*staleness mean ([0-9.]+) .*/\1/p' <<<"$last")
      smax=$(sed -nE 's/.*staleness mean .* max ([0-9]+).*/\1/p' <<<"$last")
      [[ $v == sync ]] && ref=$acc
      accs[$v]+="$acc "
      delta=-
      [[ -n $ref && -n $acc ]] && delta=$(awk -v a="$acc" -v r="$ref" 'BEGIN { printf "%+.2f", a - r }')
      printf '%s %s %s %s %s %s %.1f\n' "$env" "$v" "${acc:-NA}" "$delta" "${smean:--}" "${smax:--}" \
        "$(echo "$t1 - $t0" | bc)" | tee -a "$OUT"
    done
  done
  # the median of each variant's runs (the lower middle one for an even count), and its delta
  for v in $VARIANTS; do
    [[ $REPS -gt 1 && $v != sync && -n ${accs[$v]:-} ]] || continue
    read -ra a <<<"${accs[$v]}"
    med=$(printf '%s\n' "${a[@]}" | sort -n | awk '{x[NR] = $1} END {print x[int((NR + 1) / 2)]}')
    delta=-
    [[ -n $ref ]] && delta=$(awk -v a="$med" -v r="$ref" 'BEGIN { printf "%+.2f", a - r }')
    echo "# median $env $v over ${#a[@]} runs: $med $delta (runs: ${a[*]})" | tee -a "$OUT"
  done
  unset accs
done
note "raw: $OUT"
