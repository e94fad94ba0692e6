#!/usr/bin/env bash
# The Python package (python/dptrain) against a build's libdptrain.so:
#   bash tests/python/run.sh [BUILD]          BUILD: the build folder (default build)
# Runs every test of tests/python/test_*.py with pytest and Debian's python3 (numpy; torch for the
# from_torch tests), one line per test ("ok python NAME", "FAIL python NAME", "skip python NAME
# (why)"), and closes with "python: N passed, N failed, N skipped"; a skip fails the run when CI
# is set (CI=true), as in the other stages.  Needs BUILD/libdptrain.so and BUILD/dptrain (the
# CLI, whose hashes the package must give), mpirun for the MPI test, and python3-venv and pip for
# the pip install test.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-build}
PY=${PYTHON:-/usr/bin/python3}
export DPTRAIN_LIB=$ROOT/$BUILD/libdptrain.so DPTRAIN_CLI=$ROOT/$BUILD/dptrain PYTHONPATH=$ROOT/python
export DPTRAIN_ROOT=$ROOT
# one worker thread per core at most: the stage shares the machine with nothing else of its own
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
if [[ ! -e $DPTRAIN_LIB ]]; then
  echo "FAIL python: no $DPTRAIN_LIB (make BUILD=$BUILD)"
  echo "python: 0 passed, 1 failed, 0 skipped"
  exit 1
fi
# pytest runs the unittest cases; conftest.py prints the suite's lines in place of pytest's own
# (-p no:cacheprovider: nothing written into the tree; a file that does not import fails, the
# others run)
cd "$ROOT" && exec "$PY" -m pytest -p no:cacheprovider --continue-on-collection-errors tests/python "$@"
