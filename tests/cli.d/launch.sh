# dptrain launch, the supervisor (issue 33, E1; sourced by tests/cli.sh: its helpers, BIN, DATA,
# T, MPIRUN): a killed job is relaunched from its checkpoint and ends with the uninterrupted
# run's bits; a host that joins grows the job, a host that dies is excluded; a job that cannot
# start is not restarted; launch.jsonl accounts for each event.

# cnn, 60 steps of 64, deterministic (the same bits at any worker count), a checkpoint every 5
LJOB=(--model cnn --data "$DATA" --train-limit 4000 --test-limit 200 --batch 64 --lr 0.05 --momentum 0.9
      --epochs 1 --max-steps 60 --deterministic --ckpt-every-steps 5 --progress none)
"$BIN" train "${LJOB[@]}" --workers 2 --out "$T/lstraight" >"$T/ls.log" 2>&1
lhash=$(hash_of "$T/lstraight/checkpoint.bin")
# kinds of launch.jsonl's records, in order, on one line
launch_kinds() { sed -n 's/.*"kind": "\([a-z_]*\)".*/\1/p' "$1" | tr '\n' ' '; }
# kill_after FILE N SIGNAL PATTERN: once FILE holds N step records, signal the newest process
# whose command line matches PATTERN (in the background)
kill_after() {
  ( wait_steps "$1" "$2" && pkill -"$3" -n -f "$4" ) &
}

# --- one machine: a killed job comes back from its checkpoint -------------------------------
kill_after "$T/l1/metrics.jsonl" 23 9 "dptrain train .*$T/l1"
if "$BIN" launch --max-restarts 2 -- train "${LJOB[@]}" --workers 2 --out "$T/l1" >"$T/l1.log" 2>&1 &&
   same_hash "$(hash_of "$T/l1/checkpoint.bin")" "$lhash" &&
   [[ $(launch_kinds "$T/l1/launch.jsonl") == "launch failure launch recovered done " ]] &&
   [[ $(steps_of "$T/l1/metrics.jsonl" | tr '\n' ' ') == "$(seq -s ' ' 1 60) " ]] &&
   grep -q "^dptrain launch: the job failed (status 137) after step [0-9]*, checkpoint at step [0-9]*" "$T/l1.log"; then
  # at most N = 5 steps since the last durable checkpoint, plus those of a background write still
  # in flight when the job died (lost with it): at most 2N while a write takes less than N steps
  lost=$(sed -n 's/.*"kind": "failure".*"steps_lost": \([0-9]*\).*/\1/p' "$T/l1/launch.jsonl")
  if [[ -n $lost ]] && (( lost <= 10 )); then ok launch_restarts_killed_job
  else bad launch_restarts_killed_job "steps lost $lost > 10" "$(cat "$T/l1/launch.jsonl")"; fi
else bad launch_restarts_killed_job "hash $(hash_of "$T/l1/checkpoint.bin") vs $lhash" "$(cat "$T/l1/launch.jsonl" 2>&1)" \
  "$(grep -v '^epoch' "$T/l1.log" | tail -5)"; fi
wait
# dptrain plot draws the world size over time from the folder's launch.jsonl: 1 host, 0 after
# the failure, 1 again from the relaunch to the end (a step line: 7 points)
if "$BIN" plot --out "$T/l1plot" "$T/l1" >"$T/l1plot.log" 2>&1 && grep -q "^wrote .*/world_size.svg" "$T/l1plot.log" &&
   /usr/bin/python3 -c "
import sys, xml.dom.minidom
d = xml.dom.minidom.parse(sys.argv[1])
pl = d.getElementsByTagName('polyline')
ys = [float(p.split(',')[1]) for p in pl[0].getAttribute('points').split()]
assert len(pl) == 1 and len(ys) == 7, ys
top, bottom = min(ys), max(ys)   # (SVG's y grows downwards)
assert ys == [top, top, bottom, bottom, top, top, top], ys
" "$T/l1plot/world_size.svg"; then ok launch_world_size_plotted
else bad launch_world_size_plotted "$(cat "$T/l1plot.log")"; fi

# --- a job that cannot start is not restarted; the usage errors -----------------------------
# (stderr: the job's own error, launch's lines, and launch's error last)
"$BIN" launch -- train --model nosuch --data "$DATA" --out "$T/l2" >"$T/l2.out" 2>"$T/l2.err"
rc=$?
if [[ $rc == 1 && $(tail -1 "$T/l2.err") == "dptrain: error: launch: the job failed before its first step, naming no lost rank: not restarted (see its error above)" ]] &&
   grep -q "^dptrain: error: unknown model 'nosuch'" "$T/l2.err" &&
   [[ $(launch_kinds "$T/l2/launch.jsonl") == "launch failure gave_up " ]]; then ok launch_no_restart_before_first_step
