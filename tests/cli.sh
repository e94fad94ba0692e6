#!/usr/bin/env bash
# End-to-end tests of the dptrain command line on the real Fashion-MNIST files
# (small subsets so the whole file runs in about a minute).
#   bash tests/cli.sh [path/to/dptrain]
# Prints one line per check and closes with "cli: N passed, N failed, N skipped"; a skip fails
# the run when CI is set (CI=true).
set -u
BIN=${1:-build/dptrain}
DATA=${DP_DATA:-/usr/share/datasets/fashion-mnist}
T=$(mktemp -d /tmp/dptrain-cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
# gpt's --data DIR prepares into $XDG_CACHE_HOME/dptrain: keep it in $T, out of the user's ~/.cache
export XDG_CACHE_HOME="$T/cache"
pass=0 fail=0 skipped=0
ok() { echo "ok   cli $1"; pass=$((pass + 1)); }
bad() { echo "FAIL cli $1"; shift; for l in "$@"; do echo "    $l"; done; fail=$((fail + 1)); }
skip() { echo "skip cli $1 ($2)"; skipped=$((skipped + 1)); }

# run NAME EXPECT_RC CMD...: EXPECT_RC = 0 or "err" (exit 1 with one clear error line)
expect_error() {
  local name=$1 needle=$2; shift 2
  "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [[ $rc -ne 1 && $rc -ne 2 ]]; then bad "$name" "exit status $rc (expected 1 or 2)" "$(head -c 400 "$T/err")"; return; fi
  if ! grep -q "^dptrain: error: .*$needle" "$T/err"; then bad "$name" "no error line with '$needle'" "$(head -c 400 "$T/err")"; return; fi
  if [[ $(wc -l <"$T/err") -ne 1 ]]; then bad "$name" "expected one error line, got:" "$(cat "$T/err")"; return; fi
  ok "$name"
}
hash_of() { "$BIN" ckpt info "$1" | awk '/^param hash:/ {print $3}'; }
# same_hash A B: true when both hashes are non-empty and equal.  An empty hash
# means a run or `ckpt info` failed, and two failures must never compare equal.
same_hash() { [[ -n "$1" && -n "$2" && "$1" == "$2" ]]; }
# the step numbers of a metrics.jsonl's step records, one per line, in file order
steps_of() { sed -n 's/^{"kind": "step", "step": \([0-9]*\),.*/\1/p' "$1"; }
# wait_steps FILE N: until FILE holds N step records (at most 60 s)
wait_steps() {
  local k=0
  while (( k < 600 )); do
    [[ -f $1 ]] && (( $(grep -c '"kind": "step"' "$1" 2>/dev/null) >= $2 )) && return 0
    sleep 0.1; k=$((k + 1))
  done
  return 1
}
# a checkpoint's step
step_of() { "$BIN" ckpt info "$1" | awk '/^step:/ {print $2}'; }
# test_acc_of LOG: the "test acc X%" figure of the last line that has one, as printed
test_acc_of() { awk '{for (i = 2; i < NF; i++) if ($(i-1) == "test" && $i == "acc") v = $(i+1)} END {sub("%", "", v); print v}' "$1"; }

SMALL=(--data "$DATA" --train-limit 1000 --test-limit 500 --batch 50 --lr 0.05 --momentum 0.9 --progress none)

# --- help ----------------------------------------------------------------------
if "$BIN" --help | grep -q "usage: dptrain" && "$BIN" train --help | grep -q -- "--epochs" &&
   "$BIN" help ckpt | grep -q "ckpt info"; then ok help; else bad help "help text missing"; fi

# --- a short training run -------------------------------------------------------
if "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --out "$T/a" >"$T/a.log" 2>&1 &&
   grep -q "^epoch 2/2 .*test acc" "$T/a.log" && [[ -s "$T/a/checkpoint.bin" ]] &&
   [[ $(grep -c '"kind": "epoch"' "$T/a/metrics.jsonl") -eq 2 ]] && grep -q '"test_acc"' "$T/a/metrics.jsonl" &&
   [[ $(grep -c '"kind": "step"' "$T/a/metrics.jsonl") -eq 40 ]] && grep -q '"comm_exposed_s"' "$T/a/metrics.jsonl"; then
  ok train_mlp
else bad train_mlp "$(tail -5 "$T/a.log")"; fi
acc=$(awk '/^epoch 2\/2/ {for (i=1;i<=NF;i++) if ($i=="acc" && $(i-1)=="test") print $(i+1)}' "$T/a.log" | tr -d '%')
if awk -v a="${acc:-0}" 'BEGIN {exit !(a > 60)}'; then ok learns; else bad learns "test acc after 2 small epochs: ${acc:-none}"; fi

# --- exact resume: 2 epochs straight == 1 epoch + resume + 1 epoch --------------
for m in mlp cnn; do
  "$BIN" train --model $m --epochs 2 "${SMALL[@]}" --out "$T/s$m" >/dev/null 2>&1
  "$BIN" train --model $m --epochs 1 "${SMALL[@]}" --out "$T/r$m" >/dev/null 2>&1
  "$BIN" train --model $m --epochs 2 "${SMALL[@]}" --out "$T/r$m" --resume "$T/r$m/checkpoint.bin" >"$T/r$m.log" 2>&1
  h1=$(hash_of "$T/s$m/checkpoint.bin"); h2=$(hash_of "$T/r$m/checkpoint.bin")
  if same_hash "$h1" "$h2"; then ok "resume_exact_$m"; else bad "resume_exact_$m" "straight '$h1' vs resumed '$h2'" "$(tail -3 "$T/r$m.log")"; fi
done
# resume from the middle of an epoch (--max-steps stops mid-epoch and checkpoints)
"$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --max-steps 7 --out "$T/mid" >/dev/null 2>&1
"$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --out "$T/mid" --resume "$T/mid/checkpoint.bin" >/dev/null 2>&1
h3=$(hash_of "$T/mid/checkpoint.bin"); h4=$(hash_of "$T/smlp/checkpoint.bin")
if same_hash "$h3" "$h4"; then ok resume_mid_epoch; else bad resume_mid_epoch "resumed '$h3' vs straight '$h4'"; fi

# --- data parallelism ------------------------------------------------------------
# deterministic mode: the same bits for 1, 2 and 3 workers, and across a resume
# that changes the worker count
for P in 1 2 3; do
  "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers $P --deterministic --out "$T/det$P" >/dev/null 2>&1
done
d1=$(hash_of "$T/det1/checkpoint.bin"); d2=$(hash_of "$T/det2/checkpoint.bin"); d3=$(hash_of "$T/det3/checkpoint.bin")
if same_hash "$d1" "$d2" && same_hash "$d1" "$d3"; then ok deterministic_workers_1_2_3; else bad deterministic_workers_1_2_3 "'$d1' '$d2' '$d3'"; fi
"$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 2 --deterministic --out "$T/detr" >/dev/null 2>&1
"$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 1 --deterministic --out "$T/detr" --resume "$T/detr/checkpoint.bin" >/dev/null 2>&1
h=$(hash_of "$T/detr/checkpoint.bin")
if same_hash "$h" "$d1"; then ok deterministic_resume_other_worker_count; else bad deterministic_resume_other_worker_count "'$h' vs '$d1'"; fi
# the default chunk follows the batch alone (dp_det_chunk_auto: batch / 4 within 8..32): at batch
# 128 it is 32 on 1 and 3 workers (3 workers: 2, 1 and 1 of the 4 chunks), named in the header, and
# its bits are --det-chunk 32's, not 8's
for c in auto 8 32; do
  for P in 1 3; do
    [[ $c != auto && $P == 3 ]] && continue
    extra=(); [[ $c != auto ]] && extra=(--det-chunk "$c")
    "$BIN" train --model mlp "${SMALL[@]}" --batch 128 --max-steps 3 --workers $P --deterministic "${extra[@]}" \
      --out "$T/dc_${c}_$P" >"$T/dc_${c}_$P.log" 2>&1
  done
done
ha1=$(hash_of "$T/dc_auto_1/checkpoint.bin"); ha3=$(hash_of "$T/dc_auto_3/checkpoint.bin")
h8=$(hash_of "$T/dc_8_1/checkpoint.bin"); h32=$(hash_of "$T/dc_32_1/checkpoint.bin")
if same_hash "$ha1" "$ha3" && same_hash "$ha1" "$h32" && [[ -n $h8 && $h8 != "$ha1" ]] &&
   grep -q "deterministic in chunks of 32" "$T/dc_auto_3.log"; then ok deterministic_default_chunk_from_batch
else bad deterministic_default_chunk_from_batch "auto $ha1/$ha3, chunk 32 $h32, chunk 8 $h8" "$(head -2 "$T/dc_auto_3.log")"; fi
if "$BIN" train --model cnn --epochs 1 "${SMALL[@]}" --workers 2 --timeline "$T/tl.json" --check-replicas 5 >"$T/tl.log" 2>&1 &&
   /usr/bin/python3 -c "
import json, sys
ev = json.load(open('$T/tl.json'))['traceEvents']
names = {(e['tid'], e['name']) for e in ev if e.get('ph') == 'X'}
need = {(0, 'forward'), (0, 'backward'), (2, 'backward'), (1, 'all-reduce'), (3, 'all-reduce'), (0, 'optimizer')}
assert 'slowest rank' in json.load(open('$T/tl.json'))['metadata']['note']
# every bucket carries its size, and one step's buckets add up to cnn's gradient (421642 floats)
ar = [e for e in ev if e.get('name') == 'all-reduce' and e['tid'] == 1]
first = sorted(ar, key=lambda e: e['ts'])
nb = 1 + max(e['args']['bucket'] for e in ar)
assert sum(e['args']['bytes'] for e in first[:nb]) == 4 * 421642, 'bucket bytes'
sys.exit(0 if need <= names else 1)" && grep -q "hidden behind backward" "$T/tl.log" &&
   grep -q "^slowest rank (last epoch): [01]," "$T/tl.log"; then
  ok timeline_and_breakdown
else bad timeline_and_breakdown "$(tail -3 "$T/tl.log")"; fi

# --comm-progress caller: the workers reduce their own blocks of each bucket, no communication
# thread; the same bits as the default (thread), with one bucket per layer
for how in thread caller; do
  "$BIN" train --model cnn --epochs 1 "${SMALL[@]}" --workers 2 --max-steps 4 --bucket-cap-mb 0.01 \
    --first-bucket-mb 0.0001 --comm-progress $how --comm-spin-us 50 --out "$T/cp_$how" >/dev/null 2>&1
done
h1=$(hash_of "$T/cp_thread/checkpoint.bin"); h2=$(hash_of "$T/cp_caller/checkpoint.bin")
if same_hash "$h1" "$h2"; then ok comm_progress_caller_equal; else bad comm_progress_caller_equal "thread '$h1' vs caller '$h2'"; fi
expect_error comm_progress_bad "--comm-progress: expected auto, thread or caller, got 'cpu'" "$BIN" train --comm-progress cpu
# auto (the default): 2 workers on 2 CPUs reduce by themselves (the header says so), on 1 CPU on
# their communication threads; the same bits either way
CPUS=$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0))[:2])))')
taskset -c "$CPUS" "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 2 --max-steps 3 --out "$T/pa2" >"$T/pa2.log" 2>&1
taskset -c "${CPUS%%,*}" "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 2 --max-steps 3 --out "$T/pa1" >"$T/pa1.log" 2>&1
if [[ $CPUS == *,* ]] && grep -q "^reduction: by the workers between layers (--comm-progress caller, auto" "$T/pa2.log" &&
   ! grep -q "^reduction:" "$T/pa1.log" &&
   same_hash "$(hash_of "$T/pa2/checkpoint.bin")" "$(hash_of "$T/pa1/checkpoint.bin")"; then ok comm_progress_auto
else bad comm_progress_auto "$(head -3 "$T/pa2.log") / $(head -3 "$T/pa1.log")"; fi
expect_error comm_spin_us_bad "--comm-spin-us: '-1' is not an integer" "$BIN" train --comm-spin-us -1
# --prefetch auto (the default): the same 2 workers on 2 CPUs run without loader threads (the header
# says so), one worker on 2 CPUs keeps its loader thread, and the bits are those of --prefetch 2
taskset -c "$CPUS" "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 2 --max-steps 3 --prefetch 2 \
  --out "$T/pf2" >"$T/pf2.log" 2>&1
taskset -c "$CPUS" "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 1 --max-steps 3 >"$T/pf1.log" 2>&1
if [[ $CPUS == *,* ]] && grep -q "^loader: each worker assembles its own batches (--prefetch auto" "$T/pa2.log" &&
   ! grep -q "^loader:" "$T/pf2.log" && ! grep -q "^loader:" "$T/pf1.log" && grep -q "^done:" "$T/pf1.log" &&
   same_hash "$(hash_of "$T/pa2/checkpoint.bin")" "$(hash_of "$T/pf2/checkpoint.bin")"; then ok prefetch_auto
else bad prefetch_auto "$(head -3 "$T/pa2.log") / $(head -3 "$T/pf2.log") / $(head -2 "$T/pf1.log")"; fi
expect_error prefetch_bad "--prefetch: 'x' is not an integer in 0..64" "$BIN" train --prefetch x

# slow workers on purpose: bad specs are one-line errors; rank 1 at 8x is the last arriver in most
# steps (step records have last_rank and wait_s; the timeline has its "slow" and rank 0's "wait"
# phases); a deterministic run trains the same bits with and without the slowdown.
# (8x, not 3x: rank 1 sleeps 7x its own compute, about 7 ms of an mlp step here, more than the
# scheduler slice or two that a CPU-bound process beside the run takes from rank 0 now and then.
# At 3x, rank 1's lead was 2x its ~1 ms of compute, within such a slice: last in 17 of 20 steps with
# 2 busy loops beside it; at 8x 19-20 of 20.  The bound asked, 15 of 20, is unchanged)
expect_error simulate_slow_rank_range "rank 2 is out of range 0..1" \
  "$BIN" train --model mlp "${SMALL[@]}" --workers 2 --simulate-slow 2:2
expect_error simulate_slow_factor "factor 0.5 must be in 1..1000" "$BIN" train "${SMALL[@]}" --simulate-slow 0:0.5
expect_error simulate_jitter_p "p must be in \[0, 1\]" "$BIN" train "${SMALL[@]}" --simulate-jitter p=2,ms=5
expect_error simulate_jitter_ms "ms must be in 0" "$BIN" train "${SMALL[@]}" --simulate-jitter p=0.1,ms=-5
expect_error simulate_jitter_key "unknown key 'x'" "$BIN" train "${SMALL[@]}" --simulate-jitter x=1
if "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 2 --simulate-slow 1:8 --out "$T/slow" \
     --timeline "$T/slow/tl.json" >"$T/slow.log" 2>&1 &&
   /usr/bin/python3 -c "
import json, sys
recs = [json.loads(l) for l in open('$T/slow/metrics.jsonl')]
steps = [r for r in recs if r['kind'] == 'step']
assert len(steps) == 20 and all('wait_s' in r and 'slow_s' in r for r in steps)
assert sum(r['last_rank'] == 1 for r in steps) >= 15, [r['last_rank'] for r in steps]
ep = [r for r in recs if r['kind'] == 'epoch'][0]
assert ep['last_rank_steps'][1] >= 15 and sum(ep['last_rank_steps']) == 20
ev = json.load(open('$T/slow/tl.json'))['traceEvents']
names = {(e['tid'], e['name']) for e in ev if e.get('ph') == 'X'}
assert {(2, 'slow'), (0, 'wait'), (2, 'wait')} <= names and (0, 'slow') not in names, names
"; then ok simulate_slow_last_rank_and_timeline
else bad simulate_slow_last_rank_and_timeline "$(tail -3 "$T/slow.log")"; fi
"$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 2 --deterministic --max-steps 5 --out "$T/dslow0" >/dev/null 2>&1
"$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 2 --deterministic --max-steps 5 --out "$T/dslow1" \
  --simulate-slow 1:3 --simulate-jitter p=0.5,ms=2 >/dev/null 2>&1
h0=$(hash_of "$T/dslow0/checkpoint.bin"); h1=$(hash_of "$T/dslow1/checkpoint.bin")
if same_hash "$h0" "$h1"; then ok simulate_slow_deterministic_same_hash; else bad simulate_slow_deterministic_same_hash "'$h0' vs '$h1'"; fi

# --balance: the option (bare or =K), the shares on the epoch line and in metrics.jsonl (cnn:
# the 8x sleep of rank 1 outweighs any noise; mlp's steps are too short to measure reliably).
# 8x, not 3x: the plan follows measured speed, and a CPU-bound process beside the run that shares
# rank 0's core halves rank 0's measured speed, so at 3x rank 1 measured 2/3 of rank 0 and got
# exactly 20 of 50 (seen in CI; [30, 20] and 420 samples here with 2 busy loops).  At 8x it
# measures under 3/8 of rank 0 even when rank 0 runs at a third of its speed: about 14 at most,
# 4-10 seen under load.  The bounds asked (under 20 of 50, under 400 of 1000) are unchanged
expect_error balance_zero "--balance: '0' is not an integer in 1..1000000" "$BIN" train "${SMALL[@]}" --balance=0
if "$BIN" train --help 2>&1 | grep -- "--balance\[=K\]" >/dev/null &&
   "$BIN" train --model cnn --epochs 1 "${SMALL[@]}" --workers 2 --simulate-slow 1:8 --balance=2 --out "$T/bal" \
     >"$T/bal.log" 2>&1 && grep -Eq "^epoch 1/1 .* shares [0-9]+/[0-9]+$" "$T/bal.log" &&
   /usr/bin/python3 -c "
import json
ep = [r for r in map(json.loads, open('$T/bal/metrics.jsonl')) if r['kind'] == 'epoch'][0]
assert sum(ep['shares']) == 50 and ep['shares'][1] < 20, ep['shares']
assert sum(ep['rank_samples']) == 1000 and ep['rank_samples'][1] < 400, ep['rank_samples']
"; then ok balance_shares_in_metrics
else bad balance_shares_in_metrics "$(tail -3 "$T/bal.log")"; fi
# deterministic: the bits of one worker (det1, 2 epochs) with 3 workers re-planned every 2 steps
"$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 3 --deterministic --balance=2 --out "$T/dbal" \
  --simulate-slow 1:3 >/dev/null 2>&1
