# Run safety (sourced by tests/cli.sh: its helpers, BIN, DATA, T, SMALL, MPIRUN):
# a run folder is never overwritten by mistake, metrics.jsonl survives a kill,
# a signal stops a run cleanly at an agreed step, --resume remembers the run.

# 0 when every line of FILE is a whole record (ends with "}" and a newline, the file too)
whole_records() { [[ ! -s $1 || $(tail -c 1 "$1" | od -An -c | tr -d ' ') == '\n' ]] && ! grep -qv '^{.*}$' "$1"; }

# --- R1: a folder that holds another run is refused, and kept as it was -------------
LONG=(--data "$DATA" --train-limit 3000 --test-limit 500 --batch 50 --lr 0.05 --momentum 0.9 --progress none)
"$BIN" train --model cnn --epochs 1 "${SMALL[@]}" --out "$T/cnncopy" >/dev/null 2>&1
before_h=$(hash_of "$T/cnncopy/checkpoint.bin"); before_n=$(wc -l <"$T/cnncopy/metrics.jsonl")
expect_error out_refuses_another_run "output folder $T/cnncopy holds a run of model cnn at step 20.*--resume $T/cnncopy/checkpoint.bin.*--overwrite" \
  "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --out "$T/cnncopy"
if same_hash "$before_h" "$(hash_of "$T/cnncopy/checkpoint.bin")" && [[ $(wc -l <"$T/cnncopy/metrics.jsonl") -eq $before_n ]]; then
  ok out_refused_folder_unchanged
else bad out_refused_folder_unchanged "checkpoint or metrics.jsonl changed ($before_n lines before)"; fi
# a folder with metrics but no checkpoint (a run killed before its first) is a run too
mkdir -p "$T/metonly" && echo '{"kind": "step", "step": 1}' >"$T/metonly/metrics.jsonl"
expect_error out_refuses_metrics_only "holds a run's metrics.jsonl (1 records, no checkpoint).*--overwrite" \
  "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --out "$T/metonly"
if "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --out "$T/cnncopy" --overwrite >"$T/ow.log" 2>&1 &&
   "$BIN" ckpt info "$T/cnncopy/checkpoint.bin" | grep -q "^model: *mlp" &&
   [[ $(grep -c '"kind": "epoch"' "$T/cnncopy/metrics.jsonl") -eq 1 ]]; then ok out_overwrite
else bad out_overwrite "$(tail -3 "$T/ow.log")"; fi
# README's own command on a fresh checkout: --out runs/NAME without runs/
if "$BIN" train --model mlp --max-steps 2 "${SMALL[@]}" --out "$T/fresh/runs/resnet" >"$T/mk.log" 2>&1 &&
   [[ -s $T/fresh/runs/resnet/checkpoint.bin ]]; then ok out_makes_parent_folders
else bad out_makes_parent_folders "$(tail -2 "$T/mk.log")"; fi
# resuming into the same folder is its own run; resuming another folder's checkpoint into a
# folder that holds a run is not
expect_error out_refuses_resume_of_another "holds a run of model mlp.*--overwrite" \
  "$BIN" train --resume "$T/fresh/runs/resnet/checkpoint.bin" --epochs 2 --out "$T/cnncopy"

# --- R1: metrics.jsonl after a kill: whole records; a resume records each step once ----
# SIGKILL at some point of a run (no handler runs): the file holds whole records only
good=0
for delay in 0.3 0.6 0.9; do
  rm -rf "$T/kill9"
  "$BIN" train --model mlp --epochs 3 "${LONG[@]}" --deterministic --workers 2 --ckpt-every-steps 10 \
    --out "$T/kill9" >/dev/null 2>&1 &
  pid=$!
  wait_steps "$T/kill9/metrics.jsonl" 12; sleep "$delay"; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
  whole_records "$T/kill9/metrics.jsonl" && good=$((good + 1))
