#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this).
#   bash scripts/test.sh            everything
#   QUICK=1 bash scripts/test.sh    gcc build + unit, CLI, MPI and install tests only
# Installs what the tests need, builds with gcc and clang at -Werror, runs the
# runner self-tests, the docs checks (tests/docs.sh), the unit tests, the CLI
# tests, the MPI tests (tests/mpi/run.sh), the installed library used from
# outside the tree (tests/install.sh), the Python package (tests/python/run.sh),
# the unit tests under ASan+UBSan, the threaded tests under TSan, and each fuzzer
# briefly.
# Every stage closes its log with "N passed, N failed, N skipped"; this script
# adds them up and closes with the totals in the same form.  A skipped test
# fails the run: this script installs everything the tests need first, so a
# skip here is a fault, on a developer's machine as in CI (README's command
# and .ci/run are the same command).  It sets CI=true for its stages, which
# then fail on a skip themselves; CI=false runs them lenient (skips counted,
# not failed), for a machine where something cannot be installed.
set -uo pipefail
cd "$(dirname "$0")/.."
export CI=${CI:-true}
bash scripts/install-deps.sh --torch || { echo "dependency install failed"; exit 1; }
J=${JOBS:-2}
total_pass=0 total_fail=0 total_skip=0
step_failed=0
# tally LOG: adds the "N passed, N failed, N skipped" line of a log to the totals; a log
# without one (a crash, or a stage that does not count its skips) counts as a failure
tally() {
  local line
  line=$(grep -E '^[a-z: ]*[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$1" | tail -1)
  if [[ -z "$line" ]]; then echo "=== $1: no 'N passed, N failed, N skipped' line"; total_fail=$((total_fail + 1)); return; fi
  local p f s
  p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+'); f=$(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+')
  s=$(grep -oE '[0-9]+ skipped' <<<"$line" | grep -oE '[0-9]+')
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
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
  # the test runner itself: skips, filters, CI strictness, fixtures from any directory
  run harness bash tests/harness.sh build; tally /tmp/dptrain-test-harness.log
  run docs bash tests/docs.sh; tally /tmp/dptrain-test-docs.log
  run unit ./build/dptest; tally /tmp/dptrain-test-unit.log
  run cli bash tests/cli.sh build/dptrain; tally /tmp/dptrain-test-cli.log
  # the mpi backend under mpirun, P = 1..4 (a skip without MPI)
  run mpi bash tests/mpi/run.sh build; tally /tmp/dptrain-test-mpi.log
  # make install into a temporary prefix; the examples built out of the tree with pkg-config
  run install bash tests/install.sh; tally /tmp/dptrain-test-install.log
  # the Python package over build/libdptrain.so: numpy in, the CLI's hashes out, Ctrl-C, mpirun, pip
  run python bash tests/python/run.sh build; tally /tmp/dptrain-test-python.log
fi
if [[ -z "${QUICK:-}" ]]; then
  build clang CC=clang all
  if build asan SAN=asan all; then
    # The PyTorch comparison is covered by the plain build; under ASan the rest runs.
    run asan env ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 ./build-asan/dptest; tally /tmp/dptrain-test-asan.log
    run cli-asan env ASAN_OPTIONS=detect_leaks=1 bash tests/cli.sh build-asan/dptrain; tally /tmp/dptrain-test-cli-asan.log
  fi
  if build tsan SAN=tsan build-tsan/dptest; then
    # (+ the parameter server's shards under concurrent pushes, its trainer loops' cancel paths in
    # async, replay and SSP, the loader's balanced shares and simulated slowness: about 45 s of CPU;
    # the backup workers' step slot on a tiny model (the other backup_ trainer tests, 2 min each
    # under TSan, are left to the plain and ASan stages); ZeRO-1's all-gather left in flight while
    # forward reads the ranges already gathered (2 s); an image folder decoded on 1, 3 and 7 threads;
    # the background checkpoint writer beside the workers' steps; the pipeline's stages (messages between
    # neighbours, the stages' own all-reduces, a failing stage); the tensor groups' sums inside the pass;
    # ZeRO-3 gathering and reduce-scattering a layer's slices (--zero-unit-mb) while it computes;
    # oneDNN's convolution primitives made and run by the workers at once (worker threads; the
    # groups' OpenMP threads are not TSan's to see: libgomp is not instrumented)
    run tsan env TSAN_OPTIONS=halt_on_error=1 ./build-tsan/dptest data_loader '^comm_' ddp_equivalence_mlp ddp_failure ddp_skip ddp_check gpt_ddp_ \
      '^ps_concurrent_' '^ps_ssp_sum' '^ps_async_staleness_lr' '^ps_failure_' '^balance_loader' '^slow_deterministic' \
      '^backup_tiny' '^zero1_ahead' ddp_procs_zero1 '^images_threads' '^images_skip_bad' \
      '^snapshot_' '^pipe_' '^tp_' '^zero3_unit' '^ddp_deterministic_cnn16'; tally /tmp/dptrain-test-tsan.log
  fi
  # The fuzzers are single-threaded and time-boxed: they run side by side
  # (each for FUZZ_SECONDS of wall time), then their results are read in order.
  fuzz_pids=() fuzz_names=()
  for f in tests/fuzz/run*.sh; do
    [[ -f $f ]] || continue
    n=$(basename "$f" .sh)
    bash "$f" "${FUZZ_SECONDS:-20}" >/tmp/dptrain-fuzz-$n.log 2>&1 &
    fuzz_pids+=($!) fuzz_names+=("$n")
  done
  for i in "${!fuzz_pids[@]}"; do
    n=${fuzz_names[$i]}
    if wait "${fuzz_pids[$i]}"; then
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
strict_skip=0
if [[ $total_skip -gt 0 && -n ${CI:-} && $CI != 0 && ${CI,,} != false ]]; then
  strict_skip=1; echo "CI=$CI: $total_skip skipped fail the run (grep '^skip' /tmp/dptrain-test-*.log)"
fi
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[[ $total_fail -eq 0 && $strict_skip -eq 0 ]]
