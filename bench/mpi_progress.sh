#!/usr/bin/env bash
# Progress of a nonblocking all-reduce while the worker computes (bench/mpi_progress.c), in two
# settings, 2 processes each:
#   shm    one host, shared memory (btl self,vader): every byte moved is a CPU copy on the
#          cores that also compute, so nothing can overlap; the run shows what each way costs
#   net    two emulated hosts (tests/netns/cluster.sh: network namespaces, TCP over 1 Gbit/s
#          links shaped with tbf): the transfer waits on the wire, the CPU is free for compute,
#          and the question is which way keeps the transfer moving; with mpirun's default
#          binding (a core per process) and with --bind-to none
#   bash bench/mpi_progress.sh                 # both; about 5 minutes
#   BYTES=8M REPS=7 SKIP_NET=1 bash bench/mpi_progress.sh
# Writes bench/results/mpi_progress-<date>.txt (needs `make`; net needs root, ip, tc).
set -uo pipefail
cd "$(dirname "$0")/.."
BYTES=${BYTES:-8M}
REPS=${REPS:-7}
RESULTS=${RESULTS:-bench/results}
BIN=build/bench/mpi_progress
[[ -x $BIN ]] || { echo "build $BIN first (make; needs MPI)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=$RESULTS/mpi_progress-$(date +%Y-%m-%d-%H%M%S).txt
mkdir -p "$RESULTS"
{
  echo "# bash bench/mpi_progress.sh (BYTES=$BYTES REPS=$REPS); load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "## shm: mpirun -np 2 --mca btl self,vader --mca pml ob1 $BIN --bytes $BYTES --reps $REPS --compute gemm"
  mpirun --allow-run-as-root -np 2 --mca btl self,vader --mca pml ob1 "$BIN" --bytes "$BYTES" --reps "$REPS" --compute gemm
} | tee "$OUT"
if [[ -z "${SKIP_NET:-}" ]]; then
  (
    # shellcheck source=../tests/netns/cluster.sh
    source tests/netns/cluster.sh || exit 1
    why=$(cluster_check) || { echo "net: skipped ($why)"; exit 0; }
    cluster_trap
    CLUSTER_PREFIX=mpg$$ cluster_up 2 1gbit || exit 1
    for bind in core none; do
      echo
      echo "## net (2 hosts, TCP, 1 Gbit/s): cluster_run -np 2 --bind-to $bind $BIN --bytes $BYTES --reps $REPS --compute gemm"
      cluster_run -np 2 --bind-to "$bind" "$BIN" --bytes "$BYTES" --reps "$REPS" --compute gemm
    done
  ) 2>&1 | tee -a "$OUT"
fi
echo "saved: $OUT" >&2