done
if [[ $good -eq 3 ]]; then ok metrics_whole_records_after_kill
else bad metrics_whole_records_after_kill "$good of 3 killed runs left whole records only" "$(tail -c 200 "$T/kill9/metrics.jsonl")"; fi
# the last kill's folder, with a record cut short appended (a kill inside a write): the
# resume cuts it and the records past the checkpoint, and the run ends with the bits of an
# uninterrupted one
"$BIN" train --model mlp --epochs 3 "${LONG[@]}" --deterministic --workers 2 --out "$T/straight3" >/dev/null 2>&1
printf '{"kind": "step", "step": 99999, "bytes' >>"$T/kill9/metrics.jsonl"
"$BIN" train --resume "$T/kill9/checkpoint.bin" --out "$T/kill9" >"$T/kill9r.log" 2>&1
s=$(steps_of "$T/kill9/metrics.jsonl")
if grep -q "^note: .*metrics.jsonl: a record cut short.*past the checkpoint removed" "$T/kill9r.log" &&
   [[ $(sort -n <<<"$s" | uniq | wc -l) -eq 180 && $(wc -l <<<"$s") -eq 180 && "$s" == "$(sort -n <<<"$s")" ]] &&
   whole_records "$T/kill9/metrics.jsonl" &&
   same_hash "$(hash_of "$T/straight3/checkpoint.bin")" "$(hash_of "$T/kill9/checkpoint.bin")"; then
  ok resume_after_kill_records_each_step_once
else bad resume_after_kill_records_each_step_once "$(wc -l <<<"$s") step records, $(sort -un <<<"$s" | wc -l) distinct" \
  "$(head -3 "$T/kill9r.log")"; fi

# --- R2: SIGINT / SIGTERM stop after the current step, with a checkpoint --------------
for sig in INT TERM; do
  rm -rf "$T/sig$sig"
  # (rank 1 sleeps 4x its compute in each step: the run outlasts the wait for its 20th step on
  # any machine, and the bits are the same: slowness is timing only)
  "$BIN" train --model mlp --epochs 3 "${LONG[@]}" --deterministic --workers 2 --simulate-slow 1:5 \
    --out "$T/sig$sig" >"$T/sig$sig.log" 2>&1 &
  pid=$!
  wait_steps "$T/sig$sig/metrics.jsonl" 20; kill -$sig $pid; wait $pid; rc=$?
  want=$([[ $sig == INT ]] && echo 130 || echo 143)
  n=$(sed -n "s/^stopped by SIG$sig after step \([0-9]*\): checkpoint .*checkpoint.bin.*/\1/p" "$T/sig$sig.log")
  if [[ $rc -eq $want && -n $n && $(step_of "$T/sig$sig/checkpoint.bin") == "$n" && $(steps_of "$T/sig$sig/metrics.jsonl" | tail -1) == "$n" ]] &&
     whole_records "$T/sig$sig/metrics.jsonl"; then ok "sig${sig,,}_stops_with_checkpoint"
  else bad "sig${sig,,}_stops_with_checkpoint" "exit $rc (want $want), stopped at '${n}'" "$(tail -3 "$T/sig$sig.log")"; fi
done
# resumed without any option: the uninterrupted run's bits
"$BIN" train --resume "$T/sigINT/checkpoint.bin" --out "$T/sigINT" >"$T/sigr.log" 2>&1
s=$(steps_of "$T/sigINT/metrics.jsonl")
if same_hash "$(hash_of "$T/straight3/checkpoint.bin")" "$(hash_of "$T/sigINT/checkpoint.bin")" &&
   [[ $(wc -l <<<"$s") -eq 180 && $(sort -un <<<"$s" | wc -l) -eq 180 ]]; then ok sigint_resume_same_bits
