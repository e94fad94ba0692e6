#!/usr/bin/env bash
# All-reduce bus bandwidth side by side, in one run, for the same sizes:
#   dptrain's thread backend     (dptrain bench allreduce, P=2 threads)
#   Open MPI's MPI_Allreduce     (bench/mpi_allreduce.c, 2 processes, btl self,vader)
#   PyTorch 1.13 gloo all_reduce (bench/gloo_allreduce.py, 2 processes)
#   dptrain's mpi backend        (mpirun -np 2 dptrain bench allreduce --backend mpi,
#                                 btl self,vader) with each algorithm: native (MPI's
#                                 blocking MPI_Allreduce: no timeout), native-polled
#                                 (--timeout 120: MPI_Iallreduce polled by the
#                                 backend), ring and rhd (the project's, over MPI
#                                 point-to-point); and Open MPI's MPI_Allreduce again
#                                 with dptrain's malloc settings (mpi-heap: its per-call
#                                 temporary buffers stay in the heap instead of being
#                                 fresh pages every call)
# Every one: float32 sum in place, buffers allocated and touched once, a barrier
# before each timed call, the slowest rank's time, the median over iterations;
# busbw = bytes/time * 2(P-1)/P.
#
#   bench/allreduce_vs_mpi.sh
#   REPS=3 bench/allreduce_vs_mpi.sh          # 3 rounds, rotating the order; median of rounds
#   MIN_BYTES=1M MAX_BYTES=64M bench/allreduce_vs_mpi.sh
#
# Knobs: MIN_BYTES MAX_BYTES (4K, 256M) REPS (1) WORKERS (2) ALGO (auto) DPTRAIN
# (./build/dptrain) PY (/usr/bin/python3) RESULTS (bench/results) SKIP_MPI=1 SKIP_GLOO=1
# SKIP_DPMPI=1 (no mpi-backend rows).
# Needs `make` first, and for the MPI column `apt-get install -y openmpi-bin
# libopenmpi-dev`.  Writes bench/results/allreduce_vs_mpi-<date>.md (the table)
# and the raw outputs in bench/results/allreduce_vs_mpi-<date>/.
set -euo pipefail
cd "$(dirname "$0")/.."

MIN_BYTES=${MIN_BYTES:-4K}
MAX_BYTES=${MAX_BYTES:-256M}
REPS=${REPS:-1}
WORKERS=${WORKERS:-2}
ALGO=${ALGO:-auto}
DPTRAIN=${DPTRAIN:-./build/dptrain}
PY=${PY:-/usr/bin/python3}
RESULTS=${RESULTS:-bench/results}
STAMP=$(date +%Y-%m-%d-%H%M%S)
OUT="$RESULTS/allreduce_vs_mpi-$STAMP"
mkdir -p "$OUT"
T=$(mktemp -d /tmp/allreduce_vs_mpi.XXXXXX)
trap 'rm -rf "$T"' EXIT

# --- dptrain: the CLI command, or a driver around the command's object file ---
if "$DPTRAIN" bench allreduce --help >/dev/null 2>&1; then
  DP_CMD=("$DPTRAIN" bench allreduce)
else
  [[ -f build/tools/dptrain/bench_allreduce.o && -f build/libdptrain.a ]] || make -j1 all >/dev/null
  printf 'int dptrain_cmd_bench_allreduce(int, char **);\nint main(int c, char **v) { return dptrain_cmd_bench_allreduce(c, v); }\n' >"$T/driver.c"
  LIBS=(-lz -lm -lpthread -fopenmp)
  [[ -f /usr/include/dnnl.h ]] && LIBS+=(-ldnnl)
  ls /usr/include/cblas.h /usr/include/x86_64-linux-gnu/cblas.h >/dev/null 2>&1 && LIBS+=(-lopenblas)
  cc -O2 -o "$T/dptrain_bench" "$T/driver.c" build/tools/dptrain/bench_allreduce.o build/libdptrain.a "${LIBS[@]}"
  DP_CMD=("$T/dptrain_bench" allreduce)
fi