h5=$(hash_of "$T/dbal/checkpoint.bin")
if same_hash "$d1" "$h5"; then ok balance_deterministic_same_hash; else bad balance_deterministic_same_hash "'$d1' vs '$h5'"; fi

# --backup-workers: the range, the refusals, the dropped ranks in metrics.jsonl and on the epoch
# line (cnn, rank 1 four times slower: dropped in most steps; replicas checked every step)
expect_error backup_workers_negative "--backup-workers: '-1' is not an integer in 0..255" \
  "$BIN" train "${SMALL[@]}" --workers 2 --backup-workers -1
expect_error backup_workers_range "--backup-workers must be in 0..1" "$BIN" train "${SMALL[@]}" --workers 2 --backup-workers 2
expect_error backup_workers_deterministic "does not work with --deterministic" \
  "$BIN" train "${SMALL[@]}" --workers 2 --backup-workers 1 --deterministic
if "$BIN" train --help 2>&1 | grep -- "--backup-workers B" >/dev/null &&
   "$BIN" train --model cnn --epochs 1 "${SMALL[@]}" --workers 2 --simulate-slow 1:4 --backup-workers 1 \
     --check-replicas 1 --comm-timeout 60 --out "$T/bk" >"$T/bk.log" 2>&1 &&
   grep -Eq "^epoch 1/1 .* dropped [0-9]+/[0-9]+$" "$T/bk.log" &&
   /usr/bin/python3 -c "
import json
recs = list(map(json.loads, open('$T/bk/metrics.jsonl')))
steps = [r for r in recs if r['kind'] == 'step']
ep = [r for r in recs if r['kind'] == 'epoch'][0]
assert len(steps) == 20 and all(len(r['dropped']) == 1 for r in steps), [r['dropped'] for r in steps]
assert sum(ep['dropped_steps']) == 20 and ep['dropped_steps'][1] > 10, ep['dropped_steps']
"; then ok backup_workers_dropped_in_metrics
else bad backup_workers_dropped_in_metrics "$(tail -3 "$T/bk.log")"; fi

# --mode async / --staleness (the parameter server): the options' ranges and refusals, the
# staleness on the epoch line and in metrics.jsonl, the replay's hash twice, its resume
expect_error ps_mode_unknown "--mode: expected sync or async, got 'fast'" "$BIN" train "${SMALL[@]}" --mode fast
expect_error zero_unit_mb_zero "--zero-unit-mb: '0' is not a number in 1e-05..100000" "$BIN" train "${SMALL[@]}" \
  --zero 3 --zero-unit-mb 0
expect_error zero_unit_mb_word "--zero-unit-mb: 'big' is not a number" "$BIN" train "${SMALL[@]}" --zero-unit-mb big
if "$BIN" train --model mlp:784,1024,10 "${SMALL[@]}" --workers 2 --zero 3 --zero-unit-mb 1 --max-steps 2 >"$T/unit.log" 2>&1 &&
   grep -q '^zero unit: 1 MiB ranges; fc1 in 4 slices of 256 rows$' "$T/unit.log"; then ok zero_unit_layout_line
else bad zero_unit_layout_line "$(head -3 "$T/unit.log")"; fi
out=$("$BIN" plan --model mlp:784,8192,8192,8192,10 --workers 2 --zero-unit-mb 16 2>&1)
if grep -q "units in flight per worker, on top: zero2 33.55 MB  zero3 71.3 MB" <<<"$out"; then ok plan_zero_unit_mb_in_flight
else bad plan_zero_unit_mb_in_flight "$out"; fi
expect_error ps_servers_zero "--servers: '0' is not an integer in 1.." "$BIN" train "${SMALL[@]}" --mode async --servers 0
expect_error ps_servers_above_params "--servers must be in 1..669706 (the parameters of 'mlp'" \
  "$BIN" train "${SMALL[@]}" --mode async --servers 1000000
expect_error ps_staleness_negative "--staleness: '-1' is not an integer in 0..1000" \
  "$BIN" train "${SMALL[@]}" --staleness -1
expect_error ps_servers_without_async "--servers needs --mode async" "$BIN" train "${SMALL[@]}" --servers 2
expect_error ps_share_lr_without_async "--share-lr needs --mode async" "$BIN" train "${SMALL[@]}" --share-lr
expect_error ps_share_lr_ssp_refused "--share-lr does not work with --staleness" \
  "$BIN" train "${SMALL[@]}" --workers 2 --staleness 1 --share-lr
expect_error ps_compress_refused "--compress does not work with --mode async" "$BIN" train "${SMALL[@]}" --mode async --compress bf16
expect_error ps_backup_refused "--backup-workers does not work with --mode async" \
  "$BIN" train "${SMALL[@]}" --workers 2 --mode async --backup-workers 1
expect_error ps_balance_refused "--balance does not work with --mode async" \
  "$BIN" train "${SMALL[@]}" --workers 2 --mode async --balance
expect_error ps_accum_refused "--accum > 1 is not supported with --staleness" \
  "$BIN" train "${SMALL[@]}" --workers 2 --staleness 2 --accum 2
expect_error ps_batchnorm_refused "--mode async does not support models with BatchNorm" \
  "$BIN" train "${SMALL[@]}" --model resnet --workers 2 --mode async
expect_error ps_ssp_deterministic_refused "--staleness 1 with --deterministic is not built" \
  "$BIN" train "${SMALL[@]}" --workers 2 --staleness 1 --deterministic
if "$BIN" --help | grep -q "mpi (built in)"; then
  # one process over MPI (no mpirun): async, SSP and the replay across processes need a worker
  # and a server rank, and one worker per process.
  # Under ASan, LeakSanitizer reports Open MPI's own allocations at init (no frame of ours:
  # checked), so these runs keep ASan's other checks and turn only leak detection off
  NOLEAK=(env)
  [[ $BIN == *-asan* ]] && NOLEAK=(env ASAN_OPTIONS=detect_leaks=0)
  expect_error ps_mpi_one_worker_per_process "--mode async across processes needs one worker per process" \
    "${NOLEAK[@]}" "$BIN" train "${SMALL[@]}" --backend mpi --workers 2 --mode async
  expect_error ps_mpi_no_worker_left "--servers 1 leaves no worker" \
    "${NOLEAK[@]}" "$BIN" train "${SMALL[@]}" --backend mpi --workers 1 --mode async
  expect_error ps_mpi_ssp_no_worker_left "--servers 1 leaves no worker" \
    "${NOLEAK[@]}" "$BIN" train "${SMALL[@]}" --backend mpi --workers 1 --staleness 1
  expect_error ps_mpi_replay_no_worker_left "--servers 1 leaves no worker" \
    "${NOLEAK[@]}" "$BIN" train "${SMALL[@]}" --backend mpi --workers 1 --mode async --deterministic
  expect_error ps_mpi_ssp_one_worker_per_process "--mode async across processes needs one worker per process" \
    "${NOLEAK[@]}" "$BIN" train "${SMALL[@]}" --backend mpi --workers 2 --staleness 0
else skip ps_mpi_refused "MPI not built into $BIN"; fi
# (--lr 0.01: at SMALL's 0.05 with momentum 0.9 and staleness up to 5, async mlp sat at the edge of
# divergence, train loss 14 to 34000 in epoch 2, and under ASan once went non-finite; what is checked
# here is the staleness reporting, which does not depend on the rate)
if "$BIN" train --help 2>&1 | grep -q -- "--mode NAME" && "$BIN" train --help 2>&1 | grep -q -- "--staleness-lr" &&
   "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 3 --mode async --servers 2 --lr 0.01 --out "$T/ps" >"$T/ps.log" 2>&1 &&
   [[ $(grep -Ec "^epoch [12]/2 .* staleness mean [0-9.]+ p50 [0-9]+ p99 [0-9]+ max [0-9]+$" "$T/ps.log") -eq 2 ]] &&
   /usr/bin/python3 -c "
import json
recs = list(map(json.loads, open('$T/ps/metrics.jsonl')))
ep = [r for r in recs if r['kind'] == 'epoch']
assert len(ep) == 2 and all(e['mode'] == 'async' and e['servers'] == 2 for e in ep), ep
for e in ep:
    assert e['stale_pushes'] == 59 and sum(e['stale_hist']) + e['stale_overflow'] == 59, e   # batches of 17: 59 per epoch
    assert e['stale_p50'] <= e['stale_p99'] <= e['stale_max'] and sum(e['rank_samples']) == 1000, e
steps = [r for r in recs if r['kind'] == 'step']
assert steps and all('staleness' in r for r in steps)
# rank 0's records stand for every worker: their samples add up to the epochs' samples
assert sum(r['samples'] for r in steps) == 2000, sum(r['samples'] for r in steps)
"; then ok ps_async_staleness_reported
else bad ps_async_staleness_reported "$(tail -3 "$T/ps.log")"; fi
# a checkpoint of another mode resumes at this mode's position in the schedule, with a note: async
# counts pushes (40 per epoch of mlp at 2 workers, batches of 25), sync global batches (20)
"$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 2 --mode async --out "$T/xm" >/dev/null 2>&1
"$BIN" train --model mlp --epochs 3 "${SMALL[@]}" --workers 2 --mode sync --resume "$T/xm/checkpoint.bin" --out "$T/xm" >"$T/xm.log" 2>&1
"$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 2 --out "$T/xs" >/dev/null 2>&1
"$BIN" train --model mlp --epochs 3 "${SMALL[@]}" --workers 2 --mode async --resume "$T/xs/checkpoint.bin" --out "$T/xs" \
  >"$T/xs.log" 2>&1
if grep -q "^note: the checkpoint's step 80 .* is 40 in this run (synchronous, 2 workers)" "$T/xm.log" &&
   "$BIN" ckpt info "$T/xm/checkpoint.bin" | grep -q "^step: *60 (epoch 3, step 0 in epoch)" &&
   grep -q "^note: the checkpoint's step 40 .* is 80 in this run (--mode async, 2 workers)" "$T/xs.log" &&
   "$BIN" ckpt info "$T/xs/checkpoint.bin" | grep -q "^step: *120 (epoch 3, step 0 in epoch)" &&
   ! grep -q "^note:" "$T/ps.log"; then
  ok ps_resume_across_modes
else bad ps_resume_across_modes "$(grep note "$T/xm.log" "$T/xs.log")"; fi
# dptrain plot reads an async run (flat records) and draws its staleness histogram
if [[ -s $T/ps/metrics.jsonl ]] && "$BIN" plot --out "$T/psplot" "$T/ps" >"$T/psplot.log" 2>&1 &&
   grep -q "^wrote .*/staleness.svg" "$T/psplot.log" &&
   /usr/bin/python3 -c "import xml.dom.minidom, sys; xml.dom.minidom.parse(sys.argv[1])" "$T/psplot/staleness.svg"; then
  ok ps_async_run_plotted
else bad ps_async_run_plotted "$(tail -3 "$T/psplot.log")"; fi
for i in 1 2; do
  "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 3 --mode async --deterministic --out "$T/psd$i" >"$T/psd$i.log" 2>&1
done
"$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 3 --mode async --deterministic --out "$T/psr" >/dev/null 2>&1
"$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 3 --mode async --deterministic --out "$T/psr" \
  --resume "$T/psr/checkpoint.bin" >"$T/psr.log" 2>&1
p1=$(hash_of "$T/psd1/checkpoint.bin"); p2=$(hash_of "$T/psd2/checkpoint.bin"); pr=$(hash_of "$T/psr/checkpoint.bin")
if same_hash "$p1" "$p2" && grep -q "staleness mean 1.95 p50 2 p99 2 max 2$" "$T/psd1.log"; then ok ps_replay_same_hash
else bad ps_replay_same_hash "'$p1' vs '$p2'" "$(tail -2 "$T/psd1.log")"; fi
if same_hash "$p1" "$pr"; then ok ps_replay_resume_exact; else bad ps_replay_resume_exact "'$p1' vs '$pr'" "$(tail -2 "$T/psr.log")"; fi

# --- checkpoint comparison ----------------------------------------------------------
if "$BIN" ckpt diff "$T/det1/checkpoint.bin" "$T/det3/checkpoint.bin" >"$T/diff.log" 2>&1 &&
   grep -q "bit-identical" "$T/diff.log" && grep -q "within 1e-05" "$T/diff.log"; then
  ok ckpt_diff_equal
else bad ckpt_diff_equal "$(cat "$T/diff.log")"; fi
"$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --seed 2 --max-steps 3 --out "$T/seed2" >/dev/null 2>&1
"$BIN" ckpt diff "$T/a/checkpoint.bin" "$T/seed2/checkpoint.bin" >"$T/diff.log" 2>&1
rc=$?
if [[ $rc -eq 1 ]] && grep -q "differ by more than 1e-05" "$T/diff.log"; then ok ckpt_diff_different
else bad ckpt_diff_different "exit $rc" "$(cat "$T/diff.log")"; fi
# A NaN anywhere is a difference: a copy of a checkpoint with one NaN in the
# first parameter (and valid checksums) must not compare "within" the original,
# whichever side the NaN is on.  (A running max that NaN fails to update would
# keep it only when it is the last element.)
/usr/bin/python3 - "$T/a/checkpoint.bin" "$T/nan.bin" <<'PY'
import struct, sys, zlib
b = bytearray(open(sys.argv[1], "rb").read())
hs = struct.unpack_from("<I", b, 12)[0]              # header_size; the payload follows
struct.pack_into("<f", b, hs, float("nan"))          # parameter 0 of the payload
n = struct.unpack_from("<Q", b, hs - 16)[0]               # payload_size (sections may follow)
struct.pack_into("<I", b, hs - 8, zlib.crc32(bytes(b[hs:hs + n])))  # payload_crc
struct.pack_into("<I", b, hs - 4, 0)                 # header_crc is over the header with it 0
struct.pack_into("<I", b, hs - 4, zlib.crc32(bytes(b[:hs])))
open(sys.argv[2], "wb").write(b)
PY
for side in B A; do
  if [[ $side == B ]]; then files=("$T/a/checkpoint.bin" "$T/nan.bin"); else files=("$T/nan.bin" "$T/a/checkpoint.bin"); fi
  "$BIN" ckpt diff "${files[@]}" >"$T/diff.log" 2>&1
  rc=$?
  if [[ $rc -eq 1 ]] && grep -q "differ by more than" "$T/diff.log" && ! grep -q "^within" "$T/diff.log"; then
    ok "ckpt_diff_nan_in_$side"
  else bad "ckpt_diff_nan_in_$side" "exit $rc" "$(cat "$T/diff.log")"; fi
done
expect_error ckpt_diff_other_model "is model" "$BIN" ckpt diff "$T/a/checkpoint.bin" "$T/scnn/checkpoint.bin"
expect_error bad_backend "backend" "$BIN" train --backend carrier-pigeon "${SMALL[@]}"