else bad launch_no_restart_before_first_step "exit $rc" "$(cat "$T/l2.err" "$T/l2/launch.jsonl")"; fi
expect_error launch_needs_out "train needs --out DIR" "$BIN" launch -- train --model mlp
expect_error launch_needs_job "give the job after '--'" "$BIN" launch --max-restarts 1
expect_error launch_hosts_missing "--hosts $T/nohosts: No such file" "$BIN" launch --hosts "$T/nohosts" -- train --out "$T/l3"
printf 'localhost\n' >"$T/hosts1"
expect_error launch_min_nodes "lists 1 host, fewer than --min-nodes 2" \
  "$BIN" launch --hosts "$T/hosts1" --min-nodes 2 -- train --out "$T/l3"

# --- mpirun, one process per host, the hosts from a discovery command: a host joins (the job
# grows at a step boundary), then a host dies (it is excluded and the job goes on without it);
# the uninterrupted run's bits ---
printf 'localhost\n' >"$T/hosts"
( wait_steps "$T/l4/metrics.jsonl" 15 && echo 127.0.0.1 >>"$T/hosts" &&
  # the job grown to 2 processes: the newest rank dies at its 10th step or so
  k=0 && while (( k < 600 )) && [[ $(grep -c '"kind": "launch"' "$T/l4/launch.jsonl") -lt 2 ]]; do sleep 0.1; k=$((k + 1)); done &&
  c=$(grep -c '"kind": "step"' "$T/l4/metrics.jsonl") && wait_steps "$T/l4/metrics.jsonl" $((c + 10)) &&
  pkill -9 -n -f "dptrain train .*$T/l4" ) &
lopts=()
for o in "${MPIRUN[@]:1}"; do lopts+=(--mpirun-opt "$o"); done
# (under ASan, LeakSanitizer reports Open MPI's own allocations at its init in every rank, and the
# rank exits 1: as cli.sh's MPI runs, those keep ASan's other checks and turn leak detection off)
lenv=(env)
[[ $BIN == *-asan* ]] && lenv=(env ASAN_OPTIONS=detect_leaks=0)
if "${lenv[@]}" "$BIN" launch --hosts-cmd "cat $T/hosts" --cooldown-s 600 --poll-s 0.2 "${lopts[@]}" -- \
     train "${LJOB[@]}" --workers 1 --out "$T/l4" >"$T/l4.log" 2>&1 &&
   same_hash "$(hash_of "$T/l4/checkpoint.bin")" "$lhash" &&
   [[ $(launch_kinds "$T/l4/launch.jsonl") == "launch scale_up launch failure launch recovered done " ]] &&
   grep -q '"kind": "launch", "attempt": 0, "size": 2, "hosts": \["localhost", "127.0.0.1"\]' "$T/l4/launch.jsonl" &&
   grep -q '"kind": "failure", .*"failed_hosts": \["[a-z0-9.]*"\]' "$T/l4/launch.jsonl" &&
   grep -q '"kind": "launch", "attempt": 1, "size": 1' "$T/l4/launch.jsonl" &&
   [[ $(steps_of "$T/l4/metrics.jsonl" | tr '\n' ' ') == "$(seq -s ' ' 1 60) " ]]; then ok launch_grows_and_excludes
else bad launch_grows_and_excludes "hash $(hash_of "$T/l4/checkpoint.bin") vs $lhash" "$(cat "$T/l4/launch.jsonl" 2>&1)" \
  "$(grep -v '^epoch' "$T/l4.log" | tail -8)"; fi
wait

# --- the failure records decide which host is lost (a stand-in for mpirun, no MPI needed): the
# first attempt, on a, b, c, d, sees host a leave the hosts file (launch re-reads it meanwhile:
# rank 2 must still be c), then leaves the records of a link cut on c (the others name process
# 2, c names 0, 1 and 3: the vote names c alone) and fails; the relaunch on b, d ends well ---
# (the fakes' shared start, sourced: the hosts and the run folder from mpirun's arguments,
# -np N --host h1,h2,... [--mca k v] ... dptrain train ... --out DIR ..., the hosts recorded)
cat >"$T/fake-args.sh" <<'FAKE'
hosts= out=
while (( $# )); do
  case $1 in --host) hosts=$2; shift ;; --out) out=$2; shift ;; esac
  shift
done
echo "$hosts" >>"$out/fake-hosts"
FAKE
cat >"$T/fake-mpirun" <<FAKE
#!/bin/bash
. "$T/fake-args.sh"
FAKE
cat >>"$T/fake-mpirun" <<'FAKE'
if [[ $hosts == a,b,c,d ]]; then
  printf 'b\nc\nd\n' >"$FAKE_HOSTS"
  sleep 0.6
  printf '{"kind": "step", "step": 1, "loss": 1}\n' >>"$out/metrics.jsonl"
  for p in 0 1 3; do
    printf '{"kind": "failure", "process": %d, "host": "h", "steps_done": 1, "lost_processes": [2], "error": "comm: timeout: rank 2 did not respond"}\n' $p >"$out/failure.p$p.json"
  done
  printf '{"kind": "failure", "process": 2, "host": "c", "steps_done": 1, "lost_processes": [0, 1, 3], "error": "x"}\n' >"$out/failure.p2.json"
  exit 1
