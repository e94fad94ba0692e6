#!/usr/bin/env bash
# Tests of the unit-test runner itself (tests/test_main.c), with the
# selftest tests of tests/test_selftest.c (registered by DP_TEST_SELFTEST=1):
#   bash tests/harness.sh [BUILD_DIR]        (default build/)
# - a filter that matches no test is an error, alone or among good ones;
# - a skipped test prints "skip NAME (reason)" and counts as skipped, not passed;
# - a failed test, and an exit with the skip status but no reason, count as failed;
# - ASSERT_FEQ fails on a fraction (2.25 vs 2) and on NaN;
# - CI=true: a skip fails the run; without a skip the run passes;
# - fixtures are found from the binary: run from another directory, the
#   fixture tests do not skip;
# - more than 1024 tests all register.
# Prints one line per check and closes with "harness: N passed, N failed, N skipped".
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${1:-build}
BIN=$(pwd)/$BUILD/dptest
T=$(mktemp -d /tmp/dptest-harness.XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { echo "ok   harness $1"; pass=$((pass + 1)); }
bad() { echo "FAIL harness $1"; shift; local l; for l in "$@"; do echo "    $l"; done; fail=$((fail + 1)); }
if [[ ! -x $BIN ]]; then
  bad build "no $BIN (make)"; echo "harness: $pass passed, $fail failed, 0 skipped"; exit 1
fi
# st ARGS...: runs the runner (CI unset unless given), output in $T/out, exit status in RC
st() { env -u CI DP_TEST_SELFTEST=1 "$@" >"$T/out" 2>&1; RC=$?; }
closing() { tail -1 "$T/out"; }

st "$BIN" no_such_test_xyz
if [[ $RC -ne 0 ]] && grep -q "no test matches 'no_such_test_xyz'" "$T/out" && ! grep -qE '^(ok|FAIL|skip) ' "$T/out"; then
  ok "filter_matching_nothing (exit $RC, names the filter)"
else bad filter_matching_nothing "exit $RC" "$(head -5 "$T/out")"; fi

st "$BIN" selftest_passes no_such_test_xyz
if [[ $RC -ne 0 ]] && grep -q "no test matches 'no_such_test_xyz'" "$T/out" && ! grep -qE '^(ok|FAIL|skip) ' "$T/out"; then
  ok "one_filter_of_several_matching_nothing (exit $RC, nothing run)"
else bad one_filter_of_several_matching_nothing "exit $RC" "$(head -5 "$T/out")"; fi

# "^NAME" anchors a filter at the start of the name: "^passes" matches nothing
# (selftest_passes only contains it), "^selftest_pass" runs exactly selftest_passes
st "$BIN" '^passes'
if [[ $RC -ne 0 ]] && grep -q "no test matches '^passes'" "$T/out" && ! grep -qE '^(ok|FAIL|skip) ' "$T/out"; then
  ok "anchored_filter_matching_nothing (exit $RC)"
else bad anchored_filter_matching_nothing "exit $RC" "$(head -5 "$T/out")"; fi
st "$BIN" '^selftest_pass'
if [[ $RC -eq 0 ]] && [[ $(grep -cE '^(ok|FAIL|skip) ' "$T/out") -eq 1 ]] && grep -qE '^ok   selftest_passes ' "$T/out"; then
  ok "anchored_filter_selects_prefix ($(closing))"
else bad anchored_filter_selects_prefix "exit $RC" "$(head -5 "$T/out")"; fi

st "$BIN" selftest_skips selftest_passes
if [[ $RC -eq 0 ]] && grep -qE '^skip selftest_skips +\(selftest: this test always skips\)' "$T/out" &&
   ! grep -q '^ok   selftest_skips' "$T/out" && [[ $(closing) == "1 passed, 0 failed, 1 skipped" ]]; then
  ok "skip_counted_as_skipped ($(closing))"
else bad skip_counted_as_skipped "exit $RC" "$(cat "$T/out")"; fi

st "$BIN" selftest_fails selftest_exit77
if [[ $RC -ne 0 ]] && grep -q '^FAIL selftest_fails' "$T/out" && grep -q '^FAIL selftest_exit77' "$T/out" &&
   [[ $(closing) == "0 passed, 2 failed, 0 skipped" ]]; then
  ok "failures_counted (an assertion; exit 77 without a reason: $(closing))"
else bad failures_counted "exit $RC" "$(cat "$T/out")"; fi

st "$BIN" selftest_feq_
if [[ $RC -ne 0 ]] && grep -q '^FAIL selftest_feq_fraction' "$T/out" && grep -q '2.25 != 2' "$T/out" &&
   grep -q '^FAIL selftest_feq_nan' "$T/out" && [[ $(closing) == "0 passed, 2 failed, 0 skipped" ]]; then
  ok "assert_feq_exact (2.25 != 2, NaN != NaN)"
else bad assert_feq_exact "exit $RC" "$(cat "$T/out")"; fi

st env CI=true "$BIN" selftest_skips selftest_passes
if [[ $RC -ne 0 ]] && grep -q '^CI=true: 1 skipped test fails the run' "$T/out" && [[ $(closing) == "1 passed, 0 failed, 1 skipped" ]]; then
  ok "ci_skip_fails (exit $RC)"
else bad ci_skip_fails "exit $RC" "$(cat "$T/out")"; fi
st env CI=true "$BIN" selftest_passes
if [[ $RC -eq 0 && $(closing) == "1 passed, 0 failed, 0 skipped" ]]; then ok "ci_without_skip_passes"
else bad ci_without_skip_passes "exit $RC" "$(cat "$T/out")"; fi

# from another directory (no tests/fixtures below it), DP_TEST_FIXTURES unset
mkdir -p "$T/elsewhere"
(cd "$T/elsewhere" && env -u DP_TEST_FIXTURES -u CI DP_TEST_SELFTEST=1 "$BIN" selftest_fixture optim_torch_fixture >"$T/out" 2>&1); RC=$?
if [[ $RC -eq 0 ]] && grep -q '^ok   selftest_fixture' "$T/out" && grep -q '^ok   optim_torch_fixture' "$T/out" &&
   [[ $(closing) == "2 passed, 0 failed, 0 skipped" ]]; then
  ok "fixtures_from_another_cwd (run in $T/elsewhere)"
else bad fixtures_from_another_cwd "exit $RC" "$(cat "$T/out")"; fi

env -u CI DP_TEST_SELFTEST=1 "$BIN" --list >"$T/out" 2>&1; RC=$?
n=$(grep -c '^selftest_many_' "$T/out")
if [[ $RC -eq 0 && $n -eq 1100 ]]; then ok "over_1024_tests ($(wc -l <"$T/out") registered, all 1100 selftest_many_*)"
else bad over_1024_tests "exit $RC, $n of 1100 selftest_many_* listed, $(wc -l <"$T/out") in all"; fi

echo "harness: $pass passed, $fail failed, 0 skipped"
[[ $fail -eq 0 ]]