# --- several processes over MPI (when built in; not under sanitizers, whose leak
# checker reports Open MPI's own allocations) -----------------------------------------
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader,tcp)
if command -v mpirun >/dev/null && "$BIN" --help | grep -q "mpi (built in)" && [[ $BIN != *-asan* && $BIN != *-tsan* ]]; then
  # deterministic: 2 processes give the bits of 1, 2 and 3 threads
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 1 --deterministic \
    --out "$T/mpidet" >"$T/mpi.log" 2>&1
  h=$(hash_of "$T/mpidet/checkpoint.bin")
  if same_hash "$h" "$d1" && grep -q "2 processes (mpi)" "$T/mpi.log"; then
    ok mpi_deterministic_equals_threads
  else bad mpi_deterministic_equals_threads "'$h' vs '$d1'" "$(tail -3 "$T/mpi.log")"; fi
  # a checkpoint of 2 processes resumed by 3: the same bits as an uninterrupted run
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 1 --deterministic \
    --out "$T/mpir" >/dev/null 2>&1
  timeout 120 "${MPIRUN[@]}" -np 3 "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 1 --deterministic \
    --out "$T/mpir" --resume "$T/mpir/checkpoint.bin" >"$T/mpir.log" 2>&1
  h=$(hash_of "$T/mpir/checkpoint.bin")
  if same_hash "$h" "$d1"; then ok mpi_resume_on_more_processes
  else bad mpi_resume_on_more_processes "'$h' vs '$d1'" "$(tail -3 "$T/mpir.log")"; fi
  # hybrid: 2 processes x 2 threads against 4 threads in one process
  "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 4 --out "$T/flat4" >/dev/null 2>&1
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 2 \
    --out "$T/hyb" >"$T/hyb.log" 2>&1
  if "$BIN" ckpt diff "$T/flat4/checkpoint.bin" "$T/hyb/checkpoint.bin" >"$T/hyb.diff" 2>&1; then ok mpi_hybrid_equals_flat
  else bad mpi_hybrid_equals_flat "$(cat "$T/hyb.diff")" "$(tail -3 "$T/hyb.log")"; fi
  # ZeRO across processes: the shard update and the parameters' all-gather span the job, and
  # the checkpoint's optimizer state is gathered from every process. Deterministic: 2 processes
  # with --zero 1 give the bits of one worker (d1), also when the first epoch's --zero 1
  # checkpoint is resumed by 3 processes with --zero 1 (each takes its shard); hybrid 2 x 2
  # threads --zero 1 against 4 plain threads
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 1 --deterministic \
    --zero 1 --out "$T/mpiz" >"$T/mpiz.log" 2>&1
  h=$(hash_of "$T/mpiz/checkpoint.bin")
  if same_hash "$h" "$d1"; then ok mpi_zero_deterministic_equals_threads
  else bad mpi_zero_deterministic_equals_threads "'$h' vs '$d1'" "$(tail -3 "$T/mpiz.log")"; fi
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 1 --deterministic \
    --zero 1 --out "$T/mpizr" >/dev/null 2>&1
  timeout 120 "${MPIRUN[@]}" -np 3 "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 1 --deterministic \
    --zero 1 --out "$T/mpizr" --resume "$T/mpizr/checkpoint.bin" >"$T/mpizr.log" 2>&1
  h=$(hash_of "$T/mpizr/checkpoint.bin")
  if same_hash "$h" "$d1"; then ok mpi_zero_resume_on_more_processes
  else bad mpi_zero_resume_on_more_processes "'$h' vs '$d1'" "$(tail -3 "$T/mpizr.log")"; fi
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 2 --zero 1 \
    --check-replicas 1 --out "$T/hybz" >"$T/hybz.log" 2>&1
  if "$BIN" ckpt diff "$T/flat4/checkpoint.bin" "$T/hybz/checkpoint.bin" >"$T/hybz.diff" 2>&1; then ok mpi_zero_hybrid_equals_flat
  else bad mpi_zero_hybrid_equals_flat "$(cat "$T/hybz.diff")" "$(tail -3 "$T/hybz.log")"; fi
  # stages 2 and 3 across processes: each bucket's reduce-scatter and all-gather span the job
  # (deterministic: one worker's bits; hybrid 2 x 2 threads, where the hierarchical reduce-scatter
  # must leave every rank its bucket-aligned block: 4 plain threads' model)
  for z in 2 3; do
    timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 1 --deterministic \
      --zero $z --out "$T/mpiz$z" >"$T/mpiz$z.log" 2>&1
    h=$(hash_of "$T/mpiz$z/checkpoint.bin")
    if same_hash "$h" "$d1"; then ok "mpi_zero${z}_deterministic_equals_threads"
    else bad "mpi_zero${z}_deterministic_equals_threads" "'$h' vs '$d1'" "$(tail -3 "$T/mpiz$z.log")"; fi
    timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 2 --zero $z \
      --check-replicas 1 --out "$T/hybz$z" >"$T/hybz$z.log" 2>&1
    if "$BIN" ckpt diff "$T/flat4/checkpoint.bin" "$T/hybz$z/checkpoint.bin" >"$T/hybz$z.diff" 2>&1; then
      ok "mpi_zero${z}_hybrid_equals_flat"
    else bad "mpi_zero${z}_hybrid_equals_flat" "$(cat "$T/hybz$z.diff")" "$(tail -3 "$T/hybz$z.log")"; fi
  done
  # --zero-unit-mb across processes: stage 3 gathers, computes and reduce-scatters mlp's layers
  # in slices of 0.1 MiB (fc1 in 16 slices of 32 rows) over the job; deterministic: the bits of one
  # thread worker with the same unit
  "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 1 --deterministic --zero-unit-mb 0.1 \
    --out "$T/unit1" >/dev/null 2>&1
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 1 --deterministic \
    --zero 3 --zero-unit-mb 0.1 --out "$T/mpiunit" >"$T/mpiunit.log" 2>&1
  h=$(hash_of "$T/mpiunit/checkpoint.bin") u1=$(hash_of "$T/unit1/checkpoint.bin")
  if same_hash "$h" "$u1"; then ok mpi_zero3_unit_equals_one_worker
  else bad mpi_zero3_unit_equals_one_worker "'$h' vs '$u1'" "$(tail -3 "$T/mpiunit.log")"; fi
  # --balance across processes: the throughput all-gather and the re-split span the job.
  # Deterministic: 2 processes, rank 1 three times slower, re-planned every 2 steps, give the
  # bits of one worker (det1); normal mode: the slow process's share shrinks (cnn, rank 1 eight
  # times slower: the sleep outweighs noise) and the epoch still covers every sample.  (8x, not 3x,
  # as in balance_shares_in_metrics: mpirun binds each of the 2 processes to a core, and a
  # CPU-bound process beside the job on rank 0's core halves rank 0's measured speed; at 3x rank 1
  # then got 18 of 50 with 2 busy loops beside it, at 8x 5-6.  The bounds asked are unchanged)
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 1 --deterministic \
    --balance=2 --simulate-slow 1:3 --out "$T/mpibal" >"$T/mpibal.log" 2>&1
  h=$(hash_of "$T/mpibal/checkpoint.bin")
  if same_hash "$h" "$d1" && grep -q "2 processes (mpi)" "$T/mpibal.log"; then ok mpi_balance_deterministic_same_hash
  else bad mpi_balance_deterministic_same_hash "'$h' vs '$d1'" "$(tail -3 "$T/mpibal.log")"; fi
  if timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model cnn --epochs 1 "${SMALL[@]}" --workers 1 \
       --simulate-slow 1:8 --balance=2 --out "$T/mpibal2" >"$T/mpibal2.log" 2>&1 &&
     /usr/bin/python3 -c "
import json
ep = [r for r in map(json.loads, open('$T/mpibal2/metrics.jsonl')) if r['kind'] == 'epoch'][0]
assert sum(ep['shares']) == 50 and ep['shares'][1] < 20, ep['shares']
assert sum(ep['rank_samples']) == 1000 and ep['rank_samples'][1] < 400, ep['rank_samples']
"; then ok mpi_balance_shares_follow_speed
  else bad mpi_balance_shares_follow_speed "$(tail -3 "$T/mpibal2.log")"; fi
  # --backup-workers across processes (through rank 0, point-to-point): b = 0 gives the bits of
  # the thread slot with 2 workers; b = 1 with rank 1 four times slower drops rank 1 in most
  # steps while every replica stays equal (checked every step); a rank that never arrives is
  # named by --comm-timeout and the job ends; --workers 2 per process is refused
  "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 2 --backup-workers 0 --out "$T/bk0t" >/dev/null 2>&1
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 1 --backup-workers 0 \
    --out "$T/bk0m" >"$T/bk0m.log" 2>&1
  h=$(hash_of "$T/bk0m/checkpoint.bin"); h0=$(hash_of "$T/bk0t/checkpoint.bin")
  if same_hash "$h" "$h0"; then ok mpi_backup_zero_equals_threads
  else bad mpi_backup_zero_equals_threads "'$h' vs '$h0'" "$(tail -3 "$T/bk0m.log")"; fi
  if timeout 120 "${MPIRUN[@]}" -np 3 "$BIN" train --model cnn --epochs 1 "${SMALL[@]}" --workers 1 --backup-workers 1 \
       --simulate-slow 1:4 --check-replicas 1 --comm-timeout 60 --out "$T/bkm" >"$T/bkm.log" 2>&1 &&
     /usr/bin/python3 -c "
import json
recs = [json.loads(l) for l in open('$T/bkm/metrics.jsonl')]
st = [r for r in recs if r['kind'] == 'step']
assert len(st) == 20 and all(len(r['dropped']) == 1 for r in st), [r['dropped'] for r in st]
assert sum(r['dropped'] == [1] for r in st) >= 14, [r['dropped'] for r in st]
ep = [r for r in recs if r['kind'] == 'epoch'][0]
assert ep['dropped_steps'][1] >= 14 and sum(ep['dropped_steps']) == 20, ep['dropped_steps']
assert st[-1]['loss'] < st[0]['loss'], (st[0]['loss'], st[-1]['loss'])
"; then ok mpi_backup_drops_slow_rank
  else bad mpi_backup_drops_slow_rank "$(tail -3 "$T/bkm.log")"; fi
  t0=$(date +%s)
  timeout 60 "${MPIRUN[@]}" -np 3 "$BIN" train --model cnn --epochs 1 "${SMALL[@]}" --workers 1 --backup-workers 0 \
    --simulate-slow 1:1000 --comm-timeout 3 >"$T/bkto.log" 2>&1
  rc=$?
  if [[ $rc -ne 0 && $rc -ne 124 ]] && (( $(date +%s) - t0 < 40 )) &&
     grep -q "timeout after 3.0 s in backup-workers step 0 on rank 0: rank(s) did not arrive: 1" "$T/bkto.log"; then
    ok mpi_backup_timeout_names_rank
  else bad mpi_backup_timeout_names_rank "exit $rc" "$(grep -v '^\[' "$T/bkto.log" | head -5)"; fi
  # a failed run leaves a failure record per process in its folder (for dptrain launch): the
  # ranks that timed out name the silent one
  timeout 60 "${MPIRUN[@]}" -np 3 "$BIN" train --model cnn --epochs 1 "${SMALL[@]}" --workers 1 \
    --simulate-slow 1:1000 --comm-timeout 3 --out "$T/frec" >"$T/frec.log" 2>&1
  rc=$?
  if [[ $rc -ne 0 && $rc -ne 124 ]] && /usr/bin/python3 -c "
import json
for p in (0, 2):
    r = json.loads(open('$T/frec/failure.p%d.json' % p).read())
    assert r['kind'] == 'failure' and r['process'] == p and r['lost_processes'] == [1], r
    assert r['steps_done'] == 0 and 'rank 1 did not respond' in r['error'] and r['host'], r
"; then ok mpi_failure_record_names_silent_rank
  else bad mpi_failure_record_names_silent_rank "exit $rc" "$(ls "$T/frec"; cat "$T/frec"/failure* 2>&1)"; fi
  # ZeRO checkpoints in the background across processes (src/train/snapshot.c): each process
  # writes its own shards in place and rank 0 finishes the file; the files of steps 10 (the
  # background one) and 12 are the --ckpt-sync run's, byte for byte, for stages 1-3 on 3
  # processes and stage 3 on 2 processes x 2 workers; no temporary file is left
  zok=1 zwhy=
  for zc in "1 3 1" "2 3 1" "3 3 1" "3 2 2"; do
    read -r zs znp zw <<<"$zc"
    for zsync in 0 1; do
      zd=$T/zsnap-$zs-$znp-$zsync
      zx=(); (( zsync )) && zx=(--ckpt-sync)
      timeout 120 "${MPIRUN[@]}" -np "$znp" "$BIN" train --model mlp --optim adamw --lr 0.001 --zero "$zs" \
        --workers "$zw" --data "$DATA" --train-limit 1000 --test-limit 500 --batch 50 --progress none --max-steps 12 --ckpt-every-steps 5 "${zx[@]}" --out "$zd" >"$zd.log" 2>&1 ||
        { zok=0 zwhy+="--zero $zs -np $znp sync=$zsync failed: $(grep error "$zd.log" | head -1); "; }
    done
    zb=$T/zsnap-$zs-$znp-0 zf=$T/zsnap-$zs-$znp-1
    if ! cmp -s "$zb/checkpoint.prev.bin" "$zf/checkpoint.prev.bin" || ! cmp -s "$zb/checkpoint.bin" "$zf/checkpoint.bin" ||
       [[ $(step_of "$zb/checkpoint.prev.bin") != 10 || $(ls "$zb" | tr '\n' ' ') != "checkpoint.bin checkpoint.prev.bin metrics.jsonl " ]] ||
       ! grep -q "^checkpoints in the background: 2," "$zb.log"; then
      zok=0 zwhy+="--zero $zs -np $znp x $zw: $(ls "$zb" | tr '\n' ' ') $(cmp "$zb/checkpoint.prev.bin" "$zf/checkpoint.prev.bin" 2>&1); "
    fi
  done
  if (( zok )); then ok mpi_zero_snapshot_shards_in_place
  else bad mpi_zero_snapshot_shards_in_place "$zwhy"; fi
  timeout 60 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 2 --backup-workers 1 \
    >"$T/bkh.log" 2>&1
  rc=$?
  if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "backup-workers across processes needs one worker per process" "$T/bkh.log"; then
    ok mpi_backup_hybrid_refused
  else bad mpi_backup_hybrid_refused "exit $rc" "$(head -3 "$T/bkh.log")"; fi
  # --mode async across processes (src/ddp/ps_mpi.c): the last S ranks serve, the others work.
  # (momentum 0.5: async with a stale push now and then is unstable at 0.9 on this tiny set)
  # 1 server + 2 workers: every batch pushed once (40 claims of 25 samples per epoch), the loss
  # falls, staleness in the epoch record, the server rank takes no samples; the checkpoint
  # (the shards gathered) evaluates to the run's last test accuracy
  if timeout 120 "${MPIRUN[@]}" -np 3 "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --momentum 0.5 --workers 1 --mode async \
       --out "$T/psm" >"$T/psm.log" 2>&1 &&
     [[ $(grep -Ec "^epoch [12]/2 .* staleness mean [0-9.]+ p50 [0-9]+ p99 [0-9]+ max [0-9]+$" "$T/psm.log") -eq 2 ]] &&
     /usr/bin/python3 -c "
import json
recs = [json.loads(l) for l in open('$T/psm/metrics.jsonl')]
ep = [r for r in recs if r['kind'] == 'epoch']
assert len(ep) == 2 and ep[1]['train_loss'] < ep[0]['train_loss'] and ep[1]['test_acc'] > 0.6, ep
for e in ep:
    assert e['mode'] == 'async' and e['servers'] == 1 and e['stale_pushes'] == 40, e
    assert sum(e['stale_hist']) == 40 and e['rank_samples'][2] == 0 and sum(e['rank_samples']) == 1000, e
assert ep[1]['step'] == 80, ep[1]['step']
st = [r for r in recs if r['kind'] == 'step']
assert st and all('staleness' in r for r in st)
" && "$BIN" eval --ckpt "$T/psm/checkpoint.bin" --data "$DATA" --test-limit 500 >"$T/psme.log" 2>&1 &&
     [[ -n "$(test_acc_of <(grep '^epoch' "$T/psm.log"))" &&
        "$(test_acc_of "$T/psme.log")" == "$(test_acc_of <(grep '^epoch' "$T/psm.log"))" ]]; then
    ok mpi_async_one_server_trains
  else bad mpi_async_one_server_trains "$(grep -v '^\[' "$T/psm.log" | tail -3)" "$(cat "$T/psme.log" 2>/dev/null)"; fi
  # 2 servers + 2 workers, resumed from the 3-process run's checkpoint (every rank reads it, each
  # server takes its shard) at a tiny lr: the run goes on from step 80 with the checkpoint's model
  # (its test accuracy within a point of the checkpoint's; a server with a wrong shard is far off)
  if timeout 120 "${MPIRUN[@]}" -np 4 "$BIN" train --model mlp --epochs 3 "${SMALL[@]}" --momentum 0.5 --workers 1 --mode async \
       --servers 2 --lr 1e-6 --resume "$T/psm/checkpoint.bin" --out "$T/psm2" >"$T/psm2.log" 2>&1 &&
     /usr/bin/python3 -c "
import json
recs = [json.loads(l) for l in open('$T/psm2/metrics.jsonl')]
ep = [r for r in recs if r['kind'] == 'epoch']
assert len(ep) == 1 and ep[0]['epoch'] == 3 and ep[0]['step'] == 120 and ep[0]['servers'] == 2, ep
assert ep[0]['stale_pushes'] == 40 and ep[0]['rank_samples'][2:] == [0, 0], ep[0]
assert abs(100 * ep[0]['test_acc'] - float('$(test_acc_of "$T/psme.log")')) <= 1.0, ep[0]['test_acc']
" && "$BIN" eval --ckpt "$T/psm2/checkpoint.bin" --data "$DATA" --test-limit 500 >"$T/psm2e.log" 2>&1 &&
     [[ "$(test_acc_of "$T/psm2e.log")" == "$(test_acc_of <(grep '^epoch' "$T/psm2.log"))" ]]; then
    ok mpi_async_two_servers_resume
  else bad mpi_async_two_servers_resume "$(grep -v '^\[' "$T/psm2.log" | tail -3)"; fi
  # --staleness across processes (1 server + 2 workers): s = 0 trains the all-reduce's model (2
  # processes, sync) to 1e-5, every push of staleness 0; s = 1 with rank 1 three times slower: rank 0
  # runs ahead, but by one clock at most (the server holds its reply), so staleness 1 occurs, never 2
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 1 \
    --out "$T/sspsync" >"$T/sspsync.log" 2>&1
  if timeout 120 "${MPIRUN[@]}" -np 3 "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 1 --staleness 0 \
       --out "$T/ssp0" >"$T/ssp0.log" 2>&1 &&
     "$BIN" ckpt diff "$T/sspsync/checkpoint.bin" "$T/ssp0/checkpoint.bin" --tol 1e-5 >"$T/ssp0d.log" 2>&1 &&
     /usr/bin/python3 -c "
import json
ep = [r for r in map(json.loads, open('$T/ssp0/metrics.jsonl')) if r['kind'] == 'epoch']
assert len(ep) == 2 and ep[1]['step'] == 40, ep
for e in ep:
    assert e['mode'] == 'ssp' and e['servers'] == 1 and e['stale_pushes'] == 40 and e['stale_max'] == 0, e
    assert e['rank_samples'] == [500, 500, 0], e['rank_samples']
"; then ok mpi_ssp0_equals_sync
  else bad mpi_ssp0_equals_sync "$(grep -v '^\[' "$T/ssp0.log" | tail -3)" "$(cat "$T/ssp0d.log" 2>/dev/null)"; fi
  if timeout 120 "${MPIRUN[@]}" -np 3 "$BIN" train --model cnn --epochs 1 "${SMALL[@]}" --workers 1 --staleness 1 \
       --staleness-lr --simulate-slow 1:3 --out "$T/ssp1" >"$T/ssp1.log" 2>&1 &&
     grep -Eq "^epoch 1/1 .* staleness mean [0-9.]+ p50 [0-9]+ p99 1 max 1$" "$T/ssp1.log" &&
     /usr/bin/python3 -c "