# --- Open MPI ---
HAVE_MPI=0
if [[ -z "${SKIP_MPI:-}" ]] && command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mpicc -O2 -DDP_BENCH_MPI -o "$T/mpi_allreduce" bench/mpi_allreduce.c
  HAVE_MPI=1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  MPI_CMD=(mpirun --allow-run-as-root -np "$WORKERS" --mca btl self,vader --mca pml ob1 "$T/mpi_allreduce")
  MPI_HEAP_CMD=(mpirun --allow-run-as-root -np "$WORKERS" --mca btl self,vader --mca pml ob1
                "$T/mpi_allreduce" --mallopt)
elif [[ -z "${SKIP_MPI:-}" ]]; then
  echo "note: mpicc/mpirun not found (apt-get install -y openmpi-bin libopenmpi-dev); no MPI column" >&2
fi

# --- dptrain's mpi backend ---
HAVE_DPMPI=0
if [[ $HAVE_MPI == 1 && -z "${SKIP_DPMPI:-}" ]] && [[ $("$DPTRAIN" bench allreduce --help 2>&1) == *--backend* ]]; then
  HAVE_DPMPI=1
  DPMPI_CMD=(mpirun --allow-run-as-root -np "$WORKERS" --mca btl self,vader --mca pml ob1
             "$DPTRAIN" bench allreduce --backend mpi)
fi

# --- gloo ---
HAVE_GLOO=0
if [[ -z "${SKIP_GLOO:-}" ]] && "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
  HAVE_GLOO=1
  GLOO_CMD=("$PY" bench/gloo_allreduce.py --workers "$WORKERS" --threads 1)
elif [[ -z "${SKIP_GLOO:-}" ]]; then
  echo "note: $PY has no torch with gloo; no gloo column" >&2
fi

SIZES=(--min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES")
run() { # name rep cmd...
  local name=$1 rep=$2; shift 2
  echo "== $name (round $rep): $*" >&2
  "$@" "${SIZES[@]}" >"$OUT/$name.$rep.txt" 2>"$OUT/$name.$rep.err" || {
    echo "error: $name failed:" >&2; cat "$OUT/$name.$rep.err" >&2; exit 1; }
}
for ((rep = 1; rep <= REPS; rep++)); do
  order=(dptrain mpi gloo)
  [[ $HAVE_DPMPI == 1 ]] && order+=(mpi-heap dpmpi-native dpmpi-native-polled dpmpi-ring dpmpi-rhd)
  for ((k = 1; k < rep; k++)); do order=("${order[@]:1}" "${order[0]}"); done
  for name in "${order[@]}"; do
    case $name in
      dptrain) run dptrain "$rep" "${DP_CMD[@]}" --workers "$WORKERS" --algo "$ALGO" ;;
      mpi) [[ $HAVE_MPI == 1 ]] && run mpi "$rep" "${MPI_CMD[@]}" ;;
      gloo) [[ $HAVE_GLOO == 1 ]] && run gloo "$rep" "${GLOO_CMD[@]}" ;;
      mpi-heap) run mpi-heap "$rep" "${MPI_HEAP_CMD[@]}" ;;
      dpmpi-native) run dpmpi-native "$rep" "${DPMPI_CMD[@]}" --algo native ;;
      dpmpi-native-polled) run dpmpi-native-polled "$rep" "${DPMPI_CMD[@]}" --algo native --timeout 120 ;;
      dpmpi-ring) run dpmpi-ring "$rep" "${DPMPI_CMD[@]}" --algo ring ;;
      dpmpi-rhd) run dpmpi-rhd "$rep" "${DPMPI_CMD[@]}" --algo rhd ;;
    esac
  done
done

# --- the table ---
"$PY" - "$OUT" "$REPS" "$WORKERS" "$STAMP" >"$RESULTS/allreduce_vs_mpi-$STAMP.md" <<'EOF'
import glob, os, statistics, sys
out, reps, workers, stamp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def load(name):
    rows = {}  # bytes -> list of (busbw, best_busbw, time_us, algo)
    for f in sorted(glob.glob(os.path.join(out, name + ".*.txt"))):
        for line in open(f):
            p = line.split()
            if not p or line.startswith("#") or not p[0].isdigit():
                continue
            rows.setdefault(int(p[0]), []).append((float(p[6]), float(p[7]), float(p[4]), p[3]))
    return rows
dp, mpi, gloo = load("dptrain"), load("mpi"), load("gloo")
mheap = load("mpi-heap")
dpm = {a: load("dpmpi-" + a) for a in ("native", "native-polled", "ring", "rhd")}
def med(rows, b, k):
    return statistics.median(r[k] for r in rows[b]) if b in rows else None
