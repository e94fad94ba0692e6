#!/usr/bin/env bash
# Reduce-scatter, all-gather and all-reduce of one buffer across emulated hosts
# (tests/netns/cluster.sh: network namespaces, tbf-shaped veth links, Open MPI over TCP only),
# one process per host, against the link time:
#
#   mpi   bench/mpi_coll.c: Open MPI's own calls, no dptrain: MPI_Reduce_scatter (tuned),
#         MPI_Ireduce_scatter (libnbc), the _block forms, MPI_(I)allgatherv, MPI_(I)allreduce
#   dp    dptrain bench allreduce --backend mpi --coll C --algo A for C = reduce_scatter,
#         allgather, allreduce and A = ring, rhd, native (MPI's blocking call: no timeout) and
#         native-polled (--timeout 60: the MPI_I* call, polled, as the trainer's nonblocking
#         operations are)
#
# Every row: the median over ITERS calls (each after a barrier) of the slowest rank, in µs.  The
# link time: each rank sends (P-1)/P of the buffer in a reduce-scatter or an all-gather, twice
# that in an all-reduce, at RATE/8 bytes/s per direction of each host's link.
#
#   bash bench/reduce_scatter.sh                     # 2 hosts, 1gbit, 2680000 bytes (mlp, fp32)
#   HOSTS=4 ITERS=11 bash bench/reduce_scatter.sh
#   DPTRAIN=/path/to/other/dptrain LABEL=before bash bench/reduce_scatter.sh
#
# Knobs: HOSTS (2) RATE (1gbit) BYTES (2680000) ITERS (21) REPS (1: rounds of the dp rows)
# DPTRAIN (./build/dptrain) LABEL (after) RESULTS (bench/results) SKIP_MPI=1 (no mpi rows)
# CLUSTER_PREFIX (dprs-<pid>, at most 11 characters).
# Needs root (network namespaces), make, mpicc.  Writes bench/results/reduce_scatter-<date>.txt.
set -uo pipefail # no -e: cluster.sh's functions run commands that may fail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
HOSTS=${HOSTS:-2}
RATE=${RATE:-1gbit}
BYTES=${BYTES:-2680000}
ITERS=${ITERS:-21}
REPS=${REPS:-1}
DPTRAIN=$(realpath "${DPTRAIN:-./build/dptrain}")
LABEL=${LABEL:-after}
RESULTS=${RESULTS:-bench/results}
export CLUSTER_PREFIX=${CLUSTER_PREFIX:-dprs$$}
CLUSTER_PREFIX=${CLUSTER_PREFIX:0:11}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=bench/lib.sh
source bench/lib.sh
bench_facts reduce_scatter
OUT=$RESULTS/reduce_scatter-$STAMP.txt
T=$(mktemp -d /tmp/reduce_scatter.XXXXXX)
# shellcheck source=tests/netns/cluster.sh
source tests/netns/cluster.sh
trap 'cluster_down >/dev/null 2>&1 || true; rm -rf "$T"' EXIT INT TERM
[[ -x $DPTRAIN ]] || { echo "no $DPTRAIN (make first)" >&2; exit 1; }
if [[ -z ${SKIP_MPI:-} ]]; then mpicc -O2 -DDP_BENCH_MPI -o "$T/mpi_coll" bench/mpi_coll.c || exit 1; fi
# the ranks on the other hosts run the same paths: /tmp is shared between namespaces
cluster_up "$HOSTS" "$RATE" >"$T/up.log" || { cat "$T/up.log"; exit 1; }
link_Bps=$(_cl_rate_bytes "$RATE")
{
  echo "# bench/reduce_scatter.sh ($LABEL): $HOSTS hosts, links $RATE, $BYTES bytes, $ITERS iterations"
  echo "# command: HOSTS=$HOSTS RATE=$RATE BYTES=$BYTES ITERS=$ITERS REPS=$REPS DPTRAIN=$DPTRAIN LABEL=$LABEL bash bench/reduce_scatter.sh"
  echo "# cpu: $CPU_MODEL ($NCPU cores), load average at start $LOAD1 (loaded machine: other jobs run), git $GIT_REV"
  awk -v b="$BYTES" -v p="$HOSTS" -v r="$link_Bps" 'BEGIN { printf "# link time: reduce-scatter / all-gather %.0f us, all-reduce %.0f us (%.0f bytes/s each way)\n", b * (p - 1) / p / r * 1e6, 2 * b * (p - 1) / p / r * 1e6, r }'
  sed 's/^/# /' "$T/up.log"
} | tee "$OUT"
if [[ -z ${SKIP_MPI:-} ]]; then
  echo "## mpi: $T/mpi_coll --bytes $BYTES --iters $ITERS" | tee -a "$OUT"
  cluster_run -np "$HOSTS" "$T/mpi_coll" --bytes "$BYTES" --iters "$ITERS" 2>&1 | tee -a "$OUT" || exit 1
fi
echo "## dp: $DPTRAIN bench allreduce --backend mpi --coll C --algo A --min-bytes $BYTES --max-bytes $BYTES --iters $ITERS" | tee -a "$OUT"
printf '%-6s %-15s %-13s %12s %12s\n' rep coll algo median_us best_us | tee -a "$OUT"
for ((rep = 1; rep <= REPS; rep++)); do
  for coll in reduce_scatter allgather allreduce; do
    for algo in ring rhd native native-polled; do
      extra=()
      [[ $algo == native-polled ]] && extra=(--timeout 60)
      cluster_run -np "$HOSTS" "$DPTRAIN" bench allreduce --backend mpi --coll "$coll" --algo "${algo%-polled}" \
        "${extra[@]}" --min-bytes "$BYTES" --max-bytes "$BYTES" --iters "$ITERS" >"$T/dp.log" 2>&1 ||
        { cat "$T/dp.log" >&2; exit 1; }
      # the row: bytes count iters algo time_us algbw busbw best_busbw; best time from best_busbw
      awk -v rep="$rep" -v coll="$coll" -v algo="$algo" -v p="$HOSTS" '
        !/^#/ && $1 ~ /^[0-9]+$/ { f = (coll == "allreduce" ? 2 : 1) * (p - 1) / p
          printf "%-6s %-15s %-13s %12.1f %12.1f\n", rep, coll, algo, $5, $1 * f / ($8 * 1e9) * 1e6 }' "$T/dp.log" | tee -a "$OUT"
    done
  done
done
echo "# raw: $OUT"