import json
recs = [json.loads(l) for l in open('$T/ssp1/metrics.jsonl')]
ep = [r for r in recs if r['kind'] == 'epoch'][0]
assert ep['mode'] == 'ssp' and ep['stale_pushes'] == 40 and ep['stale_max'] == 1 and ep['stale_mean'] > 0, ep
st = [r for r in recs if r['kind'] == 'step']
assert len(st) == 20 and max(r['staleness'] for r in st) <= 1, [r['staleness'] for r in st]
"; then ok mpi_ssp1_staleness_bounded
  else bad mpi_ssp1_staleness_bounded "$(grep -v '^\[' "$T/ssp1.log" | tail -3)"; fi
  # the replay across processes: push (c, r) applied at version c x 2 + r on each server, so the bits
  # of 2 worker threads (the same sums in the same order), run to run, with 1 or 2 servers, resumed
  "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --momentum 0.5 --workers 2 --mode async --deterministic \
    --out "$T/rpt" >"$T/rpt.log" 2>&1
  rp=() ok_rp=1
  for c in "1:3:rp1" "1:3:rp1b" "2:4:rp2"; do
    IFS=: read -r S np d <<<"$c"
    timeout 120 "${MPIRUN[@]}" -np "$np" "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --momentum 0.5 --workers 1 \
      --mode async --deterministic --servers "$S" --out "$T/$d" >"$T/$d.log" 2>&1 || ok_rp=0
    rp+=("$(hash_of "$T/$d/checkpoint.bin")")
  done
  ht=$(hash_of "$T/rpt/checkpoint.bin")
  if [[ $ok_rp == 1 ]] && same_hash "$ht" "${rp[0]}" && same_hash "$ht" "${rp[1]}" && same_hash "$ht" "${rp[2]}" &&
     grep -q "staleness mean 0.97 p50 1 p99 1 max 1$" "$T/rp1.log"; then ok mpi_replay_equals_threads
  else bad mpi_replay_equals_threads "threads '$ht' vs mpi ${rp[*]}" "$(grep -v '^\[' "$T/rp1.log" | tail -3)"; fi
  # --share-lr reaches the server ranks with the threads' meaning (ps.c applies both): the replay
  # with it gives the bits of 2 worker threads with it, and not the plain replay's
  "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --momentum 0.5 --workers 2 --mode async --deterministic \
    --share-lr --out "$T/rpst" >"$T/rpst.log" 2>&1
  timeout 120 "${MPIRUN[@]}" -np 3 "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --momentum 0.5 --workers 1 \
    --mode async --deterministic --share-lr --out "$T/rpsm" >"$T/rpsm.log" 2>&1
  hst=$(hash_of "$T/rpst/checkpoint.bin") hsm=$(hash_of "$T/rpsm/checkpoint.bin")
  if same_hash "$hst" "$hsm" && [[ $hst != "$ht" ]]; then ok mpi_replay_share_lr_equals_threads
  else bad mpi_replay_share_lr_equals_threads "threads '$hst' vs mpi '$hsm' (plain replay '$ht')" \
    "$(grep -v '^\[' "$T/rpsm.log" | tail -3)"; fi
  timeout 120 "${MPIRUN[@]}" -np 3 "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --momentum 0.5 --workers 1 \
    --mode async --deterministic --out "$T/rpr" >/dev/null 2>&1
  timeout 120 "${MPIRUN[@]}" -np 4 "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --momentum 0.5 --workers 1 \
    --mode async --deterministic --servers 2 --resume "$T/rpr/checkpoint.bin" --out "$T/rpr" >"$T/rpr.log" 2>&1
  h=$(hash_of "$T/rpr/checkpoint.bin")
  if same_hash "$h" "$ht"; then ok mpi_replay_resume_exact
  else bad mpi_replay_resume_exact "resumed '$h' vs '$ht'" "$(grep -v '^\[' "$T/rpr.log" | tail -3)"; fi
  # the batches are claimed from server 0 as the workers go: rank 1, eight times slower, takes fewer.
  # (8x, not 4x: 3 processes share 2 cores, with a CPU-bound process beside the job rank 0 may start
  # late or lose its core for a while; at 4x rank 1 took 250 to rank 0's 750 once in 11 runs with 2
  # busy loops beside it, a ratio of 3 against the 2 asked; at 8x 25 to 975 in 6 of 6.  The bound
  # asked, under half of rank 0's, is unchanged)
  if timeout 120 "${MPIRUN[@]}" -np 3 "$BIN" train --model cnn --epochs 1 "${SMALL[@]}" --workers 1 --mode async \
       --simulate-slow 1:8 --out "$T/psms" >"$T/psms.log" 2>&1 &&
     /usr/bin/python3 -c "
import json
ep = [r for r in map(json.loads, open('$T/psms/metrics.jsonl')) if r['kind'] == 'epoch'][0]
rs = ep['rank_samples']
assert sum(rs) == 1000 and rs[2] == 0 and rs[1] < rs[0] / 2, rs
"; then ok mpi_async_slow_worker_claims_fewer
  else bad mpi_async_slow_worker_claims_fewer "$(grep -v '^\[' "$T/psms.log" | tail -3)"; fi
  # refusals under mpirun (every process says it; the job ends at once)
  for c in "servers:--servers 3 leaves no worker:--model mlp --workers 1 --servers 3" \
           "workers:--mode async across processes needs one worker per process:--model mlp --workers 2" \
           "batchnorm:--mode async does not support models with BatchNorm:--model resnet --workers 1"; do
    IFS=: read -r name want args <<<"$c"
    # shellcheck disable=SC2086 # args is a list of options
    timeout 60 "${MPIRUN[@]}" -np 3 "$BIN" train --epochs 1 "${SMALL[@]}" --mode async $args >"$T/psr.log" 2>&1
    rc=$?
    if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "^dptrain: error: process [0-9]: $want" "$T/psr.log"; then
      ok "mpi_async_refused_$name"
    else bad "mpi_async_refused_$name" "exit $rc" "$(grep -v '^\[' "$T/psr.log" | head -3)"; fi
  done
  # a stalled worker is named by the server rank's timeout (the others wait 2x as long for the epoch to
  # close), a stalled server by the workers'.  3 s, as the start of a loaded run (the hierarchical
  # world's first all-reduce, after the data is loaded) may spread the ranks by over 2 s.  Worker case:
  # rank 0 is slowed too (2x), so that rank 1 surely claims a batch before rank 0 has taken them all
  # (on a loaded machine rank 0 may be named with it).  Server case: its sleep is 999x its handling of
  # a push (an apply and the reply), so a wider mlp (5.8M parameters: tens of ms) stalls it for longer
  for c in "worker 0:2,1:1000 cnn" "server 2:1000 mlp:784,2048,2048,10"; do
    read -r who slow model <<<"$c"
    t0=$(date +%s)
    timeout 60 "${MPIRUN[@]}" -np 3 "$BIN" train --model "$model" --epochs 1 "${SMALL[@]}" --workers 1 --mode async \
      --simulate-slow "$slow" --comm-timeout 3 >"$T/psto.log" 2>&1
    rc=$?
    if [[ $who == worker ]]; then want="timeout after 3.0 s on parameter-server rank 2: no push from rank(s) \(0, \)\?1,"
    else want="push to the parameter servers (ranks 2..2): comm: timeout after 3 s in \(send\|recv\) on rank [01]: \(no message from \)\?rank 2"; fi
    if [[ $rc -ne 0 && $rc -ne 124 ]] && (( $(date +%s) - t0 < 40 )) && grep -q "$want" "$T/psto.log"; then
      ok "mpi_async_timeout_names_$who"
    else bad "mpi_async_timeout_names_$who" "exit $rc" "$(grep -v '^\[' "$T/psto.log" | grep -m 3 error)"; fi
  done
  # a worker process that dies (SIGKILL) ends the job, and mpirun names its rank
  t0=$(date +%s)
  timeout 60 "${MPIRUN[@]}" -np 3 sh -c "if [ \$OMPI_COMM_WORLD_RANK = 1 ]; then (sleep 4; kill -9 \$\$) & fi; exec \"$BIN\" \
    train --model cnn --epochs 20 --data \"$DATA\" --train-limit 1000 --batch 50 --progress none --workers 1 --mode async \
    --simulate-slow 1:20" >"$T/pskill.log" 2>&1
  rc=$?
  if [[ $rc -ne 0 && $rc -ne 124 ]] && (( $(date +%s) - t0 < 40 )) && grep -q "rank 1 with PID" "$T/pskill.log" &&
     grep -q "signal 9" "$T/pskill.log"; then ok mpi_async_dead_worker_ends_job
  else bad mpi_async_dead_worker_ends_job "exit $rc" "$(grep -v '^\[' "$T/pskill.log" | head -8)"; fi
  # a process started with other options: one clear error naming the rank, the job ends
  t0=$(date +%s)
  timeout 60 "${MPIRUN[@]}" -np 2 sh -c "exec \"$BIN\" train --model mlp --epochs 1 --data \"$DATA\" --train-limit 1000 \
    --batch 50 --progress none --workers 1 --momentum 0.\$OMPI_COMM_WORLD_RANK" >"$T/dis.log" 2>&1
  rc=$?
  if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "rank 1 disagrees with rank 0 on the configuration" "$T/dis.log" &&
     (( $(date +%s) - t0 < 30 )); then
    ok mpi_disagreement_named
  else bad mpi_disagreement_named "exit $rc" "$(head -5 "$T/dis.log")"; fi
elif [[ $BIN == *-asan* || $BIN == *-tsan* ]]; then
  # by design, not for want of a dependency: the plain build's run covers them
  echo "note: MPI checks not run on a sanitizer build (the plain build's cli run has them)"
else
  skip mpi "no mpirun, or MPI not built into $BIN"
fi

# --- eval and export -------------------------------------------------------------
# eval of the final checkpoint reproduces the training run's last test accuracy
# (the same 500 test images), exactly as printed
"$BIN" eval --ckpt "$T/a/checkpoint.bin" --data "$DATA" --test-limit 500 >"$T/eval.log" 2>&1
eacc=$(test_acc_of "$T/eval.log")
if [[ -n "$eacc" && -n "$acc" && "$eacc" == "$acc" ]]; then ok eval
else bad eval "eval '$eacc' vs training run '$acc'" "$(cat "$T/eval.log")"; fi
# export, then import: the weights read back give the same accuracy, and a
# training run starts from them
"$BIN" ckpt export "$T/a/checkpoint.bin" --safetensors "$T/a.safetensors" >/dev/null 2>"$T/exp.log"
"$BIN" eval --safetensors "$T/a.safetensors" --model mlp --data "$DATA" --test-limit 500 >"$T/evals.log" 2>&1
iacc=$(test_acc_of "$T/evals.log")
if [[ -n "$iacc" && -n "$eacc" && "$iacc" == "$eacc" ]] &&
   "$BIN" train --model mlp --max-steps 1 "${SMALL[@]}" --init-from "$T/a.safetensors" >/dev/null 2>&1; then
  ok export_import
else bad export_import "after import '$iacc' vs before '$eacc'" "$(cat "$T/exp.log" "$T/evals.log")"; fi

# --- PyTorch reproduces the accuracy from the exported file alone ------------------
# tests/torch/eval_safetensors.py is the loader docs/checkpoint.md shows (checked
# to be the same lines): it rebuilds the model and the input preprocessing from
# the file's __metadata__.  Its accuracy on the first 500 test images must match
# dptrain eval's to one image (0.2 points: float rounding may flip a near tie).
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
  if awk '/^```python$/ {on = 1; next} /^```$/ {on = 0} on' "$SRC/docs/checkpoint.md" |
     cmp -s - "$SRC/tests/torch/eval_safetensors.py"; then ok torch_loader_documented
  else bad torch_loader_documented "docs/checkpoint.md's python block differs from tests/torch/eval_safetensors.py"; fi
  "$BIN" train --model resnet --epochs 2 "${SMALL[@]}" --out "$T/res" >/dev/null 2>&1
  for mc in "mlp $T/a/checkpoint.bin" "cnn $T/scnn/checkpoint.bin" "resnet $T/res/checkpoint.bin"; do
    read -r m ck <<<"$mc"
    "$BIN" ckpt export "$ck" --safetensors "$T/$m.safetensors" >/dev/null 2>"$T/pt.log"
    "$BIN" eval --ckpt "$ck" --data "$DATA" --test-limit 500 >"$T/ev_$m.log" 2>&1
    /usr/bin/python3 "$SRC/tests/torch/eval_safetensors.py" "$T/$m.safetensors" "$DATA" 500 >"$T/pt_$m.log" 2>>"$T/pt.log"
    a1=$(test_acc_of "$T/ev_$m.log"); a2=$(test_acc_of "$T/pt_$m.log")
    if [[ -n "$a1" && -n "$a2" ]] && grep -q "(500 samples)" "$T/pt_$m.log" &&
       awk -v a="$a1" -v b="$a2" 'BEGIN {d = a - b; exit !(d <= 0.2 && d >= -0.2 && a > 30)}'; then
      ok "torch_eval_safetensors_$m"
    else bad "torch_eval_safetensors_$m" "dptrain eval '$a1' vs PyTorch '$a2'" "$(tail -5 "$T/pt.log")"; fi
  done
else
  skip torch_eval_safetensors "/usr/bin/python3 cannot import torch and numpy: apt-get install python3-torch python3-numpy"
fi

# --- the C API example ------------------------------------------------------------
EX=$(dirname "$BIN")/examples/custom_model
if [[ -x $EX ]]; then
  # a model built through the C API, trained by the library on 2 workers; the CLI evaluates
  # its checkpoint with no model option (the checkpoint holds the architecture)
  rm -rf "$T/exrun"
  if "$EX" "$DATA" 200 2 "$T/exrun" >"$T/ex.log" 2>&1 && grep -q "test accuracy after 200 steps" "$T/ex.log" &&
     awk '/test accuracy/ {gsub("%","",$NF); exit !($NF > 70)}' "$T/ex.log" &&
     "$BIN" eval --ckpt "$T/exrun/checkpoint.bin" --data "$DATA" >"$T/ex.eval" 2>&1 &&
     [[ "$(sed -n 's/^test accuracy after 200 steps: //p' "$T/ex.log")" == "$(test_acc_of "$T/ex.eval")%" ]]; then
    ok example_custom_model
  else bad example_custom_model "$(tail -3 "$T/ex.log")" "$(tail -1 "$T/ex.eval" 2>/dev/null)"; fi
fi

# --- bad input: one clear line, non-zero exit, nothing overwritten -----------------
expect_error bad_batch "batch" "$BIN" train --batch 0
expect_error bad_lr "lr" "$BIN" train --lr -1
expect_error bad_workers "workers" "$BIN" train --workers 0
expect_error bad_algo "algorithm" "$BIN" train --algo fastest
# BatchNorm in deterministic mode: each fixed chunk normalised with its own statistics, the
# running statistics moved once per step from fixed-point sums: 1 and 3 workers, the same bits
for P in 1 3; do
  "$BIN" train --model resnet:8,8 --epochs 1 "${SMALL[@]}" --train-limit 400 --deterministic --workers $P \
    --out "$T/detbn$P" >"$T/detbn$P.log" 2>&1
done
b1=$(hash_of "$T/detbn1/checkpoint.bin") b3=$(hash_of "$T/detbn3/checkpoint.bin")
if same_hash "$b1" "$b3"; then ok det_batchnorm_workers_1_3
else bad det_batchnorm_workers_1_3 "1 worker '$b1', 3 workers '$b3'" "$(tail -2 "$T/detbn3.log")"; fi
expect_error bad_number "epochs" "$BIN" train --epochs abc
expect_error unknown_option "unknown option" "$BIN" train --frobnicate
expect_error unknown_model "unknown model" "$BIN" train --model transformer9 "${SMALL[@]}"
expect_error bad_mlp_widths "first width" "$BIN" train --model mlp:100,10 "${SMALL[@]}"
expect_error missing_value "needs a value" "$BIN" train --epochs
expect_error unknown_command "unknown command" "$BIN" frobnicate
expect_error missing_data "$T/nope" "$BIN" train --data "$T/nope"
mkdir -p "$T/trunc"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  zcat "$DATA/$f.gz" >"$T/trunc/$f"
done
truncate -s 5000000 "$T/trunc/train-images-idx3-ubyte"
expect_error truncated_data "truncated" "$BIN" train --data "$T/trunc"
printf '\x00\x00\x08\x01\x00\x00\x00\x05abcde' >"$T/trunc/train-images-idx3-ubyte"
expect_error wrong_dims "train-images" "$BIN" train --data "$T/trunc"
cp "$T/a/checkpoint.bin" "$T/keep.bin"; before=$(hash_of "$T/keep.bin")
expect_error ckpt_other_model "model 'mlp'" "$BIN" train --model cnn "${SMALL[@]}" --resume "$T/keep.bin" --out "$T/a_other"
expect_error ckpt_other_batch "batch" "$BIN" train --model mlp "${SMALL[@]}" --batch 64 --resume "$T/keep.bin" --out "$T/a_other"
cp "$T/keep.bin" "$T/corrupt.bin"
printf '\xff\xff\xff\xff' | dd of="$T/corrupt.bin" bs=1 seek=3000 conv=notrunc 2>/dev/null
expect_error ckpt_corrupt "checksum" "$BIN" ckpt info "$T/corrupt.bin"
expect_error ckpt_corrupt_resume "checksum" "$BIN" train --model mlp "${SMALL[@]}" --resume "$T/corrupt.bin"
head -c 1000 "$T/keep.bin" >"$T/short.bin"
expect_error ckpt_truncated "truncated" "$BIN" ckpt info "$T/short.bin"
echo "not a checkpoint at all, just some text padding padding padding padding padding padding" >"$T/text.bin"
head -c 2000 /dev/zero >>"$T/text.bin"
expect_error ckpt_not_a_checkpoint "magic" "$BIN" ckpt info "$T/text.bin"
expect_error ckpt_missing "cannot open" "$BIN" ckpt info "$T/none.bin"
h=$(hash_of "$T/a/checkpoint.bin")
if same_hash "$h" "$before"; then ok failed_resume_keeps_checkpoint; else bad failed_resume_keeps_checkpoint "'$h' vs '$before'"; fi

# The default worker count is the cores this process may run on (taskset, mpirun, a cpuset),
# not the machine's: one allowed core gives one worker.
if command -v taskset >/dev/null; then
  out=$(taskset -c 0 "$BIN" train --model mlp "${SMALL[@]}" --max-steps 2 --epochs 1 2>&1)
  if grep -q " 1 worker x " <<<"$out"; then ok default_workers_follow_affinity
  else bad default_workers_follow_affinity "$(head -3 <<<"$out")"; fi
else skip default_workers_follow_affinity "taskset not found (util-linux)"; fi