else bad sigint_resume_same_bits "$(tail -2 "$T/sigr.log")"; fi
# a second signal ends the process at once: no checkpoint, no "stopped" line.  Rank 0 sleeps
# 100x its compute in each step (--simulate-slow), so the stop the first signal asks for takes
# a step of sleep at least, under any load; the second is sent once the first is seen.
rm -rf "$T/sig2"
"$BIN" train --model mlp --epochs 3 "${LONG[@]}" --workers 1 --simulate-slow 0:100 --out "$T/sig2" >"$T/sig2.log" 2>&1 &
pid=$!
wait_steps "$T/sig2/metrics.jsonl" 2; kill -INT $pid
for k in $(seq 200); do grep -q "stopping after this step" "$T/sig2.log" && break; sleep 0.01; done
kill -INT $pid; wait $pid; rc=$?
if [[ $rc -eq 130 && ! -e $T/sig2/checkpoint.bin ]] && ! grep -q "^stopped" "$T/sig2.log"; then ok second_signal_aborts
else bad second_signal_aborts "exit $rc" "$(tail -2 "$T/sig2.log")"; fi
# no thread that computes may take SIGINT or SIGTERM: a handler run on a thread inside
# oneDNN's GEMM writes its frame over the heap (oneDNN#4845; 1 stop in ~30 aborted with
# "corrupted size vs. prev_size").  The main thread (worker 0) and every thread started
# after the one that waits for the signals (dp-signals: workers, reducers, OpenMP's) block
# both; only threads that libraries started before main may not.
sig_blocked() { (( (0x$(awk '/^SigBlk:/ {print $2}' "$1/status") & 0x4002) == 0x4002 )); }
rm -rf "$T/sigmask"
"$BIN" train --model mlp --epochs 3 "${LONG[@]}" --workers 2 --threads 2 --simulate-slow 1:5 --out "$T/sigmask" \
  >"$T/sigmask.log" 2>&1 &
pid=$!
wait_steps "$T/sigmask/metrics.jsonl" 3
st=0 later=0 unsafe=""
for task in /proc/$pid/task/*; do [[ $(cat "$task/comm" 2>/dev/null) == dp-signals ]] && st=${task##*/}; done
for task in /proc/$pid/task/*; do
  tid=${task##*/}
  if (( tid == pid )) || (( st > 0 && tid > st )); then
    (( tid > st )) && later=$((later + 1))
    sig_blocked "$task" 2>/dev/null || unsafe+=" $tid($(cat "$task/comm" 2>/dev/null))"
  fi
