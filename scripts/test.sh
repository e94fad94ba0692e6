#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this).
#   bash scripts/test.sh            everything
#   QUICK=1 bash scripts/test.sh    gcc build + unit, CLI and MPI tests only
# Installs what the tests need, builds with gcc and clang at -Werror, runs the
# unit tests, the CLI tests, the MPI tests (tests/mpi/run.sh), the unit tests
# under ASan+UBSan, the threaded tests under TSan, and each fuzzer briefly.
# Closes with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --torch || { echo "dependency install failed"; exit 1; }
J=${JOBS:-2}
total_pass=0 total_fail=0
step_failed=0
# tally LOG: adds the "N passed, N failed" line of a log to the totals
tally() {
  local line
  line=$(grep -E '^[a-z: ]*[0-9]+ passed, [0-9]+ failed' "$1" | tail -1)
  if [[ -z "$line" ]]; then total_fail=$((total_fail + 1)); return; fi
  local p f
  p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+'); f=$(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+')
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
}
run() { # run NAME CMD...: runs a stage, keeps its log, records failure
  local name=$1; shift
  echo "=== $name: $*"
  local log=/tmp/dptrain-test-$name.log
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  if [[ $rc -ne 0 ]]; then echo "=== $name FAILED (exit $rc)"; step_failed=1; fi
  return 0
}
build() { # build NAME MAKE-ARGS...: a build failure counts as a failed test
  echo "=== build $1"
  local name=$1; shift
  if ! make -j"$J" "$@" >/tmp/dptrain-build-$name.log 2>&1; then
    cat /tmp/dptrain-build-$name.log; echo "=== build $name FAILED"; total_fail=$((total_fail + 1)); step_failed=1; return 1
  fi
}
t0=$(date +%s)
if build gcc all; then
  run unit ./build/dptest; tally /tmp/dptrain-test-unit.log
  run cli bash tests/cli.sh build/dptrain; tally /tmp/dptrain-test-cli.log
  # the mpi backend under mpirun, P = 1..4 (skipped with a note without MPI)
  run mpi bash tests/mpi/run.sh build; tally /tmp/dptrain-test-mpi.log
fi
if [[ -z "${QUICK:-}" ]]; then
  build clang CC=clang all
  if build asan SAN=asan all; then
    # The PyTorch comparison is covered by the plain build; under ASan the rest runs.
    run asan env ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 ./build-asan/dptest; tally /tmp/dptrain-test-asan.log
    run cli-asan env ASAN_OPTIONS=detect_leaks=1 bash tests/cli.sh build-asan/dptrain; tally /tmp/dptrain-test-cli-asan.log
  fi
  if build tsan SAN=tsan build-tsan/dptest; then
    run tsan env TSAN_OPTIONS=halt_on_error=1 ./build-tsan/dptest data_loader comm_ ddp_equivalence_mlp ddp_failure ddp_skip ddp_check; tally /tmp/dptrain-test-tsan.log
  fi
  for f in tests/fuzz/run*.sh; do
    [[ -f $f ]] || continue
    n=$(basename "$f" .sh)
    if bash "$f" "${FUZZ_SECONDS:-20}" >/tmp/dptrain-fuzz-$n.log 2>&1; then
      echo "ok   fuzz $n"; total_pass=$((total_pass + 1))
    else
      tail -20 /tmp/dptrain-fuzz-$n.log; echo "FAIL fuzz $n"; total_fail=$((total_fail + 1))
    fi
  done
fi
if [[ -z "${QUICK:-}" ]]; then
  # emulated hosts (network namespaces, 1 Gbit/s links), MPI over TCP; skips itself unless root
  run netns bash tests/netns/test_cluster.sh build/dptrain; tally /tmp/dptrain-test-netns.log
fi
echo "suite time: $(( $(date +%s) - t0 ))s"
[[ $step_failed -eq 0 && $total_fail -eq 0 ]] || total_fail=$((total_fail > 0 ? total_fail : 1))
echo "$total_pass passed, $total_fail failed"
[[ $total_fail -eq 0 ]]