# ---- bench allreduce: its bound is a bound (issue 8, H3) ----
# Every row has a bound_busbw measured in the same run, and the all-reduce's
# busbw (its median) does not beat it; no "!" row, no warning.  Sizes in the
# caches and beyond them, where the old single DRAM-rate "bound" was beaten.
bench_out=$("$BIN" bench allreduce --workers 2 --min-bytes 256K --max-bytes 16M --iters 20 2>&1)
if awk '/WARNING|warning/ { bad = 1 }
        /bound_busbw$/ && !/^#/ { head = 1 }
        !/^#/ && $1 ~ /^[0-9]+$/ { rows++; if (NF != 9 || $9 + 0 <= 0 || $7 + 0 > $9 + 0) bad = 1 }
        END { exit !(head && rows == 4 && !bad) }' <<<"$bench_out"; then
  ok bench_allreduce_bound_holds
else
  bad bench_allreduce_bound_holds "$bench_out"
fi
# ---- end bench allreduce bound ----

# === trainer checks (issue 8: schedule length, ignored options, full disk, timeout during evaluation) ===
# the cosine schedule against the real run: 1000 samples / 50 = 20 steps per epoch
expect_error cosine_warmup_longer_than_run "warmup 100 must be shorter than the run, which has 40 optimizer steps" \
  "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --schedule cosine --warmup 100
# options the chosen mode would ignore are refused, naming the mode they need
expect_error warmup_without_cosine "warmup applies to --schedule cosine only" "$BIN" train --warmup 10
expect_error min_lr_without_cosine "min-lr applies to --schedule cosine only" "$BIN" train --schedule step --step-size 5 --min-lr 0.001
expect_error step_size_without_step "step-size applies to --schedule step only" "$BIN" train --schedule cosine --step-size 5
expect_error gamma_without_step "gamma applies to --schedule step only" "$BIN" train --gamma 0.5
expect_error momentum_with_adamw "momentum applies to --optim sgd only" "$BIN" train --optim adamw --momentum 0.9
expect_error nesterov_with_adamw "nesterov applies to --optim sgd only" "$BIN" train --nesterov --optim adamw
expect_error beta1_with_sgd "beta1 applies to --optim adamw only" "$BIN" train --beta1 0.8
expect_error det_chunk_without_deterministic "det-chunk applies to --deterministic" "$BIN" train --det-chunk 16
expect_error skip_nonfinite_with_deterministic "skip-nonfinite does not work with --deterministic" \
  "$BIN" train --model mlp "${SMALL[@]}" --deterministic --skip-nonfinite
# metrics.jsonl on a full disk: an error, not lost metrics
mkdir -p "$T/full" && ln -sf /dev/full "$T/full/metrics.jsonl"
expect_error metrics_full_disk "metrics: cannot write $T/full/metrics.jsonl: No space left on device" \
  "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --out "$T/full"
# the timeline's writes too (written to FILE.tmp, then renamed)
ln -sf /dev/full "$T/full/tl.json.tmp"
expect_error timeline_full_disk "timeline: cannot write $T/full/tl.json: No space left on device" \
  "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --workers 2 --timeline "$T/full/tl.json"
# --comm-timeout 1 with the whole test set (10,000 samples) evaluated at the end of a 2-step epoch:
# evaluation takes longer than the timeout, and no rank may time out waiting for another's
TMO=(train --model cnn --epochs 1 --data "$DATA" --train-limit 100 --batch 50 --comm-timeout 1 --progress none)
if timeout 120 "$BIN" "${TMO[@]}" --workers 2 >"$T/tmo.log" 2>&1 && grep -q "^epoch 1/1 .*test acc" "$T/tmo.log"; then
  ok comm_timeout_not_hit_by_evaluation
else bad comm_timeout_not_hit_by_evaluation "$(tail -3 "$T/tmo.log")"; fi
if command -v mpirun >/dev/null && "$BIN" --help | grep -q "mpi (built in)" && [[ $BIN != *-asan* && $BIN != *-tsan* ]]; then
  # --bind-to none: mpirun binds each of 2 processes to a core of its own, so a CPU-bound process
  # beside the job that lands on one of those cores slows that rank alone, 2-3x; the evaluation's
  # equal blocks per process (and the data loading before the first collective) then end over 1 s
  # apart, and the earlier rank times out (4 runs in 4 with 3 busy loops on CPU 1: "timeout after
  # 1 s in allreduce #11", or in broadcast #3 at the start).  Unbound, the kernel spreads the load
  # over both ranks (0 in 4 there, 0 in 20 under other loads).  What is asked is unchanged: the
  # whole test set evaluated at 1 s, and no rank times out
  if timeout 120 "${MPIRUN[@]}" --bind-to none -np 2 "$BIN" "${TMO[@]}" --workers 1 >"$T/tmompi.log" 2>&1 &&
     grep -q "^epoch 1/1 .*test acc" "$T/tmompi.log" && grep -q "2 processes (mpi)" "$T/tmompi.log"; then
    ok mpi_comm_timeout_not_hit_by_evaluation
  else bad mpi_comm_timeout_not_hit_by_evaluation "$(tail -3 "$T/tmompi.log")"; fi
fi
# === end of trainer checks ===

# === prepare-text (issue 10, F2: text data) ===
mkdir -p "$T/txt/sub" "$T/txt_empty"
printf 'hello ' >"$T/txt/a.txt"; printf 'world' >"$T/txt/b.txt"; printf 'not me' >"$T/txt/sub/c.txt"
if "$BIN" prepare-text "$T/txt" --out "$T/txt.bin" >"$T/pt.log" 2>&1 &&
   [[ $(cat "$T/pt.log") == "prepare-text: 2 files, 11 bytes, 11 tokens (vocab 256) -> $T/txt.bin" ]] &&
   [[ $(head -c 8 "$T/txt.bin") == DPTOKENS && $(stat -c %s "$T/txt.bin") -eq $((32 + 2 * 11)) ]] &&
   [[ $(tail -c 22 "$T/txt.bin" | od -An -tu2 -w64 | xargs) == "104 101 108 108 111 32 119 111 114 108 100" ]]; then
  ok prepare_text_folder
else bad prepare_text_folder "$(cat "$T/pt.log")"; fi
FORTUNES=/usr/share/games/fortunes
if [[ -d $FORTUNES ]]; then
  # the plain-text files of fortunes + fortunes-min (*.dat, *.u8 left out): 2,576,674 bytes (issue 10)
  want=$(find "$FORTUNES" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -exec cat {} + | wc -c)
  if "$BIN" prepare-text --out "$T/fortunes.bin" >"$T/ptf.log" 2>&1 &&
     grep -q "^prepare-text: 43 files, 2576674 bytes, 2576674 tokens (vocab 256) -> $T/fortunes.bin$" "$T/ptf.log" &&
     [[ $want -eq 2576674 && $(stat -c %s "$T/fortunes.bin") -eq $((32 + 2 * 2576674)) ]]; then
    ok prepare_text_default_corpus
  else bad prepare_text_default_corpus "find counts $want bytes" "$(cat "$T/ptf.log")"; fi
else skip prepare_text_default_corpus "$FORTUNES absent: Debian packages fortunes fortunes-min (scripts/install-deps.sh)"; fi
expect_error prepare_text_missing_file "text: $T/nope.txt: no such file or directory" \
  "$BIN" prepare-text "$T/txt/a.txt" "$T/nope.txt" --out "$T/x.bin"
expect_error prepare_text_empty_folder "empty input: no regular files in $T/txt_empty" \
  "$BIN" prepare-text "$T/txt_empty" --out "$T/x.bin"
: >"$T/txt_empty.txt"
expect_error prepare_text_empty_file "empty input: 1 file, 0 bytes" \
  "$BIN" prepare-text "$T/txt_empty.txt" --out "$T/x.bin"
expect_error prepare_text_out_missing_folder "cannot write $T/nodir/x.bin: folder $T/nodir does not exist" \
  "$BIN" prepare-text "$T/txt" --out "$T/nodir/x.bin"
expect_error prepare_text_needs_out "prepare-text needs --out FILE" "$BIN" prepare-text "$T/txt"
if [[ ! -e $T/x.bin ]]; then ok prepare_text_errors_write_nothing; else bad prepare_text_errors_write_nothing "$T/x.bin exists"; fi
# === end of prepare-text checks ===