done
names=$(cat /proc/$pid/task/*/comm 2>/dev/null | sort | uniq -c | tr -s ' \n' ' ')
kill -INT $pid; wait $pid; rc=$?
# (threads after dp-signals: 2 reducers, 1 worker besides the main thread, OpenMP's)
if (( st > 0 && later >= 4 )) && [[ -z $unsafe && $rc -eq 130 && $names == *dp-worker* && $names == *dp-comm* ]]; then
  ok compute_threads_block_stop_signals
else bad compute_threads_block_stop_signals "dp-signals tid ${st}, $later threads after it, unblocked:${unsafe:- none}, exit $rc" "threads: $names"; fi

# --- R2: the parameter server stops at the end of the epoch (every push applied) ----------
# (every worker stalls 20 ms per push: an epoch outlasts the wait for the 20th record)
ASYNC=(--model mlp --epochs 3 "${LONG[@]}" --mode async --deterministic)
"$BIN" train "${ASYNC[@]}" --workers 2 --out "$T/astraight" >/dev/null 2>&1
rm -rf "$T/async"
"$BIN" train "${ASYNC[@]}" --workers 2 --simulate-jitter p=1,ms=20 --out "$T/async" >"$T/async.log" 2>&1 &
pid=$!
wait_steps "$T/async/metrics.jsonl" 20; kill -INT $pid; wait $pid; rc=$?
e=$("$BIN" ckpt info "$T/async/checkpoint.bin" 2>/dev/null | sed -n 's/^step: .*(epoch \([0-9]*\), step 0 in epoch)$/\1/p')
"$BIN" train --resume "$T/async/checkpoint.bin" --out "$T/async" >"$T/asyncr.log" 2>&1
if [[ $rc -eq 130 && -n $e && $e -lt 3 ]] && grep -q "stopping at the end of this epoch" "$T/async.log" &&
   grep -q "^stopped by SIGINT after step" "$T/async.log" &&
   same_hash "$(hash_of "$T/astraight/checkpoint.bin")" "$(hash_of "$T/async/checkpoint.bin")"; then
  ok async_signal_stops_at_epoch_end
else bad async_signal_stops_at_epoch_end "exit $rc, checkpoint after epoch '$e'" "$(tail -2 "$T/async.log" "$T/asyncr.log")"; fi

# --- R2: checkpoints and evaluations by steps; --max-steps mid-epoch evaluates ---------
"$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --max-steps 10 --ckpt-every-steps 4 --eval-every 5 \
  --out "$T/every" >"$T/every.log" 2>&1
if grep -q "^checkpoint .* (step 4)" "$T/every.log" && grep -q "^checkpoint .* (step 8)" "$T/every.log" &&
   [[ $(grep -c '"kind": "step".*"test_acc"' "$T/every/metrics.jsonl") -eq 2 ]] &&
   grep -q '"kind": "step", "step": 5,.*"test_loss"' "$T/every/metrics.jsonl"; then ok ckpt_and_eval_every_steps
else bad ckpt_and_eval_every_steps "$(grep -c test_acc "$T/every/metrics.jsonl") evaluations" "$(tail -3 "$T/every.log")"; fi
if grep -q '"kind": "eval", "step": 10,' "$T/every/metrics.jsonl" && grep -q "^done: .*test acc [0-9.]*%" "$T/every.log"; then
  ok max_steps_mid_epoch_evaluates
else bad max_steps_mid_epoch_evaluates "$(grep '^done' "$T/every.log")"; fi

# --- R3: a resume remembers the run's configuration, and names what is overridden -------
CFG=(--data "$DATA" --train-limit 1000 --test-limit 500 --batch 50 --progress none --model mlp --lr 0.03
  --momentum 0.8 --nesterov --weight-decay 0.001 --schedule cosine --warmup 3 --min-lr 0.001 --clip 2 --seed 7
  --deterministic --workers 2)
"$BIN" train "${CFG[@]}" --epochs 2 --out "$T/cfgs" >/dev/null 2>&1
"$BIN" train "${CFG[@]}" --epochs 2 --max-steps 13 --out "$T/cfgr" >/dev/null 2>&1
"$BIN" train --resume "$T/cfgr/checkpoint.bin" --out "$T/cfgr" --workers 1 >"$T/cfgr.log" 2>&1
if same_hash "$(hash_of "$T/cfgs/checkpoint.bin")" "$(hash_of "$T/cfgr/checkpoint.bin")" &&
   grep -q "^resume: (none)" "$T/cfgr.log"; then ok resume_restores_configuration
else bad resume_restores_configuration "$(head -4 "$T/cfgr.log")"; fi
"$BIN" train --resume "$T/cfgs/checkpoint.bin" --out "$T/cfgs" --epochs 3 --lr 0.01 >"$T/cfgo.log" 2>&1
if grep -q "^resume: --epochs 3 overrides the checkpoint's 2$" "$T/cfgo.log" &&
   grep -q "^resume: --lr 0.01 overrides the checkpoint's 0.03" "$T/cfgo.log" &&
   [[ $(grep -c "^resume: --" "$T/cfgo.log") -eq 2 ]]; then ok resume_names_each_override
else bad resume_names_each_override "$(head -5 "$T/cfgo.log")"; fi
expect_error resume_optimizer_mismatch_names_flag "momentum state (--momentum 0.9), this run's has none (--momentum 0)" \
  "$BIN" train --resume "$T/every/checkpoint.bin" --out "$T/every" --momentum 0
cp "$T/every/checkpoint.bin" "$T/cfgbad.bin"
printf '\xff\xff\xff\xff' | dd of="$T/cfgbad.bin" bs=1 seek=3000 conv=notrunc 2>/dev/null
expect_error resume_checksum_before_settings "checksum mismatch" \
  "$BIN" train --resume "$T/cfgbad.bin" --momentum 0 --out "$T/cfgbad"
# eval of an exported file takes the model from its metadata
"$BIN" ckpt export "$T/cfgs/checkpoint.bin" --safetensors "$T/cfgs.st" >/dev/null 2>&1
a1=$("$BIN" eval --safetensors "$T/cfgs.st" --data "$DATA" --test-limit 200 2>&1 | sed -n 's/.*test acc \([0-9.]*\)%.*/\1/p')
a2=$("$BIN" eval --safetensors "$T/cfgs.st" --model mlp --data "$DATA" --test-limit 200 2>&1 | sed -n 's/.*test acc \([0-9.]*\)%.*/\1/p')
if [[ -n $a1 && $a1 == "$a2" ]]; then ok eval_safetensors_model_from_metadata
else bad eval_safetensors_model_from_metadata "without --model '$a1', with '$a2'"; fi

# --- R4: input a user gets wrong ---------------------------------------------------------
expect_error batch_smaller_than_workers "global batch 3 is smaller than the 4 workers" \
  "$BIN" train --model mlp --data "$DATA" --train-limit 100 --batch 3 --workers 4
expect_error epochs_zero "--epochs: '0' is not an integer in 1\.\." "$BIN" train --epochs 0

# --- R2 under mpirun: every rank stops at the same step; stop -> resume -> plot ---------
# The stop is agreed with one 1-double all-reduce per step, so a signal to any one rank (as
# scancel or a site's tooling may send) stops them all.  Ctrl-C on mpirun (Open MPI 4): mpirun
# sends SIGCONT, waits odls_base_sigkill_timeout (default 1 s), sends SIGTERM to the ranks,
# waits as long again and sends SIGKILL; the ranks must finish their step and checkpoint in
# that grace, so the check raises it to 3 s as docs/cluster.md advises (a loaded machine).
# Every rank stalls 40 ms per step (--simulate-jitter): the 180 steps outlast the wait for the
# 20th plus mpirun's first 3 s on any machine, and a step stays short under load (a stall in
# proportion to compute, --simulate-slow, grows with the load).  A resume leaves simulations
# out: they are timing only, the bits are the same.
if command -v mpirun >/dev/null && "$BIN" --help | grep -q "mpi (built in)" && [[ $BIN != *-asan* && $BIN != *-tsan* ]]; then
  MPISTOP=(--model mlp --epochs 3 "${LONG[@]}" --workers 1 --deterministic --simulate-jitter p=1,ms=40)
  ranks_of() { pgrep -P "$(pgrep -P "$1" -x mpirun)" -x dptrain; } # the ranks of the mpirun under timeout PID
  rm -rf "$T/mpione"
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${MPISTOP[@]}" --out "$T/mpione" >"$T/mpione.log" 2>&1 &
  pid=$!
  wait_steps "$T/mpione/metrics.jsonl" 20; r=$(ranks_of $pid | tail -1); kill -TERM "$r"; wait $pid; rc=$?
  n=$(sed -n "s/^stopped \(by SIGTERM\|on another process's signal\) after step \([0-9]*\): checkpoint .*/\2/p" "$T/mpione.log")
  if [[ $rc -eq 143 && -n $n && $(step_of "$T/mpione/checkpoint.bin") == "$n" && $(steps_of "$T/mpione/metrics.jsonl" | tail -1) == "$n" ]] &&
     whole_records "$T/mpione/metrics.jsonl"; then ok mpi_signal_to_one_rank_stops_every_rank
  else bad mpi_signal_to_one_rank_stops_every_rank "mpirun exit $rc (want 143), stopped at '$n' (rank pid '$r')" "$(tail -4 "$T/mpione.log")"; fi
  rm -rf "$T/mpistop"
  timeout 120 "${MPIRUN[@]}" --mca odls_base_sigkill_timeout 3 -np 2 "$BIN" train "${MPISTOP[@]}" --out "$T/mpistop" \
    >"$T/mpistop.log" 2>&1 &
  pid=$!
  # (to mpirun itself, as Ctrl-C would: a signal to timeout reaches mpirun twice, directly and
  # through its process group, and Open MPI takes a second one as "abort now")
  wait_steps "$T/mpistop/metrics.jsonl" 20; kill -INT "$(pgrep -P $pid -x mpirun)"; wait $pid
  n=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\): checkpoint .*/\1/p' "$T/mpistop.log")
  if [[ -n $n && $n -lt 180 && $(step_of "$T/mpistop/checkpoint.bin") == "$n" ]] && whole_records "$T/mpistop/metrics.jsonl"; then
    ok mpi_ctrl_c_stops_with_checkpoint
  else bad mpi_ctrl_c_stops_with_checkpoint "stopped at '$n'" "$(tail -4 "$T/mpistop.log")"; fi
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --resume "$T/mpistop/checkpoint.bin" --out "$T/mpistop" \
    >"$T/mpistopr.log" 2>&1
  s=$(steps_of "$T/mpistop/metrics.jsonl")
  if same_hash "$(hash_of "$T/straight3/checkpoint.bin")" "$(hash_of "$T/mpistop/checkpoint.bin")" &&
     [[ $(wc -l <<<"$s") -eq 180 && $(sort -un <<<"$s" | wc -l) -eq 180 ]] &&
     "$BIN" plot --out "$T/mpistop/plots" "$T/mpistop" >"$T/mpiplot.log" 2>&1 && [[ -s $T/mpistop/plots/loss_step.svg ]]; then
    ok mpi_stop_resume_plot
  else bad mpi_stop_resume_plot "$(wc -l <<<"$s") step records" "$(tail -n 3 "$T/mpistopr.log" "$T/mpiplot.log")"; fi
  # the parameter server across processes (2 workers, 1 server): a signal to one rank stops
  # every rank, servers included, at the end of the epoch; the resume gives the threads' bits
  rm -rf "$T/mpiasync"
  timeout 120 "${MPIRUN[@]}" -np 3 "$BIN" train "${ASYNC[@]}" --workers 1 --simulate-jitter p=1,ms=20 \
    --out "$T/mpiasync" >"$T/mpiasync.log" 2>&1 &
  pid=$!
  wait_steps "$T/mpiasync/metrics.jsonl" 20; kill -TERM "$(ranks_of $pid | tail -1)"; wait $pid; rc=$?
  e=$("$BIN" ckpt info "$T/mpiasync/checkpoint.bin" 2>/dev/null | sed -n 's/^step: .*(epoch \([0-9]*\), step 0 in epoch)$/\1/p')
  timeout 120 "${MPIRUN[@]}" -np 3 "$BIN" train --resume "$T/mpiasync/checkpoint.bin" --out "$T/mpiasync" \
    >"$T/mpiasyncr.log" 2>&1
  if [[ $rc -eq 143 && -n $e && $e -lt 3 ]] && grep -q "^stopped .* after step" "$T/mpiasync.log" &&
     same_hash "$(hash_of "$T/astraight/checkpoint.bin")" "$(hash_of "$T/mpiasync/checkpoint.bin")"; then
    ok mpi_async_signal_stops_at_epoch_end
  else bad mpi_async_signal_stops_at_epoch_end "mpirun exit $rc, checkpoint after epoch '$e'" \
    "$(tail -n 2 "$T/mpiasync.log" "$T/mpiasyncr.log")"; fi
