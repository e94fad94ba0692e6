#!/usr/bin/env bash
# An .npy larger than the memory the run may use trains (issue 29, N1): the features are
# memory-mapped, and the kernel pages rows in as batches read them and drops them again (clean
# pages of a file).  The run goes in a memory cgroup (v1 memory.limit_in_bytes, or v2
# memory.max) of LIMIT_MIB, with swap barred, over an X.npy of FILE_MIB (default 3x the limit);
# it must finish its epochs, and the cgroup's peak is printed beside the limit and the file.
#   bash bench/npy_larger_than_memory.sh                 # as root; about 1-2 minutes
#   LIMIT_MIB=512 FILE_MIB=2048 EPOCHS=1 bash bench/npy_larger_than_memory.sh
# Writes bench/results/npy_larger_than_memory-<date>.txt.  Needs root (a cgroup), numpy.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LIMIT_MIB=${LIMIT_MIB:-400}
FILE_MIB=${FILE_MIB:-$((3 * LIMIT_MIB))}
EPOCHS=${EPOCHS:-1}
RESULTS=${RESULTS:-bench/results}
DPTRAIN=${DPTRAIN:-./build/dptrain}
WORK=${WORK:-$(mktemp -d /tmp/dptrain-npybig.XXXXXX)}
[[ -x $DPTRAIN ]] || { echo "build $DPTRAIN first (make)" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "needs root: it makes a memory cgroup" >&2; exit 1; }
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts npy_larger_than_memory
OUT=$RESULTS/npy_larger_than_memory-$STAMP.txt
# the cgroup: v1's memory controller where mounted, else v2
if [[ -d /sys/fs/cgroup/memory ]]; then
  CG=/sys/fs/cgroup/memory/dptrain-npybig-$$
  mkdir "$CG" || exit 1
  echo $((LIMIT_MIB << 20)) >"$CG/memory.limit_in_bytes"
  [[ -f $CG/memory.memsw.limit_in_bytes ]] && echo $((LIMIT_MIB << 20)) >"$CG/memory.memsw.limit_in_bytes"
  PEAK=$CG/memory.max_usage_in_bytes LIMIT_FILE=$CG/memory.limit_in_bytes
else
  CG=/sys/fs/cgroup/dptrain-npybig-$$
  mkdir "$CG" || exit 1
  echo $((LIMIT_MIB << 20)) >"$CG/memory.max"
  echo 0 >"$CG/memory.swap.max" 2>/dev/null
  PEAK=$CG/memory.peak LIMIT_FILE=$CG/memory.max
fi
trap 'rmdir "$CG" 2>/dev/null; rm -rf "$WORK"' EXIT
# X.npy: (N, 3, 32, 32) float32 of FILE_MIB, written in pieces (never whole in memory); the
# label of a sample is which of 10 bands its mean falls in, so there is something to learn
N=$(( (FILE_MIB << 20) / (3 * 32 * 32 * 4) ))
/usr/bin/python3 - "$WORK" "$N" <<'PY'
import sys, numpy as np
d, n = sys.argv[1], int(sys.argv[2])
x = np.lib.format.open_memmap(f"{d}/x.npy", mode="w+", dtype=np.float32, shape=(n, 3, 32, 32))
y = np.empty(n, np.int64)
r = np.random.default_rng(1)
for i in range(0, n, 4096):
    k = min(4096, n - i)
    c = r.integers(0, 10, k)
    x[i:i + k] = r.normal(0, 1, (k, 3, 32, 32)).astype(np.float32) + 0.3 * c[:, None, None, None]
    y[i:i + k] = c
x.flush(); del x
np.save(f"{d}/y.npy", y)
PY
sync
echo 3 >/proc/sys/vm/drop_caches 2>/dev/null  # the file starts outside memory
{
  echo "# bash bench/npy_larger_than_memory.sh (LIMIT_MIB=$LIMIT_MIB FILE_MIB=$FILE_MIB EPOCHS=$EPOCHS) at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  echo "# X.npy: $N samples of 3x32x32 float32, $(du -m "$WORK/x.npy" | cut -f1) MiB on disk"
  echo "# cgroup $CG: limit $(( $(cat "$LIMIT_FILE") >> 20 )) MiB (swap barred)"
  echo "# $DPTRAIN train --data x.npy --labels y.npy --model mlp:hidden=64 --epochs $EPOCHS --batch 256 --workers 2"
  ( echo $BASHPID >"$CG/cgroup.procs" 2>/dev/null || echo $BASHPID >"$CG/tasks"
    exec /usr/bin/time -f "wall %e s, max RSS %M KiB (mapped pages of the file included while resident)" \
      "$DPTRAIN" train --data "$WORK/x.npy" --labels "$WORK/y.npy" --model mlp:hidden=64 --epochs "$EPOCHS" \
      --batch 256 --lr 0.01 --momentum 0.9 --workers 2 --progress none )
  rc=$?
  peak=$(( $(cat "$PEAK") >> 20 ))
  echo "exit status $rc; the cgroup's peak: $peak MiB of its $LIMIT_MIB MiB limit, for a file of $FILE_MIB MiB" \
       "($(awk -v f="$FILE_MIB" -v l="$LIMIT_MIB" 'BEGIN {printf "%.2f", f / l}')x the limit)"
  [[ $rc -eq 0 && $peak -le $LIMIT_MIB ]] && echo "result: trained on a file larger than the memory it may use" ||
    echo "result: FAILED"
} 2>&1 | tee "$OUT"