# === gpt on text (issue 10, F3; data parallelism on threads, F5) ===
# A small corpus (this repository's docs), 2 workers, AdamW with warmup + cosine: the epoch
# line has the validation loss, its perplexity exp(loss) and tokens/s; metrics.jsonl has them;
# the export has the PyTorch module's names; eval reproduces the last validation loss.
mkdir -p "$T/gpt_txt"
cp "$(dirname "$0")"/../docs/*.md "$T/gpt_txt/"
GPT=gpt:layers=1,heads=2,dim=16,ctx=8
GPTRUN=(--model "$GPT" --data "$T/gpt.bin" --batch 8 --train-limit 32 --test-limit 64 --optim adamw --lr 3e-3
        --progress none)
if "$BIN" prepare-text "$T/gpt_txt" --out "$T/gpt.bin" >"$T/gp.log" 2>&1 &&
   "$BIN" train "${GPTRUN[@]}" --workers 2 --epochs 2 --schedule cosine --warmup 2 --out "$T/gpt_run" \
     >"$T/gt.log" 2>&1 &&
   [[ $(grep -cE '^epoch [12]/2  train loss [0-9.]+  val loss [0-9.]+  val ppl [0-9.]+  val bpb [0-9.]+  [0-9]+ tokens/s ' "$T/gt.log") -eq 2 ]] &&
   awk '/^epoch 2\/2/ {for (i = 3; i < NF; i++) { if ($(i-1) == "val" && $i == "loss") v = $(i+1); if ($(i-1) == "val" && $i == "ppl") p = $(i+1);
                                                  if ($(i-1) == "val" && $i == "bpb") b = $(i+1) }}
        END {d = exp(v) / p - 1; e = b * log(2) / v - 1  # byte-level tokens: bits per byte = loss / ln 2
             exit !(v > 0 && (d < 0 ? -d : d) < 0.01 && (e < 0 ? -e : e) < 0.001)}' "$T/gt.log" &&
   [[ $(grep -c '"val_loss": .*"val_ppl": .*"tokens_per_s": ' "$T/gpt_run/metrics.jsonl") -eq 2 ]] &&
   grep -q '^done: .*, val loss [0-9.]* (perplexity [0-9.]*), param hash' "$T/gt.log"; then
  ok gpt_train_two_workers_val_loss_perplexity
else bad gpt_train_two_workers_val_loss_perplexity "$(cat "$T/gp.log" "$T/gt.log")"; fi
# ZeRO-3 on gpt: the tied head reads tok.weight from the embedding's bucket, which the hook gathers
# for it.  A table of 4 MiB (vocab 8192 x 128), so that the released bucket's 2 MiB units really go
# (a small table keeps its values when given back): --zero 3 at P = 2 trains plain P = 2's model
GPTW=(--model gpt:layers=1,heads=2,dim=128,ctx=8,vocab=8192 "${GPTRUN[@]:2}" --workers 2 --epochs 1)
if "$BIN" train "${GPTW[@]}" --out "$T/gz0" >"$T/gz0.log" 2>&1 &&
   "$BIN" train "${GPTW[@]}" --zero 3 --check-replicas 2 --out "$T/gz3" >"$T/gz3.log" 2>&1 &&
   "$BIN" ckpt diff "$T/gz0/checkpoint.bin" "$T/gz3/checkpoint.bin" --tol 1e-6 >"$T/gz.diff" 2>&1; then
  ok gpt_zero3_equals_plain
else bad gpt_zero3_equals_plain "$(tail -2 "$T/gz3.log")" "$(cat "$T/gz.diff")"; fi
# ... and across processes: under mpirun -np 2 (one worker each: the gathers, the tied head's and
# the streamed checkpoint's pieces cross the processes) --zero 3 trains plain P = 2's model (1e-6;
# bit-identical here), and hybrid 2 x 2 the model of hybrid 2 x 2 --zero 0 (whose hierarchical sums
# come in another order than 4 threads': 2.2e-5 apart after 4 AdamW steps, so that is the reference)
if command -v mpirun >/dev/null && "$BIN" --help | grep -q "mpi (built in)" && [[ $BIN != *-asan* && $BIN != *-tsan* ]]; then
  if timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${GPTW[@]}" --workers 1 --zero 3 --out "$T/gz3m" >"$T/gz3m.log" 2>&1 &&
     "$BIN" ckpt diff "$T/gz0/checkpoint.bin" "$T/gz3m/checkpoint.bin" --tol 1e-6 >"$T/gzm.diff" 2>&1; then
    ok mpi_gpt_zero3_equals_plain
  else bad mpi_gpt_zero3_equals_plain "$(tail -2 "$T/gz3m.log")" "$(cat "$T/gzm.diff" 2>/dev/null)"; fi
  if timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${GPTW[@]}" --workers 2 --out "$T/gz0h" >"$T/gz0h.log" 2>&1 &&
     timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${GPTW[@]}" --workers 2 --zero 3 --out "$T/gz3h" >"$T/gz3h.log" 2>&1 &&
     "$BIN" ckpt diff "$T/gz0h/checkpoint.bin" "$T/gz3h/checkpoint.bin" --tol 1e-6 >"$T/gzh.diff" 2>&1; then
    ok mpi_gpt_zero3_hybrid_equals_plain_hybrid
  else bad mpi_gpt_zero3_hybrid_equals_plain_hybrid "$(tail -2 "$T/gz3h.log")" "$(cat "$T/gzh.diff" 2>/dev/null)"; fi
elif [[ $BIN == *-asan* || $BIN == *-tsan* ]]; then
  # by design, as the MPI block above: the plain build's run covers them
  echo "note: mpi_gpt_zero3_* not run on a sanitizer build (the plain build's cli run has them)"
else
  skip mpi_gpt_zero3_equals_plain "MPI not built into $BIN"
  skip mpi_gpt_zero3_hybrid_equals_plain_hybrid "MPI not built into $BIN"
fi
last_val=$(awk '/^epoch 2\/2/ {for (i = 3; i < NF; i++) if ($(i-1) == "val" && $i == "loss") print $(i+1)}' "$T/gt.log")
if "$BIN" eval --ckpt "$T/gpt_run/checkpoint.bin" --data "$T/gpt.bin" --test-limit 64 >"$T/ge.log" 2>&1 &&
   [[ -n $last_val ]] && grep -q "^model $GPT  val loss $last_val  val ppl " "$T/ge.log"; then
  ok gpt_eval_reproduces_val_loss
else bad gpt_eval_reproduces_val_loss "epoch line: $last_val" "$(cat "$T/ge.log")"; fi
if "$BIN" ckpt export "$T/gpt_run/checkpoint.bin" --safetensors "$T/gpt.safetensors" >"$T/gx.log" 2>&1 &&
   python3 - "$T/gpt.safetensors" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
want = {"tok.weight": [256, 16], "pos.weight": [8, 16], "ln_f.weight": [16], "ln_f.bias": [16]}
for n, shape in {"ln1.weight": [16], "ln1.bias": [16], "qkv.weight": [48, 16], "qkv.bias": [48],
                 "proj.weight": [16, 16], "proj.bias": [16], "ln2.weight": [16], "ln2.bias": [16],
                 "fc.weight": [64, 16], "fc.bias": [64], "fc_out.weight": [16, 64], "fc_out.bias": [16]}.items():
    want["blocks.0." + n] = shape
got = {k: v["shape"] for k, v in h.items() if k != "__metadata__"}
sys.exit(0 if got == want and h["__metadata__"]["dptrain_model"] == "gpt:layers=1,heads=2,dim=16,ctx=8" else 1)
PY
then ok gpt_export_pytorch_names
else bad gpt_export_pytorch_names "$(cat "$T/gx.log")"; fi
# PyTorch rebuilds the language model from the export alone (tests/torch/eval_safetensors.py: the
# embedding, the transformer blocks, the tied head) and gets dptrain eval's validation loss
if /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
  pl=$(/usr/bin/python3 "$SRC/tests/torch/eval_safetensors.py" "$T/gpt.safetensors" "$T/gpt.bin" 64 2>&1)
  dl=$(awk '{for (i = 2; i <= NF; i++) if ($(i-1) == "val" && $i == "loss") print $(i+1)}' "$T/ge.log")
  tl=$(sed -n 's/^val loss \([0-9.]*\)  token acc .*(64 windows)$/\1/p' <<<"$pl")
  if [[ -n $dl && -n $tl ]] && awk -v a="$dl" -v b="$tl" 'BEGIN {exit !(a - b <= 0.002 && b - a <= 0.002)}'; then
    ok "gpt_torch_same_val_loss (dptrain $dl, PyTorch $tl)"
  else bad gpt_torch_same_val_loss "dptrain eval '$dl', PyTorch: $pl"; fi
else skip gpt_torch_same_val_loss "/usr/bin/python3 cannot import torch and numpy: apt-get install python3-torch python3-numpy"; fi
# --deterministic: the same bits on 1 and 3 workers (chunks of 2 windows)
"$BIN" train "${GPTRUN[@]}" --workers 1 --deterministic --det-chunk 2 --out "$T/gpt_d1" >"$T/gd1.log" 2>&1
"$BIN" train "${GPTRUN[@]}" --workers 3 --deterministic --det-chunk 2 --out "$T/gpt_d3" >"$T/gd3.log" 2>&1
if same_hash "$(hash_of "$T/gpt_d1/checkpoint.bin")" "$(hash_of "$T/gpt_d3/checkpoint.bin")"; then
  ok gpt_deterministic_1_vs_3_workers
else bad gpt_deterministic_1_vs_3_workers "$(cat "$T/gd1.log" "$T/gd3.log")"; fi
expect_error gpt_needs_token_file "run 'dptrain prepare-text" "$BIN" train --model "$GPT" --progress none

# --data DIR for gpt: the folder is prepared on first use into the cache ($XDG_CACHE_HOME/dptrain,
# $T/cache here; the bytes prepare-text writes), not into DIR; reused next time (not rewritten: same
# mtime), rebuilt under a new name when a source is newer (the old file removed); eval too.
mkdir -p "$T/gpt_dir"
cp "$T"/gpt_txt/*.md "$T/gpt_dir/"
mtime() { stat -c %y "$1" 2>/dev/null; }
gtok() { ls "$XDG_CACHE_HOME"/dptrain/gpt_dir-*.tokens 2>/dev/null; }
gre="$XDG_CACHE_HOME/dptrain/gpt_dir-[0-9a-f]*-[0-9a-f]*\.tokens"
if "$BIN" train "${GPTRUN[@]}" --data "$T/gpt_dir" --workers 1 --max-steps 2 >"$T/gf1.log" 2>"$T/gf1.err" &&
   [[ $(grep -c "^dptrain: prepared $gre from [0-9]* files of $T/gpt_dir ([0-9]* tokens): no token file of $T/gpt_dir in the cache yet\$" "$T/gf1.err") -eq 1 ]] &&
   cmp -s "$(gtok)" "$T/gpt.bin" && ! ls "$T/gpt_dir" | grep -q tokens; then
  ok gpt_data_folder_prepared_on_first_use
else bad gpt_data_folder_prepared_on_first_use "$(cat "$T/gf1.err" "$T/gf1.log")"; fi
g1=$(gtok); m1=$(mtime "$g1")
if "$BIN" train "${GPTRUN[@]}" --data "$T/gpt_dir" --workers 1 --max-steps 2 >"$T/gf2.log" 2>"$T/gf2.err" &&
   grep -q "^dptrain: reusing $g1 ([0-9]* tokens, newer than its [0-9]* source files)\$" "$T/gf2.err" &&
   ! grep -q prepared "$T/gf2.err" && [[ -n $m1 && $(mtime "$g1") == "$m1" ]] &&
   "$BIN" eval --ckpt "$T/gpt_run/checkpoint.bin" --data "$T/gpt_dir" --test-limit 64 >"$T/gfe.log" 2>"$T/gfe.err" &&
   grep -q "^dptrain: reusing $g1" "$T/gfe.err" && cmp -s "$T/gfe.log" "$T/ge.log"; then
  ok gpt_data_folder_reused_by_train_and_eval
else bad gpt_data_folder_reused_by_train_and_eval "mtime $m1 -> $(mtime "$g1")" \
  "$(cat "$T/gf2.err" "$T/gf2.log" "$T/gfe.err" "$T/gfe.log")"; fi
sleep 0.01 # (a source touched in the same clock tick as the token file counts as newer anyway)
touch "$T/gpt_dir/text.md"
if "$BIN" eval --ckpt "$T/gpt_run/checkpoint.bin" --data "$T/gpt_dir" --test-limit 64 >"$T/gf3.log" 2>"$T/gf3.err" &&
   grep -q "^dptrain: prepared $gre .*: $T/gpt_dir/text.md is newer than the cached token file\$" "$T/gf3.err" &&
   [[ -n $g1 && $(gtok) != "$g1" && ! -e $g1 && $(gtok | wc -l) -eq 1 ]] && cmp -s "$(gtok)" "$T/gpt.bin" &&
   ! ls "$T/gpt_dir" | grep -q tokens; then
  ok gpt_data_folder_rebuilt_when_a_source_is_newer
else bad gpt_data_folder_rebuilt_when_a_source_is_newer "$(cat "$T/gf3.err" "$T/gf3.log")"; fi
mkdir -p "$T/gpt_nodata"
touch "$T/gpt_nodata/x.dat"
expect_error gpt_data_folder_without_text "no text files in $T/gpt_nodata" \
  "$BIN" train --model "$GPT" --data "$T/gpt_nodata" --progress none
expect_error gpt_eval_needs_text_data "evaluates on text: pass --data" \
  "$BIN" eval --ckpt "$T/gpt_run/checkpoint.bin"

# --- dptrain sample --------------------------------------------------------------------------
# The same seed gives the same text, which starts with the prompt; greedy (temperature 0) too.
SAMPLE=(--ckpt "$T/gpt_run/checkpoint.bin" --prompt "The model" --tokens 60)
"$BIN" sample "${SAMPLE[@]}" --seed 4 >"$T/s1.txt" 2>"$T/s1.err"
"$BIN" sample "${SAMPLE[@]}" --seed 4 >"$T/s2.txt" 2>&1
"$BIN" sample "${SAMPLE[@]}" --seed 5 --temperature 1.5 --top-k 40 >"$T/s3.txt" 2>&1
if [[ $(head -c 9 "$T/s1.txt") == "The model" && $(wc -c <"$T/s1.txt") -eq 69 ]] && cmp -s "$T/s1.txt" "$T/s2.txt" &&
   ! cmp -s "$T/s1.txt" "$T/s3.txt" && [[ ! -s "$T/s1.err" ]]; then
  ok sample_same_seed_same_text
else bad sample_same_seed_same_text "$(cat "$T/s1.err")" "$(od -c "$T/s1.txt" | head -5)" "$(od -c "$T/s2.txt" | head -5)"; fi
"$BIN" sample "${SAMPLE[@]}" --temperature 0 --seed 1 >"$T/g1.txt" 2>&1
"$BIN" sample "${SAMPLE[@]}" --temperature 0 --seed 2 >"$T/g2.txt" 2>&1
"$BIN" sample "${SAMPLE[@]}" --top-k 1 --temperature 3 --seed 3 >"$T/g3.txt" 2>&1
if [[ $(head -c 9 "$T/g1.txt") == "The model" && $(wc -c <"$T/g1.txt") -eq 69 ]] && cmp -s "$T/g1.txt" "$T/g2.txt" &&
   cmp -s "$T/g1.txt" "$T/g3.txt"; then
  ok sample_greedy_deterministic
else bad sample_greedy_deterministic "$(cat "$T/g1.txt")" "$(cat "$T/g2.txt")" "$(cat "$T/g3.txt")"; fi
# The model is used correctly: trained on "abcabc...", greedy sampling continues the pattern from
# any phase, also past ctx (8) tokens, where the window slides, and from a prompt longer than ctx.
mkdir -p "$T/abc"
python3 -c 'import sys; open(sys.argv[1], "w").write("abc" * 3000)' "$T/abc/abc.txt"
if "$BIN" train --model "$GPT" --data "$T/abc" --batch 16 --optim adamw --lr 3e-2 --epochs 5 --workers 1 \
     --progress none --out "$T/abc_run" >"$T/abc.log" 2>&1 &&
   [[ $("$BIN" sample --ckpt "$T/abc_run/checkpoint.bin" --prompt b --tokens 30 --temperature 0) == "bcabcabcabcabcabcabcabcabcabcab" ]] &&
   [[ $("$BIN" sample --ckpt "$T/abc_run/checkpoint.bin" --prompt ca --tokens 20 --top-k 1 --seed 9) == "cabcabcabcabcabcabcabc" ]] &&
   [[ $("$BIN" sample --ckpt "$T/abc_run/checkpoint.bin" --prompt abcabcabcab --tokens 10 --temperature 0) == "abcabcabcabcabcabcabc" ]]; then
  ok sample_continues_learned_pattern
else bad sample_continues_learned_pattern "$(tail -3 "$T/abc.log")" \
  "$("$BIN" sample --ckpt "$T/abc_run/checkpoint.bin" --prompt b --tokens 30 --temperature 0 2>&1)"; fi
# bad options: one line each.  A model whose vocabulary (128) is below a prompt byte: a token file
# of vocab 128 written here (the format of docs/text.md).
python3 - "$T/v128.bin" <<'PY'
import struct, sys, zlib
tok = b"".join(struct.pack("<H", b) for b in b"abc" * 400)
open(sys.argv[1], "wb").write(b"DPTOKENS" + struct.pack("<IIQII", 1, 128, len(tok) // 2, zlib.crc32(tok), 0) + tok)
PY
"$BIN" train --model "$GPT,vocab=128" --data "$T/v128.bin" --batch 8 --max-steps 1 --workers 1 --progress none \
  --out "$T/v128" >"$T/v128.log" 2>&1 || bad sample_vocab128_model "$(cat "$T/v128.log")"
C=(--ckpt "$T/gpt_run/checkpoint.bin")
expect_error sample_missing_ckpt "sample needs --ckpt FILE" "$BIN" sample --prompt hi
expect_error sample_missing_prompt "sample needs --prompt TEXT" "$BIN" sample "${C[@]}"
expect_error sample_empty_prompt "prompt is empty" "$BIN" sample "${C[@]}" --prompt ""
expect_error sample_negative_tokens "tokens: '-1' is not an integer" "$BIN" sample "${C[@]}" --prompt hi --tokens -1
expect_error sample_negative_temperature "temperature: '-0.5' is not a number >= 0" \
  "$BIN" sample "${C[@]}" --prompt hi --temperature -0.5
expect_error sample_negative_top_k "top-k: '-1' is not an integer" "$BIN" sample "${C[@]}" --prompt hi --top-k -1
expect_error sample_top_k_above_vocab "top-k 257 exceeds the model's vocabulary of 256" \
  "$BIN" sample "${C[@]}" --prompt hi --top-k 257
expect_error sample_top_k_above_vocab128 "top-k 129 exceeds the model's vocabulary of 128" \
  "$BIN" sample --ckpt "$T/v128/checkpoint.bin" --prompt hi --top-k 129
expect_error sample_prompt_byte_outside_vocab "byte 0xc3 at offset 2 is outside the model's vocabulary of 128" \
  "$BIN" sample --ckpt "$T/v128/checkpoint.bin" --prompt "caé"
expect_error sample_unknown_option "unknown option '--beam' for sample" "$BIN" sample "${C[@]}" --prompt hi --beam 4
expect_error sample_missing_file "$T/nope.bin" "$BIN" sample --ckpt "$T/nope.bin" --prompt hi
if [[ -s "$T/a/checkpoint.bin" ]]; then
  expect_error sample_not_gpt "holds model 'mlp', not a language model: sample needs a gpt checkpoint" \
    "$BIN" sample --ckpt "$T/a/checkpoint.bin" --prompt hi
else skip sample_not_gpt "no mlp checkpoint: the Fashion-MNIST run at the top did not run"; fi
if "$BIN" sample --help | grep -q -- "--temperature" && "$BIN" help sample | grep -q -- "--top-k" &&
   "$BIN" --help | grep -q "^  sample "; then ok sample_help
else bad sample_help "sample missing from the help"; fi
# === end of gpt checks ===

# === plan, simulate, plot checks (tools/dptrain/plan.c) ===
# simulate: the closed form of sync (step = compute + comm), the same output
# for the same seed, the trainer's spec syntax and its errors, a trace
sim=$("$BIN" simulate --workers 4 --steps 10 --compute-ms 100 --comm-ms 20 2>&1)
if grep -q "^throughput: 8.33333 steps/s  1066.67 samples/s" <<<"$sim"; then ok simulate_sync_closed_form
else bad simulate_sync_closed_form "$sim"; fi
s1=$("$BIN" simulate --mode async --workers 50 --steps 20 --compute-sd-ms 30 --simulate-jitter p=0.05,ms=200 --seed 5 2>&1)
s2=$("$BIN" simulate --mode async --workers 50 --steps 20 --compute-sd-ms 30 --simulate-jitter p=0.05,ms=200 --seed 5 2>&1)
s3=$("$BIN" simulate --mode async --workers 50 --steps 20 --compute-sd-ms 30 --simulate-jitter p=0.05,ms=200 --seed 6 2>&1)
if [[ -n $s1 && $s1 == "$s2" && $s1 != "$s3" ]] && grep -q "^staleness (pushes): mean" <<<"$s1"; then ok simulate_deterministic
else bad simulate_deterministic "$s1" "$s3"; fi
# backup 1 with worker 2 five times slower: the fast rate 1 / (0.1 + 0.02 s)
sim=$("$BIN" simulate --mode backup --backup 1 --workers 6 --steps 20 --compute-ms 100 --comm-ms 20 --simulate-slow 2:5 2>&1)
if grep -q "^throughput: 8.33333 steps/s" <<<"$sim"; then ok simulate_backup; else bad simulate_backup "$sim"; fi
expect_error simulate_slow_range "rank 9 is out of range 0..3" "$BIN" simulate --workers 4 --simulate-slow 9:2
expect_error simulate_bad_jitter "p and ms go together" "$BIN" simulate --simulate-jitter p=0.1
expect_error simulate_bad_mode "unknown mode 'fast'" "$BIN" simulate --mode fast
expect_error simulate_backup_too_many "needs at least 5 workers" "$BIN" simulate --mode backup --backup 4 --workers 4
# a trace: two step records of 0.1 + 0.2 s compute and 0.3 + 0.1 s; the epoch record is skipped
mkdir -p "$T/trace"
{ echo '{"kind": "step", "step": 1, "forward_s": 0.1, "backward_s": 0.2, "step_s": 0.4}'
  echo '{"kind": "epoch", "epoch": 1, "forward_s": 9, "backward_s": 9}'
  echo '{"kind": "step", "step": 2, "forward_s": 0.3, "backward_s": 0.1, "step_s": 0.5}'; } >"$T/trace/metrics.jsonl"
sim=$("$BIN" simulate --workers 1 --steps 1000 --trace "$T/trace" 2>&1)
# one worker: the mean step is the mean of 0.3 and 0.4 s (a bootstrap draw): 2.86 steps/s within 5%
rate=$(awk '/^throughput:/ {print $2}' <<<"$sim")
if awk -v r="${rate:-0}" 'BEGIN {exit !(r > 2.72 && r < 3.0)}'; then ok simulate_trace; else bad simulate_trace "$sim"; fi
echo '{"kind": "step", "forward_s": 0.1, ' >"$T/trace/metrics.jsonl"
expect_error simulate_trace_bad "metrics.jsonl:1: json: column" "$BIN" simulate --trace "$T/trace"
if "$BIN" simulate --help | grep -q -- "--bound" && "$BIN" help simulate | grep -q -- "--server-ms" &&
   "$BIN" --help | grep -q "^  simulate "; then ok simulate_help
else bad simulate_help "simulate missing from the help"; fi
# plan: the textbook ring (200M fp32 on 8 workers at 100 Gbit/s: 1.4 GB sent per
# worker, 24 buckets x 14 x 5 us latency + 112 ms), a model counted by the
# library's builder, the sweep's crossover, errors
pl=$("$BIN" plan --params 2e8 --workers 8 --batch 1600 --algo ring --link-gbps 100 --flops 1e14 --tokens 1024 2>&1)
if grep -q "sent per worker per step: 1.4 GB" <<<"$pl" && grep -q "^communication 113.68 ms" <<<"$pl" &&
   grep -q "zero1 1.8 GB  zero2 1.1 GB  zero3 400 MB" <<<"$pl"; then ok plan_textbook
else bad plan_textbook "$pl"; fi
# the units ZeRO 2 and 3 hold at once on top of their state: the largest two adjacent buckets
# (two 67M-float layers here), what src/ddp/zero.c holds (dp_zero_inflight_bytes)
pl=$("$BIN" plan --model mlp:784,8192,8192,8192,10 --workers 2 2>&1)
if grep -q "^units in flight per worker, on top: zero2 536.9 MB  zero3 1.078 GB" <<<"$pl" &&
   ! "$BIN" plan --model mlp:784,8192,8192,8192,10 --workers 1 2>&1 | grep -q "units in flight"; then
  ok plan_zero_units_in_flight
else bad plan_zero_units_in_flight "$pl"; fi
pl=$("$BIN" plan --model cnn --workers 2 --batch 64 --flops 5e10 --json 2>&1)
if python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["workers"] == 2 and d["mem_plain"] == 16 * d["grad_bytes"] / 4 and len(d["bucket_bytes"]) >= 1' "$pl" 2>/dev/null
then ok plan_model_json; else bad plan_model_json "$pl"; fi
pl=$("$BIN" plan --params 2e8 --batch 1600 --flops 1e14 --tokens 1024 --sweep 1024 2>&1)
if grep -q "^communication exceeds compute from 256 workers on" <<<"$pl"; then ok plan_sweep; else bad plan_sweep "$pl"; fi
# docs/plan.md's 20,000-worker case: the figures the text argues from
pl=$("$BIN" plan --params 2e8 --workers 20000 --batch 4000000 --tokens 1024 --flops 1e14 --link-gbps 100 2>&1)
pl2=$("$BIN" plan --params 2e8 --workers 20000 --batch 4000000 --sample-ms 160 --link-gbps 100 2>&1)
if grep -q "sent per worker per step: 2.4 GB  all workers per second: 19.44 TB/s" <<<"$pl" &&
   grep -q "^step 2468.42 ms" <<<"$pl" && grep -q "all workers per second: 1.499 TB/s" <<<"$pl2" &&
   grep -q "^step 32010.8 ms" <<<"$pl2"; then ok plan_textbook_20000
else bad plan_textbook_20000 "$pl $pl2"; fi
expect_error plan_no_model "give --params N or --model SPEC" "$BIN" plan --workers 4
expect_error plan_bad_algo "unknown algorithm 'mesh'" "$BIN" plan --params 1e6 --algo mesh
expect_error plan_hier_hosts "hier needs --per-host" "$BIN" plan --params 1e6 --workers 8 --algo hier
expect_error plan_bad_model "--model nope" "$BIN" plan --model nope
echo '{"beta_s": 8e-10, "alpha_s": 0.001' >"$T/prof.json"
expect_error plan_bad_profile "prof.json: json: column" "$BIN" plan --params 1e6 --profile "$T/prof.json"
# a profile's link: 10 Gbit/s (8e-10 s/B), 1 ms: 2 workers, one 4 MB bucket -> 2 ms + 3.2 ms
echo '{"beta_s": 8e-10, "alpha_s": 0.001}' >"$T/prof.json"
pl=$("$BIN" plan --params 1e6 --layers 1 --workers 2 --batch 2 --algo ring --profile "$T/prof.json" 2>&1)
if grep -q "^communication 5.2 ms" <<<"$pl"; then ok plan_profile; else bad plan_profile "$pl"; fi
# hier from two calibrated levels: --profile across hosts (10 us, 1 ns/B) and --intra-profile inside
# a host (its ring's 1 us, 0.01 ns/B; the across-hosts profile names no intra link).  8 workers, 4 per
# host, one 4 MB bucket: inside, 2 x 3 steps of (1 us + 1 MB x 0.01 ns) = 66 us; between the 2 hosts,
# a ring of 1 MB: 2 x 10 us + 1 MB x 1 ns = 1.02 ms; 1.086 ms in all
echo '{"kind": "profile", "level": "thread", "ring_alpha_s": 1e-6, "ring_beta_s": 1e-11, "alpha_s": 5, "beta_s": 5}' >"$T/intra.json"
echo '{"kind": "profile", "level": "process", "alpha_s": 1e-5, "beta_s": 1e-9}' >"$T/inter.json"
pl=$("$BIN" plan --params 1e6 --layers 1 --workers 8 --per-host 4 --algo hier --no-overlap --batch 8 --json \
  --profile "$T/inter.json" --intra-profile "$T/intra.json" 2>&1)
if python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert abs(d["comm_s"] - 1.086e-3) < 1e-12, d' "$pl" 2>/dev/null
then ok plan_hier_two_profiles; else bad plan_hier_two_profiles "$pl"; fi
echo '{"kind": "profile", "gamma_s": 1e-10}' >"$T/nolink.json"
expect_error plan_intra_profile_no_link "nolink.json: no ring_alpha_s, ring_beta_s (or alpha_s, beta_s) for the intra-host link" \
  "$BIN" plan --params 1e6 --intra-profile "$T/nolink.json"
if "$BIN" plan --help | grep -q -- "--per-host" && "$BIN" help plan | grep -q -- "--sweep" &&
   "$BIN" --help | grep -q "^  plan "; then ok plan_help
else bad plan_help "plan missing from the help"; fi
# cross-check: where both apply (sync, no overlap, constant times) the simulator's
# step is the plan's: feed plan's compute and comm to simulate
pj=$("$BIN" plan --params 2e8 --workers 8 --batch 1600 --tokens 1024 --flops 1e14 --no-overlap --json 2>&1)
args=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(1e3*(d["fwd_s"]+d["bwd_s"]), 1e3*d["comm_s"], 1/d["step_s"])' "$pj" 2>/dev/null)
read -r cms ams want <<<"$args"
sim=$("$BIN" simulate --workers 8 --steps 10 --compute-ms "${cms:-0}" --comm-ms "${ams:-0}" 2>&1)
got=$(awk '/^throughput:/ {print $2}' <<<"$sim")
if awk -v a="${got:-0}" -v b="${want:-1}" 'BEGIN {exit !(a > 0 && (a - b) / b < 1e-5 && (b - a) / b < 1e-5)}'; then ok plan_simulate_agree
else bad plan_simulate_agree "plan $want steps/s, simulate ${got:-none}" "$sim"; fi
# and with a spread of the workers' compute: plan's straggler wait e_8 x 0.1 x compute (e_8 =
# 1.4236) against the simulator's mean max of 8 normal draws over 20,000 steps (the Monte Carlo
# error of that mean is about 1e-4 of the step; without the wait the two differ by 12%)
pj=$("$BIN" plan --params 2e8 --workers 8 --batch 1600 --tokens 1024 --flops 1e14 --no-overlap --compute-cv 0.1 --json 2>&1)
args=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); c=d["fwd_s"]+d["bwd_s"]; assert abs(d["straggle_s"] - 0.14236 * c) < 1e-4 * c, d; print(1e3*c, 1e2*c, 1e3*d["comm_s"], 1/d["step_s"])' "$pj" 2>/dev/null)
read -r cms sdms ams want <<<"$args"
sim=$("$BIN" simulate --workers 8 --steps 20000 --compute-ms "${cms:-0}" --compute-sd-ms "${sdms:-0}" --comm-ms "${ams:-0}" 2>&1)
got=$(awk '/^throughput:/ {print $2}' <<<"$sim")
if awk -v a="${got:-0}" -v b="${want:-1}" 'BEGIN {exit !(a > 0 && (a - b) / b < 2e-3 && (b - a) / b < 2e-3)}'; then ok plan_simulate_agree_spread
else bad plan_simulate_agree_spread "plan $want steps/s, simulate ${got:-none}" "$pj" "$sim"; fi
# plot: a synthetic 2-rank run (step and epoch records as the trainer writes them),
# simulate, plan and sweep outputs -> every plot, each parsing as XML with
# units on both axes; a run alone skips the planning plots with a note
mkdir -p "$T/prun"
{ for s in 1 2 3 4; do
    echo "{\"kind\": \"step\", \"step\": $s, \"epoch\": 1, \"loss\": 2.$((5 - s)), \"samples\": 50, \"step_s\": 0.01, \"data_wait_s\": 0.001, \"forward_s\": 0.002, \"backward_s\": 0.004, \"comm_s\": 0.002, \"comm_exposed_s\": 0.001, \"optimizer_s\": 0.001, \"wait_s\": 0.0, \"slow_s\": 0.0, \"last_rank\": 1}"
    [[ $s == 2 || $s == 4 ]] && echo "{\"kind\": \"epoch\", \"epoch\": $((s / 2)), \"step\": $s, \"workers\": 2, \"test_acc\": 0.$((6 + s)), \"samples_per_s\": 5000.0, \"epoch_time_s\": 0.02, \"rank_arrival_s\": [0.001, 0.004]}"
  done; } >"$T/prun/metrics.jsonl"
"$BIN" simulate --mode ssp --bound 2 --workers 6 --steps 30 --compute-sd-ms 20 --per-worker --json >"$T/sim.json" 2>&1
"$BIN" plan --model mlp --workers 2 --batch 64 --json >"$T/plan.json" 2>&1
"$BIN" plan --model mlp --batch 64 --sweep 8 --json >"$T/sweep.jsonl" 2>&1
if "$BIN" plot --out "$T/svg" "$T/prun" "$T/sim.json" "$T/plan.json" "$T/sweep.jsonl" >"$T/plot.log" 2>&1 &&
   [[ $(ls "$T/svg"/*.svg 2>/dev/null | wc -l) -eq 10 ]] &&
   python3 - "$T/svg" <<'PY' 2>>"$T/plot.log"
import glob, sys, xml.dom.minidom as m
for f in sorted(glob.glob(sys.argv[1] + "/*.svg")):
    d = m.parse(f)
    labels = [t.firstChild.data for t in d.getElementsByTagName("text") if t.firstChild]
    units = [l for l in labels if "(" in l and l.endswith(")")]
    assert len(units) >= 2, (f, labels)
PY
then ok plot_all; else bad plot_all "$(cat "$T/plot.log")"; fi
# several runs overlaid (issue 14, G4): a second run of 4 ranks beside prun: each loss and accuracy
# plot has one line per run, named by its folder; the straggler profile a bar per rank of each run
# (2 + 4); the scaling plot the sweep's 4 predicted points and a measured point per run (at 2 and
# 4 workers); the breakdown its five stacked layers, of the first run
mkdir -p "$T/prun4"
{ for s in 1 2 3 4; do
    echo "{\"kind\": \"step\", \"step\": $s, \"epoch\": 1, \"loss\": 1.$((5 - s)), \"samples\": 50, \"step_s\": 0.02, \"data_wait_s\": 0.001, \"forward_s\": 0.002, \"backward_s\": 0.004, \"comm_s\": 0.002, \"comm_exposed_s\": 0.001, \"optimizer_s\": 0.001}"
    [[ $s == 2 || $s == 4 ]] && echo "{\"kind\": \"epoch\", \"epoch\": $((s / 2)), \"step\": $s, \"workers\": 4, \"test_acc\": 0.$((5 + s)), \"samples_per_s\": 9000.0, \"epoch_time_s\": 0.04, \"rank_arrival_s\": [0.001, 0.002, 0.003, 0.004]}"
  done; } >"$T/prun4/metrics.jsonl"
if "$BIN" plot --out "$T/svgo" "$T/prun" "$T/prun4" "$T/sweep.jsonl" >"$T/ploto.log" 2>&1 &&
   python3 - "$T/svgo" <<'PY' 2>>"$T/ploto.log"
import sys, xml.dom.minidom as m
def load(name):
    d = m.parse(sys.argv[1] + "/" + name)
    texts = [t.firstChild.data for t in d.getElementsByTagName("text") if t.firstChild]
    return d, texts
for f in ("loss_step.svg", "loss_time.svg", "accuracy_step.svg", "accuracy_time.svg"):
    d, texts = load(f)
    assert "prun" in texts and "prun4" in texts, (f, texts)
    assert len(d.getElementsByTagName("polyline")) == 2, f
d, texts = load("wait.svg")
bars = [r for r in d.getElementsByTagName("rect") if r.getAttribute("width") not in ("10", "") and r.getAttribute("fill") != "white" and r.getAttribute("fill") != "none"]
assert "prun" in texts and "prun4" in texts and len(bars) == 6, (texts, len(bars))
d, texts = load("scaling.svg")
assert "measured" in texts and len(d.getElementsByTagName("circle")) == 4 + 2, texts
d, texts = load("breakdown.svg")
assert len(d.getElementsByTagName("polygon")) == 5 and "Step breakdown: prun" in texts, texts
assert all(k in texts for k in ("data wait", "forward", "backward", "exposed comm", "optimizer")), texts
PY
then ok plot_runs_overlaid; else bad plot_runs_overlaid "$(cat "$T/ploto.log")"; fi
pl=$("$BIN" plot --out "$T/svg2" "$T/prun" 2>&1)
if grep -q "^skipped staleness.svg: no staleness" <<<"$pl" && grep -q "^skipped scaling.svg" <<<"$pl" &&
   grep -q "^wrote .*/wait.svg" <<<"$pl"; then ok plot_skips; else bad plot_skips "$pl"; fi