elif [[ $BIN == *-asan* || $BIN == *-tsan* ]]; then
  # by design, as cli.sh's MPI blocks: the plain build's run covers them
  echo "note: mpi_signal_to_one_rank_stops_every_rank, mpi_ctrl_c_stops_with_checkpoint, mpi_stop_resume_plot," \
    "mpi_async_signal_stops_at_epoch_end not run on a sanitizer build"
else
  for n in mpi_signal_to_one_rank_stops_every_rank mpi_ctrl_c_stops_with_checkpoint mpi_stop_resume_plot \
    mpi_async_signal_stops_at_epoch_end; do
    skip $n "MPI not built into $BIN"; done
fi

# --- R1: plot reads a metrics.jsonl whose last record was cut short ------------------------
cp "$T/every/metrics.jsonl" "$T/cut.jsonl"; printf '{"kind": "step", "step": 11, "loss": 0.5, "byt' >>"$T/cut.jsonl"
if "$BIN" plot --out "$T/cutplots" "$T/cut.jsonl" >"$T/cut.log" 2>"$T/cut.err" && [[ -s $T/cutplots/loss_step.svg ]] &&
   [[ $(grep -c "warning: .*cut.jsonl:12: the last record is cut short" "$T/cut.err") -eq 1 ]]; then ok plot_reads_cut_last_record
else bad plot_reads_cut_last_record "$(cat "$T/cut.err")"; fi
