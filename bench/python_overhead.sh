#!/usr/bin/env bash
# What training from Python costs against the CLI (issue 30's target: fit within 3% of the CLI's
# samples/s on the same run, cnn, 2 workers): the first LIMIT samples of Fashion-MNIST as numpy
# arrays, trained by Model.fit (python/dptrain, the arrays borrowed) and by `dptrain train` on
# the same arrays saved as .npy, REPS rounds interleaved; samples/s is each run's last epoch
# record's (metrics.jsonl's samples_per_s, which fit's History holds too), medians per side.
#   bash bench/python_overhead.sh                      # about 1 minute
#   MODEL=mlp REPS=5 LIMIT=25600 EPOCHS=3 bash bench/python_overhead.sh
# Writes bench/results/python_overhead-<date>.txt (needs `make`, numpy).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=${REPS:-3}
MODEL=${MODEL:-cnn}
LIMIT=${LIMIT:-12800}
EPOCHS=${EPOCHS:-2}
WORKERS=${WORKERS:-2}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
RESULTS=${RESULTS:-bench/results}
DPTRAIN=${DPTRAIN:-./build/dptrain}
LIB=${DPTRAIN_LIB:-$(dirname "$DPTRAIN")/libdptrain.so}
WORK=$(mktemp -d /tmp/dptrain-pyovh.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
[[ -x $DPTRAIN && -e $LIB ]] || { echo "build $DPTRAIN and $LIB first (make)" >&2; exit 1; }
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts python_overhead
OUT=$RESULTS/python_overhead-$STAMP.txt
OPTS=(--model "$MODEL" --epochs "$EPOCHS" --batch 128 --workers "$WORKERS" --lr 0.05 --momentum 0.9)
/usr/bin/python3 - "$DATA" "$WORK" "$LIMIT" <<'PY'
import gzip, sys, numpy as np
d, w, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
x = np.frombuffer(gzip.open(f"{d}/train-images-idx3-ubyte.gz").read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
y = np.frombuffer(gzip.open(f"{d}/train-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)
np.save(f"{w}/x.npy", x[:n]); np.save(f"{w}/y.npy", y[:n])
PY
cat >"$WORK/fit.py" <<PY
import sys, numpy as np, dptrain
X, y = np.load("$WORK/x.npy"), np.load("$WORK/y.npy")
h = dptrain.Model("$MODEL").fit(X, y, epochs=$EPOCHS, batch_size=128, workers=$WORKERS, lr=0.05, momentum=0.9,
                                verbose=0)
print(h[-1]["samples_per_s"])
PY
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
cli=() py=()
for ((r = 0; r < REPS; r++)); do
  "$DPTRAIN" train --data "$WORK/x.npy" --labels "$WORK/y.npy" "${OPTS[@]}" --out "$WORK/cli" --overwrite \
    --progress none >"$WORK/cli.log" 2>&1 || { cat "$WORK/cli.log"; exit 1; }
  cli+=("$(grep '"kind": "epoch"' "$WORK/cli/metrics.jsonl" | tail -1 | sed 's/.*"samples_per_s": \([0-9.]*\).*/\1/')")
  py+=("$(DPTRAIN_LIB=$LIB PYTHONPATH=$ROOT/python /usr/bin/python3 "$WORK/fit.py")") || exit 1
done
c=$(echo "${cli[*]}" | median) p=$(echo "${py[*]}" | median)
{
  echo "# bash bench/python_overhead.sh (REPS=$REPS MODEL=$MODEL LIMIT=$LIMIT EPOCHS=$EPOCHS WORKERS=$WORKERS) at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  echo "# cli: $DPTRAIN train --data x.npy --labels y.npy ${OPTS[*]}; python: Model.fit on the same arrays"
  echo "# samples/s: the last epoch's record; median of $REPS, the two interleaved"
  printf "%-7s %10s  %s\n" side median "all runs (samples/s)"
  printf "%-7s %10s  %s\n" cli "$c" "${cli[*]}"
  printf "%-7s %10s  %s\n" python "$p" "${py[*]}"
  awk -v p="$p" -v c="$c" 'BEGIN { printf "python / cli: %.3f\n", p / c }'
} | tee "$OUT"