printf '{"kind": "step", "loss": [1, {}]}\n' >"$T/bad.jsonl"
expect_error plot_bad_input "bad.jsonl:1: json: column" "$BIN" plot --out "$T/svg3" "$T/bad.jsonl"
expect_error plot_no_out "give --out DIR" "$BIN" plot "$T/prun"
if "$BIN" plot --help | grep -q "staleness.svg" && "$BIN" --help | grep -q "^  plot "; then ok plot_help
else bad plot_help "plot missing from the help"; fi
# calibrate: a profile from the thread backend (small sizes, few iterations: the fitted
# values are noise on a loaded machine, so only their presence and sign are checked) and the
# synthetic run's step records (0.006 s fwd+bwd for 50 samples on 2 workers = 0.24 ms
# per sample: 32 per worker at batch 64 are 2.56 ms forward, 5.12 backward), that plan then reads
if "$BIN" calibrate --workers 2 --max-bytes 262144 --iters 3 --run "$T/prun" --out "$T/cal.json" >"$T/cal.log" 2>&1 &&
   python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); import math; k = [a + "_" + b for a in ("ring", "rhd") for b in ("alpha_s", "beta_s")] + ["gamma_s"]; assert all(math.isfinite(d[x]) and d[x] >= 0 for x in k) and len(d["ring_measured_s"]) == 4 and abs(d["sample_s"] - 0.00024) < 1e-9, d' "$T/cal.json" 2>>"$T/cal.log" &&
   "$BIN" plan --model mlp --workers 2 --batch 64 --profile "$T/cal.json" | grep -q " = forward 2.56 + backward 5.12 + exposed comm"
then ok calibrate_profile; else bad calibrate_profile "$(cat "$T/cal.log")"; fi
expect_error calibrate_run_missing "no-such-run" "$BIN" calibrate --run "$T/no-such-run" --max-bytes 16384
# calibrate --model: the step's calibrated terms (profile version 4), and plan reads them back:
# forward = fwd_sample_s x 8 samples per worker, optimizer = sgd_param_s x parameters, the
# steal's comm_cpu = steal_s / overlap_s (the plan's overlap at this point), and the straggler
# wait at the calibrated 2 workers = straggle_cv x (forward + backward + steal)
if "$BIN" calibrate --workers 2 --model mlp --batch 16 --max-bytes 65536 --iters 2 --compute-iters 2 \
     --out "$T/cal2.json" >"$T/cal2.log" 2>&1 &&
   python3 -c 'import json,sys,math; d=json.load(open(sys.argv[1])); pos=["fwd_sample_s","bwd_sample_s","fwd_sample_1_s","bwd_sample_1_s","sgd_param_s","adamw_param_s","data_sample_s"]; assert d["version"] == 4 and d["model"] == "mlp" and d["level"] == "thread" and all(math.isfinite(d[k]) and d[k] > 0 for k in pos + ["overlap_s", "compute_s"]) and d["zero_param_s"] >= 0 and 0 <= d["comm_cpu"] <= 1 and abs(d["comm_cpu"] - min(1, d["steal_s"] / d["overlap_s"])) < 1e-3 and d["straggle_cv"] >= 0 and d["compute_cv"] >= 0, d' "$T/cal2.json" 2>>"$T/cal2.log" &&
   "$BIN" plan --model mlp --workers 2 --batch 16 --optim sgd --profile "$T/cal2.json" --json >"$T/plan2.json" 2>>"$T/cal2.log" &&
   python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); p=json.load(open(sys.argv[2])); n=669706; assert abs(p["fwd_s"] - 8 * c["fwd_sample_s"]) <= 1e-6 * p["fwd_s"] and abs(p["bwd_s"] - 8 * c["bwd_sample_s"]) <= 1e-6 * p["bwd_s"] and abs(p["opt_s"] - n * c["sgd_param_s"]) <= 1e-6 * p["opt_s"] and abs(p["zero_s"] - n * c["zero_param_s"]) <= 1e-6 * p["zero_s"] + 1e-15 and p["step_s"] >= p["fwd_s"] + p["bwd_s"] + p["opt_s"] and abs(p["overlap_s"] - c["overlap_s"]) <= 1e-4 * c["overlap_s"] and abs(p["straggle_s"] - c["straggle_cv"] * (p["fwd_s"] + p["bwd_s"] + p["steal_s"])) <= 1e-4 * p["straggle_s"] + 1e-12, (c, p)' "$T/cal2.json" "$T/plan2.json" 2>>"$T/cal2.log"
then ok calibrate_model_profile; else bad calibrate_model_profile "$(cat "$T/cal2.log")"; fi
# calibrate --metrics without --run: calibrate's own steps make the trainer's per-step all-gather of
# every rank's wait after the update (dp_train_gather_waits), so the profile's gather wait is
# measured, not taken from a run: gather_s (its median time) > 0, gather_wait_s = what of it is
# beyond the plan's formula (P-1)(alpha + 8 beta) on the ring fit, and plan --metrics' gather term
# is then the measured all-gather; the cal2.json above (no --metrics) has no gather
if "$BIN" calibrate --workers 2 --model mlp --batch 16 --max-bytes 65536 --iters 2 --compute-iters 3 --metrics \
     --out "$T/calm.json" >"$T/calm.log" 2>&1 &&
   "$BIN" plan --model mlp --workers 2 --batch 16 --optim sgd --metrics --profile "$T/calm.json" --json >"$T/planm.json" 2>>"$T/calm.log" &&
   python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); p=json.load(open(sys.argv[2])); z=json.load(open(sys.argv[3])); f=c["ring_alpha_s"] + 8 * c["ring_beta_s"]; assert c["gathers"] == 1 and c["gather_s"] > 0 and abs(c["gather_wait_s"] - max(0, c["gather_s"] - f)) <= 1e-5 * c["gather_s"] + 1e-12 and abs(p["gather_s"] - max(c["gather_s"], f)) <= 1e-4 * p["gather_s"] and z["gathers"] == 0 and z["gather_s"] == 0 and z["gather_wait_s"] == 0, (c, p)' "$T/calm.json" "$T/planm.json" "$T/cal2.json" 2>>"$T/calm.log"
then ok calibrate_metrics_gather; else bad calibrate_metrics_gather "$(cat "$T/calm.log")"; fi
expect_error profile_other_model "cal2.json was calibrated for --model mlp" \
  "$BIN" plan --model cnn --workers 2 --profile "$T/cal2.json"
expect_error profile_params_not_model "calibrated for --model mlp" "$BIN" plan --params 1e6 --workers 2 --profile "$T/cal2.json"
printf '{"kind": "profile", "version": 5, "alpha_s": 1e-6, "beta_s": 1e-10}\n' >"$T/cal5.json"
expect_error profile_newer_version "profile version 5: this dptrain reads versions 1 to 4" \
  "$BIN" plan --model mlp --workers 2 --profile "$T/cal5.json"
# calibrate --model --run: the step terms from a run's records (rank 0's medians after the 5th
# step; mlp, 2 workers, global batch 16, no epoch record as in a --max-steps run): forward 10,
# backward 20 (the steal inside), exposed 20, optimizer 2 ms and a median step of 60 ms, whose
# 8 ms rest beyond the phases is the metrics all-gather's wait; plan at that point sums to the
# median step and gives each phase back (exposed: with the straggler wait); without --metrics
# the wait goes with the gather
mkdir -p "$T/crun"
python3 -c '
import json
for k in range(12):
    w = k < 5  # the warm-up: far off, left out
    j = [0, 1, -1, 2, 0, -2, 0][k - 5] if not w else 0
    print(json.dumps({"kind": "step", "step": k + 1, "samples": 16, "step_s": 0.5 if w else 0.060 + j * 1e-3,
                      "forward_s": 0.3 if w else 0.010 + j * 1e-4, "backward_s": 0.2 if w else 0.020 - j * 1e-4,
                      "comm_exposed_s": 0 if w else 0.020 + j * 2e-4, "optimizer_s": 0.1 if w else 0.002 + j * 1e-5}))
