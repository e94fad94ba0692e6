#!/usr/bin/env bash
# dptrain against scikit-learn's MLP on its bundled sets (issue 29's target, "a real peer, on
# data no one here made"): digits, breast_cancer, wine and diabetes, each from .npy and from
# CSV, against MLPClassifier / MLPRegressor(hidden_layer_sizes=(64,)) on the same seeded 80/20
# split; accuracy (RMSE) and wall seconds of both sides, and whether each target is met
# (bench/sklearn_peer.py says which).
#   bash bench/sklearn_peer.sh              # about 1 minute
#   WORKERS=1 bash bench/sklearn_peer.sh
# Writes bench/results/sklearn_peer-<date>.txt (needs `make`; installs python3-sklearn).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORKERS=${WORKERS:-2}
RESULTS=${RESULTS:-bench/results}
DPTRAIN=${DPTRAIN:-./build/dptrain}
[[ -x $DPTRAIN ]] || { echo "build $DPTRAIN first (make)" >&2; exit 1; }
/usr/bin/python3 -c "import sklearn, numpy" 2>/dev/null || {
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get install -y -q --no-install-recommends python3-sklearn python3-numpy >/dev/null || exit 1; }
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts sklearn_peer
OUT=$RESULTS/sklearn_peer-$STAMP.txt
{
  echo "# bash bench/sklearn_peer.sh (WORKERS=$WORKERS) at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  echo "# scikit-learn $(/usr/bin/python3 -c 'import sklearn; print(sklearn.__version__)'), one process;"
  echo "# dptrain --workers $WORKERS, Adam(W) lr 1e-3, batch min(200, n), max_iter epochs, --normalize auto"
  /usr/bin/python3 bench/sklearn_peer.py "$DPTRAIN" "$WORKERS"
} 2>&1 | tee "$OUT"
exit "${PIPESTATUS[0]}"