def fmt(v):
    return "n/a" if v is None else ("%.3f" % v if v < 10 else "%.2f" % v)
def ratio(a, b):
    return "n/a" if a is None or b is None or b == 0 else "%.1fx" % (a / b)
def ratio2(a, b):
    return "n/a" if a is None or b is None or b == 0 else "%.2fx" % (a / b)
def size(b):
    return "%d KiB" % (b >> 10) if b < (1 << 20) else "%d MiB" % (b >> 20)
head = ""
for f in sorted(glob.glob(os.path.join(out, "*.1.txt"))):
    head += "".join("    " + l for l in open(f) if l.startswith("# ") and "memory" not in l)
mem = [l[2:].strip() for f in glob.glob(os.path.join(out, "dptrain.*.txt")) for l in open(f) if l.startswith("# memory")]
load_avg = open("/proc/loadavg").read().split()[:3]
print("# All-reduce: dptrain thread backend vs Open MPI vs PyTorch gloo (%s)\n" % stamp)
print("P = %d ranks, float32 sum in place; median over iterations of the slowest rank's time, "
      "then the median over %d round(s); busbw = bytes/time * 2(P-1)/P, GB/s. "
      "Load average at the end: %s (other jobs share the 2 cores).\n" % (workers, reps, " ".join(load_avg)))
print("| size | dptrain busbw | Open MPI busbw | gloo busbw | dptrain / MPI | dptrain / gloo | dptrain algo |")
print("|---:|---:|---:|---:|---:|---:|---|")
for b in sorted(dp):
    d, m, g = med(dp, b, 0), med(mpi, b, 0), med(gloo, b, 0)
    print("| %s | %s | %s | %s | %s | %s | %s |" % (size(b), fmt(d), fmt(m), fmt(g), ratio(d, m), ratio(d, g), dp[b][0][3]))
print("\nBest iteration (busbw from the fastest call; what each can do when it has the CPUs):\n")
print("| size | dptrain | Open MPI | gloo |")
print("|---:|---:|---:|---:|")
for b in sorted(dp):
    print("| %s | %s | %s | %s |" % (size(b), fmt(med(dp, b, 1)), fmt(med(mpi, b, 1)), fmt(med(gloo, b, 1))))
if mem:
    print("\nMemory bound (measured by dptrain bench allreduce): " + mem[0])
if any(dpm[a] for a in dpm):
    print("\n## dptrain mpi backend (%d processes, btl self,vader) vs Open MPI\n" % workers)
    print("busbw GB/s, median over iterations then over rounds. native = MPI_Allreduce called by "
          "the backend (no timeout); native-polled = MPI_Iallreduce polled by the backend's wait "
          "(--timeout 120); ring, rhd = the project's algorithms over MPI_Isend/Irecv; Open MPI (heap) = "
          "bench/mpi_allreduce --mallopt (dptrain's malloc settings: Open MPI's per-call temporary "
          "buffers stay in the heap).\n")
    print("| size | Open MPI | Open MPI (heap) | native | native-polled | ring | rhd | ring / Open MPI | ring / Open MPI (heap) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in sorted(dpm["ring"] or dpm["native"]):
        m, mt = med(mpi, b, 0), med(mheap, b, 0)
        vals = [med(dpm[a], b, 0) for a in ("native", "native-polled", "ring", "rhd")]
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % ((size(b), fmt(m), fmt(mt)) + tuple(fmt(v) for v in vals) + (ratio2(vals[2], m), ratio2(vals[2], mt))))
    print("\nBest iteration:\n")
    print("| size | Open MPI | Open MPI (heap) | native | native-polled | ring | rhd |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for b in sorted(dpm["ring"] or dpm["native"]):
        vals = [med(mpi, b, 1), med(mheap, b, 1)] + [med(dpm[a], b, 1) for a in ("native", "native-polled", "ring", "rhd")]
        print("| %s | %s |" % (size(b), " | ".join(fmt(v) for v in vals)))
print("\nCommands and versions:\n\n" + head)
EOF
cat "$RESULTS/allreduce_vs_mpi-$STAMP.md"
echo "saved: $RESULTS/allreduce_vs_mpi-$STAMP.md (raw outputs in $OUT/)" >&2