' >"$T/crun/metrics.jsonl"
if "$BIN" calibrate --workers 2 --model mlp --batch 16 --max-bytes 65536 --iters 2 --compute-iters 2 --run "$T/crun" \
     --out "$T/calr.json" >"$T/calr.log" 2>&1 &&
   python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); n=669706; assert d["version"] == 4 and d["run_steps"] == 7 and d["run_step_s"] == 0.06 and abs(d["fwd_sample_s"] - 0.010 / 8) < 1e-9 and abs(d["sgd_param_s"] * n / 0.002 - 1) < 1e-5 and abs(d["steal_s"] - d["comm_cpu"] * d["overlap_s"]) < 1e-6 and abs(d["compute_s"] - 0.03) < 1e-9 and d["straggle_cv"] > 0 and d["gather_wait_s"] > 0.0075, d' "$T/calr.json" 2>>"$T/calr.log" &&
   "$BIN" plan --model mlp --workers 2 --batch 16 --optim sgd --metrics --profile "$T/calr.json" --json >"$T/planr.json" 2>>"$T/calr.log" &&
   "$BIN" plan --model mlp --workers 2 --batch 16 --optim sgd --profile "$T/calr.json" --json >"$T/planr0.json" 2>>"$T/calr.log" &&
   python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); q=json.load(open(sys.argv[2])); c=json.load(open(sys.argv[3])); near=lambda a, b: abs(a - b) <= 2e-5 * b; assert near(p["step_s"], 0.06) and near(p["fwd_s"], 0.01) and near(p["bwd_s"] + p["steal_s"], 0.02) and near(p["exposed_s"] + p["straggle_s"], 0.02) and near(p["opt_s"], 0.002) and p["gather_s"] > c["gather_wait_s"] and near(q["step_s"], 0.06 - p["gather_s"]) and q["gather_s"] == 0, (p, q, c)' "$T/planr.json" "$T/planr0.json" "$T/calr.json" 2>>"$T/calr.log"
then ok calibrate_run_step_terms; else bad calibrate_run_step_terms "$(cat "$T/calr.log")"; fi
# a run whose whole wait after backward (1 us) is below the table's exposed communication there
# (the last bucket's all-reduce, 1.6 MB: tens of us on any machine, and under 1 ms, so that the
# bisection's floor of 1e-3 reaches 1 us; a wait of 50 us was above a fast table's 22 us): the
# table is scaled down (table_scale < 1) until the plan's exposed communication is the run's, and
# the plan still sums to the median step (40 ms)
sed 's/"comm_exposed_s": [0-9.e-]*/"comm_exposed_s": 1e-06/; s/"step_s": [0-9.e-]*/"step_s": 0.04/' "$T/crun/metrics.jsonl" >"$T/crunlow.jsonl"
if "$BIN" calibrate --workers 2 --model mlp --batch 16 --max-bytes 65536 --iters 2 --compute-iters 1 --run "$T/crunlow.jsonl" \
     --out "$T/call.json" >"$T/call.log" 2>&1 &&
   "$BIN" plan --model mlp --workers 2 --batch 16 --optim sgd --metrics --profile "$T/call.json" --json >"$T/planl.json" 2>>"$T/call.log" &&
   python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); p=json.load(open(sys.argv[2])); assert 0 < c["table_scale"] < 1 and abs(p["exposed_s"] + p["straggle_s"] - 1e-6) < 1e-8 and abs(p["step_s"] - 0.04) < 1e-6, (c, p)' "$T/call.json" "$T/planl.json" 2>>"$T/call.log"
then ok calibrate_run_scales_table; else bad calibrate_run_scales_table "$(cat "$T/call.log")"; fi
# --optim adamw: the run's optimizer time goes to adamw_param_s (sgd_param_s stays calibrate's own)
if "$BIN" calibrate --workers 2 --model mlp --batch 16 --max-bytes 16384 --iters 1 --compute-iters 1 --run "$T/crun" \
     --optim adamw --out "$T/calra.json" >"$T/calra.log" 2>&1 &&
   python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); n=669706; assert abs(d["adamw_param_s"] * n / 0.002 - 1) < 1e-5 and abs(d["sgd_param_s"] * n / 0.002 - 1) > 1e-3, d' "$T/calra.json" 2>>"$T/calra.log"
then ok calibrate_run_optim; else bad calibrate_run_optim "$(cat "$T/calra.log")"; fi
sed 's/"samples": 16/"samples": 32/' "$T/crun/metrics.jsonl" >"$T/crun32.jsonl"
expect_error calibrate_run_other_batch "a step of 32 samples, not the --batch 16 calibrated" \
  "$BIN" calibrate --workers 2 --model mlp --batch 16 --max-bytes 16384 --iters 1 --compute-iters 1 --run "$T/crun32.jsonl"
head -5 "$T/crun/metrics.jsonl" >"$T/crun5.jsonl"
expect_error calibrate_run_too_short "5 step records; the step terms need more than the first 5" \
  "$BIN" calibrate --workers 2 --model mlp --batch 16 --max-bytes 16384 --iters 1 --compute-iters 1 --run "$T/crun5.jsonl"
{ cat "$T/crun/metrics.jsonl"; echo '{"kind": "epoch", "epoch": 1, "workers": 4}'; } >"$T/crun4w.jsonl"
expect_error calibrate_run_other_workers "a run of 4 workers, not the --workers 2 calibrated" \
  "$BIN" calibrate --workers 2 --model mlp --batch 16 --max-bytes 16384 --iters 1 --compute-iters 1 --run "$T/crun4w.jsonl"
expect_error calibrate_bad_optim "--optim: expected sgd or adamw" "$BIN" calibrate --optim lamb
# a version 2 profile (no straggler terms: forward and backward were the slowest worker's)
# still loads, with no straggler wait
printf '{"kind": "profile", "version": 2, "workers": 2, "alpha_s": 1e-6, "beta_s": 1e-10, "model": "mlp", "fwd_sample_s": 8e-5, "bwd_sample_s": 1.6e-4, "comm_cpu": 0.5}\n' >"$T/cal2b.json"
if "$BIN" plan --model mlp --workers 2 --batch 64 --profile "$T/cal2b.json" --json |
   python3 -c 'import json,sys; p=json.load(sys.stdin); assert p["straggle_s"] == 0 and abs(p["fwd_s"] - 32 * 8e-5) < 1e-12 and p["steal_s"] > 0, p'
then ok profile_version2; else bad profile_version2 "$("$BIN" plan --model mlp --workers 2 --batch 64 --profile "$T/cal2b.json" --json 2>&1)"; fi
# the profile's measured times per size time the buckets at its worker count: one 1 MB bucket
# between 1000 B (1 ms) and 1e7 B (2 ms) takes 1 + 999000/9999000 ms; at 4 workers, or with a link
# given after the profile, the formula (4 x 1 us + 1.5 MB / 1 GB/s)
printf '{"kind": "profile", "version": 2, "workers": 2, "alpha_s": 1e-6, "beta_s": 1e-9, "sizes": [1000, 10000000], "ring_measured_s": [0.001, 0.002]}\n' >"$T/caltab.json"
tab() { "$BIN" plan --params 250000 --layers 1 --batch 64 --algo ring --no-overlap --json --profile "$T/caltab.json" "$@" |
  python3 -c 'import json,sys; print("%.6e" % json.load(sys.stdin)["comm_s"])'; }
if [[ $(tab --workers 2) == "$(python3 -c 'print("%.6e" % (1e-3 + 999000 / 9999000 * 1e-3))')" &&
      $(tab --workers 4) == 1.506000e-03 && $(tab --workers 2 --latency-us 1) == 1.002000e-03 ]]
then ok profile_measured_table; else bad profile_measured_table "$(tab --workers 2) $(tab --workers 4) $(tab --workers 2 --latency-us 1)"; fi
# a version 1 profile (no "version", as the first calibrate wrote) still loads: 0.24 ms per sample
printf '{"kind": "profile", "backend": "thread", "workers": 2, "gamma_s": 1e-10, "alpha_s": 1e-6, "beta_s": 1e-10, "sample_s": 0.00024}\n' >"$T/cal1.json"
if "$BIN" plan --model mlp --workers 2 --batch 64 --profile "$T/cal1.json" | grep -q "^step [0-9.]* ms = forward 2.56 + backward 5.12 + exposed comm [0-9.e-]* + optimizer 0 ms$"
then ok profile_version1; else bad profile_version1 "$("$BIN" plan --model mlp --workers 2 --batch 64 --profile "$T/cal1.json" 2>&1)"; fi
# === end of plan checks ===

# --- gradient compression (docs/ddp.md "Gradient compression") ---
expect_error compress_topk_zero "topk:FRACTION needs 0 < FRACTION <= 1 (got '0')" "$BIN" train --compress topk:0
expect_error compress_topk_two "topk:FRACTION needs 0 < FRACTION <= 1 (got '2')" "$BIN" train --compress topk:2
expect_error compress_powersgd_zero "powersgd:RANK needs an integer RANK in 1..1024 (got '0')" "$BIN" train --compress powersgd:0
expect_error compress_unknown "unknown scheme 'zip'" "$BIN" train --compress zip
expect_error compress_powersgd_start_alone "powersgd-start applies to --compress powersgd:RANK only" \
  "$BIN" train --compress topk:0.1 --powersgd-start 3
expect_error compress_no_ef_bf16 "--no-error-feedback applies to --compress topk, sign and powersgd only (bf16 keeps no residual)" \
  "$BIN" train --compress bf16 --no-error-feedback
expect_error compress_no_ef_alone "--no-error-feedback applies to --compress topk, sign and powersgd only (none keeps no residual)" \
  "$BIN" train --no-error-feedback
expect_error compress_with_deterministic "compress bf16 does not work with --deterministic" \
  "$BIN" train --model mlp "${SMALL[@]}" --workers 2 --compress bf16 --deterministic
if "$BIN" train --help | grep -q -- "--compress SPEC" && "$BIN" train --help | grep -q -- "--powersgd-start" &&
   "$BIN" train --help | grep -q -- "--no-error-feedback"; then
  ok compress_help
else bad compress_help "--compress missing from train --help"; fi
if [[ -r "$DATA/train-images-idx3-ubyte.gz" ]]; then
  # the traffic is in the metrics, the epoch line and the summary; EF state resumes
  "$BIN" train --model mlp "${SMALL[@]}" --workers 2 --compress topk:0.01 --out "$T/cz" >"$T/cz.out" 2>&1
  if grep -q '"kind": "step".*"bytes_sent": [1-9].*"compress_ratio"' "$T/cz/metrics.jsonl" &&
     grep -q '"kind": "epoch".*"compress": "topk".*"compress_ratio": [1-9]' "$T/cz/metrics.jsonl" &&
     grep -q "x less than fp32" "$T/cz.out" && grep -q "^gradient traffic (worker 0, --compress topk:0.01)" "$T/cz.out"; then
    ok compress_metrics
  else bad compress_metrics "$(tail -5 "$T/cz.out")"; fi
  "$BIN" train --model mlp "${SMALL[@]}" --workers 3 --compress topk:0.01 --resume "$T/cz/checkpoint.bin" --epochs 2 \
    >"$T/cz2.out" 2>&1
  if grep -q "^note: .*saved by 2 workers, this run has 3: the error-feedback residuals are reset" "$T/cz2.out"; then
    ok compress_resume_other_workers_note
  else bad compress_resume_other_workers_note "$(head -5 "$T/cz2.out")"; fi
  if "$BIN" ckpt info "$T/cz/checkpoint.bin" >/dev/null; then ok compress_ckpt_info
  else bad compress_ckpt_info "ckpt info cannot read a checkpoint with an error-feedback section"; fi
else
  skip compress_metrics "$DATA missing"; skip compress_resume_other_workers_note "$DATA missing"
  skip compress_ckpt_info "$DATA missing"
fi

# --- ZeRO (docs/ddp.md "ZeRO") ---
expect_error zero_reduce_stage2 "--zero-reduce applies to --zero 1 only" "$BIN" train --zero 2 --zero-reduce scatter
expect_error zero2_compress "--compress does not work with --zero 2" "$BIN" train --model mlp "${SMALL[@]}" --zero 2 --compress bf16
expect_error zero3_compress "--compress does not work with --zero 3" "$BIN" train --model mlp "${SMALL[@]}" --zero 3 --compress topk:0.1
expect_error zero_range "--zero: '4' is not an integer in 0..3" "$BIN" train --zero 4
expect_error zero_reduce_alone "--zero-reduce applies to --zero 1 only" "$BIN" train --zero-reduce scatter
expect_error zero_async "--zero does not work with --mode async" "$BIN" train --model mlp "${SMALL[@]}" --zero 1 --mode async
expect_error zero_gather_stage2 "--zero-gather applies to --zero 1 only" "$BIN" train --zero 2 --zero-gather ahead
expect_error zero_gather_value "--zero-gather: expected auto, step or ahead, got 'later'" "$BIN" train --zero 1 --zero-gather later
if "$BIN" train --help | grep -q -- "--zero N" && "$BIN" train --help | grep -q -- "--zero-reduce HOW" &&
   "$BIN" train --help | grep -q -- "--zero-gather WHEN" && "$BIN" train --help | grep -q -- "--pin-threads"; then ok zero_help
else bad zero_help "--zero, --zero-reduce, --zero-gather or --pin-threads missing from train --help"; fi
if [[ -r "$DATA/train-images-idx3-ubyte.gz" ]]; then
  ZS=(--data "$DATA" --train-limit 1000 --test-limit 500 --batch 50 --progress none --optim adamw --lr 0.001)
  # deterministic: --zero 1 at P = 2 is plain P = 1's bits; its checkpoint (whole-slab optimizer
  # state) reads with ckpt info and resumes at P = 3 --zero 0 to the same bits as a plain 2-epoch run
  "$BIN" train --model mlp "${ZS[@]}" --deterministic --epochs 2 --out "$T/z0" >/dev/null 2>&1
  "$BIN" train --model mlp "${ZS[@]}" --deterministic --workers 2 --zero 1 \
    --zero-reduce scatter --out "$T/z1" >/dev/null 2>&1
  "$BIN" train --model mlp "${ZS[@]}" --deterministic --workers 3 --epochs 2 \
    --resume "$T/z1/checkpoint.bin" --out "$T/z1r" >/dev/null 2>&1
  if same_hash "$(hash_of "$T/z0/checkpoint.bin")" "$(hash_of "$T/z1r/checkpoint.bin")" &&
     "$BIN" ckpt info "$T/z1/checkpoint.bin" | grep -q "optimizer"; then ok zero_checkpoint_resumes_plain
  else bad zero_checkpoint_resumes_plain "$("$BIN" ckpt info "$T/z1/checkpoint.bin" 2>&1 | head -3)"; fi
  # stages 2 and 3: deterministic P = 2 and 3 are plain P = 1's bits, with --check-replicas and a
  # --timeline on; the stage 3 checkpoint resumes plain at P = 1
  "$BIN" train --model mlp "${ZS[@]}" --deterministic --out "$T/z0d" >/dev/null 2>&1
  for z in 2 3; do
    "$BIN" train --model mlp "${ZS[@]}" --deterministic --workers 3 --zero $z --check-replicas 2 \
      --timeline "$T/z$z.json" --out "$T/z$z" >"$T/z$z.log" 2>&1
    if same_hash "$(hash_of "$T/z0d/checkpoint.bin")" "$(hash_of "$T/z$z/checkpoint.bin")" &&
       grep -q '"traceEvents"' "$T/z$z.json"; then ok "zero${z}_deterministic_check_replicas_timeline"
    else bad "zero${z}_deterministic_check_replicas_timeline" "$(tail -3 "$T/z$z.log")"; fi
  done
  # --zero 1 with the all-gather left in flight for the next forward, each bucket reduce-scattered
  # during backward, with --check-replicas and a --timeline: plain P = 1's bits (deterministic);
  # and plain P = 2 with --pin-threads, the same
  "$BIN" train --model mlp "${ZS[@]}" --deterministic --workers 2 --zero 1 --zero-gather ahead --zero-reduce scatter \
    --check-replicas 2 --timeline "$T/z1a.json" --out "$T/z1a" >"$T/z1a.log" 2>&1
  if same_hash "$(hash_of "$T/z0d/checkpoint.bin")" "$(hash_of "$T/z1a/checkpoint.bin")" &&
     grep -q '"traceEvents"' "$T/z1a.json"; then ok zero1_gather_ahead_deterministic
  else bad zero1_gather_ahead_deterministic "$(tail -3 "$T/z1a.log")"; fi
  "$BIN" train --model mlp "${ZS[@]}" --deterministic --workers 2 --pin-threads --out "$T/zpin" >"$T/zpin.log" 2>&1
  if same_hash "$(hash_of "$T/z0d/checkpoint.bin")" "$(hash_of "$T/zpin/checkpoint.bin")"; then ok pin_threads_same_bits
  else bad pin_threads_same_bits "$(tail -3 "$T/zpin.log")"; fi
  "$BIN" train --model mlp "${ZS[@]}" --deterministic --epochs 2 --resume "$T/z3/checkpoint.bin" \
    --out "$T/z3r" >"$T/z3r.log" 2>&1
  if same_hash "$(hash_of "$T/z0/checkpoint.bin")" "$(hash_of "$T/z3r/checkpoint.bin")"; then ok zero3_checkpoint_resumes_plain
  else bad zero3_checkpoint_resumes_plain "$(tail -3 "$T/z3r.log")"; fi
else
  skip zero_checkpoint_resumes_plain "$DATA missing"
  skip zero2_deterministic_check_replicas_timeline "$DATA missing"
  skip zero3_deterministic_check_replicas_timeline "$DATA missing"
  skip zero1_gather_ahead_deterministic "$DATA missing"; skip pin_threads_same_bits "$DATA missing"
  skip zero3_checkpoint_resumes_plain "$DATA missing"
fi

# more checks, one file per subject (they use this file's helpers, BIN, DATA, T and SMALL)
for f in "$(dirname "${BASH_SOURCE[0]}")"/cli.d/*.sh; do
  [[ -f $f ]] && source "$f"
done

ci_strict=0
[[ -n ${CI:-} && $CI != 0 && ${CI,,} != false ]] && ci_strict=1
if [[ $skipped -gt 0 && $ci_strict -eq 1 ]]; then echo "CI=$CI: $skipped skipped fail the run"; fi
echo "cli: $pass passed, $fail failed, $skipped skipped"
[[ $fail -eq 0 ]] && ! [[ $skipped -gt 0 && $ci_strict -eq 1 ]]