fi
[[ $hosts == b,d && ! -e $out/failure.p0.json ]]
FAKE
chmod +x "$T/fake-mpirun"
printf 'a\nb\nc\nd\n' >"$T/hosts-abcd"
mkdir -p "$T/l5"
if FAKE_HOSTS=$T/hosts-abcd "$BIN" launch --hosts "$T/hosts-abcd" --mpirun "$T/fake-mpirun" --min-nodes 2 --poll-s 0.1 -- \
     train --model mlp --out "$T/l5" >"$T/l5.log" 2>&1 &&
   [[ $(tr '\n' ' ' <"$T/l5/fake-hosts") == "a,b,c,d b,d " ]] &&
   grep -q '"kind": "failure", .*"failed_hosts": \["c"\], "records": 4,' "$T/l5/launch.jsonl" &&
   grep -q '"kind": "launch", "attempt": 1, "size": 2, "hosts": \["b", "d"\]' "$T/l5/launch.jsonl"; then
  ok launch_failure_records_vote
else bad launch_failure_records_vote "$(cat "$T/l5/launch.jsonl" "$T/l5/fake-hosts" 2>&1)" "$(tail -5 "$T/l5.log")"; fi

# --- a rank that died of SIGPIPE (it wrote to the lost rank's closed socket) is not a lost host:
# the first attempt's output names rank 2 killed by signal 13 and rank 0 by signal 9; only a is
# excluded, and the relaunch runs on b, c ---
cat >"$T/fake-mpirun3" <<FAKE
#!/bin/bash
. "$T/fake-args.sh"
FAKE
cat >>"$T/fake-mpirun3" <<'FAKE'
if [[ $hosts == a,b,c ]]; then
  printf '{"kind": "step", "step": 1, "loss": 1}\n' >>"$out/metrics.jsonl"
  echo "mpirun noticed that process rank 2 with PID 7 on node c exited on signal 13 (Broken pipe)." >&2
  echo "mpirun noticed that process rank 0 with PID 5 on node a exited on signal 9 (Killed)." >&2
  exit 141
fi
[[ $hosts == b,c ]]
FAKE
chmod +x "$T/fake-mpirun3"
printf 'a\nb\nc\n' >"$T/hosts-abc"
mkdir -p "$T/l7"
if "$BIN" launch --hosts "$T/hosts-abc" --mpirun "$T/fake-mpirun3" --min-nodes 2 --poll-s 0.1 -- \
     train --model mlp --out "$T/l7" >"$T/l7.log" 2>&1 &&
   [[ $(tr '\n' ' ' <"$T/l7/fake-hosts") == "a,b,c b,c " ]] &&
   grep -q '"kind": "failure", .*"failed_hosts": \["a"\], "records": 0,' "$T/l7/launch.jsonl"; then
  ok launch_sigpipe_not_lost
else bad launch_sigpipe_not_lost "$(cat "$T/l7/launch.jsonl" "$T/l7/fake-hosts" 2>&1)" "$(tail -5 "$T/l7.log")"; fi

# --- a relaunch that fails before its first step, naming no host, is not relaunched again (the
# steps the failed attempt left in metrics.jsonl are not this attempt's progress) ---
cat >"$T/fake-mpirun2" <<'FAKE'
#!/bin/bash
out=
while (( $# )); do [[ $1 == --out ]] && out=$2; shift; done
[[ -e $out/once ]] && exit 1
touch "$out/once"
printf '{"kind": "step", "step": 1, "loss": 1}\n' >>"$out/metrics.jsonl"
printf '{"kind": "failure", "process": 0, "host": "a", "steps_done": 1, "lost_processes": [1], "error": "x"}\n' >"$out/failure.p0.json"
exit 1
FAKE
chmod +x "$T/fake-mpirun2"
mkdir -p "$T/l6"
"$BIN" launch --hosts "$T/hosts-abc" --mpirun "$T/fake-mpirun2" --min-nodes 2 --max-restarts 5 -- \
  train --model mlp --out "$T/l6" >"$T/l6.log" 2>&1
rc=$?
if [[ $rc == 1 ]] && [[ $(launch_kinds "$T/l6/launch.jsonl") == "launch failure launch failure gave_up " ]] &&
   grep -q "failed before its first step, naming no lost rank: not restarted" "$T/l6.log"; then
  ok launch_no_restart_without_progress
else bad launch_no_restart_without_progress "exit $rc" "$(cat "$T/l6/launch.jsonl")"; fi
