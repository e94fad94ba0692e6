#!/usr/bin/env bash
# Point-to-point or one-sided for the parameter server across processes (bench/ps_rma.c): a push
# of the cnn's gradient (421642 floats) into a server's shard and the pull of the fresh shard,
# 2 processes on this host, medians of 5 repetitions of 20 round trips:
#   shm       btl self,vader; one-sided through osc sm (a shared-memory window)
#   tcp       btl self,tcp (loopback); one-sided needs an osc component that works over TCP:
#             pt2pt, which refuses MPI_THREAD_MULTIPLE (dptrain's level), so this run asks for
#             MPI_THREAD_SERIALIZED (--serialized); osc rdma has no RDMA-capable btl there
#   tcp-ucx   osc ucx with UCX_TLS=tcp,self (UCX over TCP loopback), at MPI_THREAD_MULTIPLE
#   bash bench/ps_rma.sh            # about a minute
# Writes bench/results/ps_rma-<date>.txt (needs `make` with MPI).
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-bench/results}
REPS=${REPS:-5}
PUSHES=${PUSHES:-20}
BIN=build/bench/ps_rma
[[ -x $BIN ]] || { echo "build $BIN first (make; needs MPI)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$RESULTS"
OUT=$RESULTS/ps_rma-$(date +%Y-%m-%d-%H%M%S).txt
ARGS=(--floats 421642 --pushes "$PUSHES" --reps "$REPS")
{
  echo "# bash bench/ps_rma.sh (REPS=$REPS PUSHES=$PUSHES); $(lscpu | sed -n 's/^Model name:[[:space:]]*/CPU: /p'), $(nproc) cores;" \
       "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg); $(mpirun --version | head -n 1)"
  echo
  echo "## shm: mpirun -np 2 --mca btl self,vader --mca pml ob1 $BIN ${ARGS[*]}"
  mpirun -np 2 --mca btl self,vader --mca pml ob1 "$BIN" "${ARGS[@]}" 2>&1
  echo
  echo "## tcp: mpirun -np 2 --mca btl self,tcp --mca pml ob1 --mca osc pt2pt $BIN ${ARGS[*]} --serialized"
  mpirun -np 2 --mca btl self,tcp --mca pml ob1 --mca osc pt2pt "$BIN" "${ARGS[@]}" --serialized 2>&1
  echo
  echo "## tcp, one-sided at MPI_THREAD_MULTIPLE through osc rdma (expected to fail: no RDMA btl over TCP)"
  if mpirun -np 2 --mca btl self,tcp --mca pml ob1 --mca osc rdma "$BIN" "${ARGS[@]}" >/dev/null 2>&1; then echo "ran"
  else echo "failed (exit $?)"; fi
  echo
  echo "## tcp-ucx: UCX_TLS=tcp,self mpirun -np 2 -x UCX_TLS --mca btl self,tcp --mca pml ob1 --mca osc ucx $BIN ${ARGS[*]}"
  UCX_TLS=tcp,self mpirun -np 2 -x UCX_TLS --mca btl self,tcp --mca pml ob1 --mca osc ucx "$BIN" "${ARGS[@]}" 2>&1
} | grep -v "ORTE_ERROR_LOG" | tee "$OUT"
echo "saved: $OUT" >&2
