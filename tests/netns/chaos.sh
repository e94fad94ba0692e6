# shellcheck shell=bash
# The chaos run of dptrain launch on the emulated cluster (issue 33, E4): hosts are lost and
# come back while a deterministic job trains; it must finish with the uninterrupted run's bits.
# Sourced after tests/netns/cluster.sh (a cluster up: CLUSTER_STATE); used by bench/chaos.sh (the
# full run) and tests/netns/test_cluster.sh (a short one).
#
#   chaos_run DIR FAILS REJOINS MIN_S SEED [ARGS...]
#
# runs `dptrain launch --hosts DIR.hosts --min-nodes 2 -- train ARGS --out DIR` (BIN: the
# dptrain binary) on every host of the cluster and, once the job is steady, loses a random host
# every 15-30 s: the host leaves DIR.hosts (the machine is gone), then its rank is SIGKILLed.
# 20 s after its loss the host comes back into DIR.hosts (launch grows the job at a step
# boundary).  Never below 2 hosts (--min-nodes): a loss is put off while only 2 run.  Losses
# go on until FAILS losses, REJOINS returns and MIN_S seconds are done; then the job runs to
# its end.  One action at a time, each once the job is steady (every rank of the newest
# launch running and two steps recorded since it resumed), so that launch.jsonl can be checked
# against the actions one for one.  SEED seeds the choices ($RANDOM).
#
#   chaos_at_steps DIR LOSE GAIN K [ARGS...]
#
# the same job and files with two actions at given steps (issue 33's E3 case): host hK is lost
# at step LOSE and comes back at step GAIN.  chaos_check compares either run's launch.jsonl
# with its actions and its hash with the uninterrupted run's; chaos_summary gives one line.
#
# Every phase is bounded: the job steady again within CHAOS_PHASE_S (90 s), the whole run within
# CHAOS_LIMIT_S (900 s).  DIR.chaos gets one line per action: "TIME kill|rejoin HOST SIZE".
# Returns 0 when the actions were all made and the job ended 0; else 1 with CHAOS_WHY set.
# Sets CHAOS_KILLS, CHAOS_REJOINS, CHAOS_S (the job's wall time).
# shellcheck disable=SC2034  # (CHAOS_*: the caller's)

_ch_now() { date +%s.%N; }
_ch_since() { awk -v a="$1" -v b="$(_ch_now)" 'BEGIN {printf "%.1f", b - a}'; }
_ch_ge() { awk -v a="$1" -v b="$2" 'BEGIN {exit !(a >= b)}'; }

# the newest launch record's field (size, resume_step) and the newest record's kind
_ch_launch_field() { grep '"kind": "launch"' "$1/launch.jsonl" 2>/dev/null | tail -1 | sed -n "s/.*\"$2\": \\(-\\?[0-9]*\\).*/\\1/p"; }
_ch_last_kind() { tail -1 "$1/launch.jsonl" 2>/dev/null | sed -n 's/.*"kind": "\([a-z_]*\)".*/\1/p'; }
_ch_last_step() { grep '"kind": "step"' "$1/metrics.jsonl" 2>/dev/null | tail -1 | sed -n 's/.*"step": \([0-9]*\),.*/\1/p'; }

# _ch_running: the indices K of the hosts with a dptrain rank now
_ch_running() {
  local k
  for ((k = 0; k < CLUSTER_N; k++)); do [[ -n $(cluster_pids "$k" dptrain 2>/dev/null) ]] && echo "$k"; done
}

# _ch_steady DIR: the newest launch runs on as many hosts as it named, and has recorded two steps
# past the step it resumed from; the newest record is that launch or its recovery
_ch_steady() {
  local d=$1 kind size resume step
  kind=$(_ch_last_kind "$d")
  [[ $kind == launch || $kind == recovered ]] || return 1
  size=$(_ch_launch_field "$d" size) resume=$(_ch_launch_field "$d" resume_step) step=$(_ch_last_step "$d")
  [[ -n $size && -n $resume && -n $step ]] && (( step >= resume + 2 )) || return 1
  (( $(_ch_running | wc -l) == size ))
}

# _ch_wait_steady DIR: 0 once steady; 1 when the job ended or CHAOS_PHASE_S passed
_ch_wait_steady() {
  local t0
  t0=$(_ch_now)
  until _ch_steady "$1"; do
    grep -q '^rc=' "$1.log" 2>/dev/null && return 1
    _ch_ge "$(_ch_since "$t0")" "${CHAOS_PHASE_S:-90}" && { CHAOS_WHY="not steady within ${CHAOS_PHASE_S:-90} s"; return 1; }
    sleep 0.2
  done
}

# _ch_ips: the hosts' addresses, h0 first
_ch_ips() { local k; for ((k = 0; k < CLUSTER_N; k++)); do awk -v h="h$k" '$1 == h {print $2}' "$CLUSTER_STATE/hosts"; done; }

# _ch_launch DIR ARGS...: dptrain launch on the hosts of DIR.hosts (all of them, written here) in
# the background (its pid in $!), its output and "rc=N" in DIR.log; DIR.chaos emptied
_ch_launch() {
  local d=$1 lopts=() o; shift
  while read -r o; do lopts+=(--mpirun-opt "$o"); done < <(cluster_mpirun_opts)
  _ch_ips >"$d.hosts"
  : >"$d.chaos"
  ( DPT_CLUSTER_STATE=$CLUSTER_STATE timeout "${CHAOS_LIMIT_S:-900}" "$BIN" launch --hosts "$d.hosts" --min-nodes 2 \
      --cooldown-s 0 --max-restarts 100 --poll-s 0.5 --wait-s 120 "${lopts[@]}" -- train "$@" --out "$d" \
      >"$d.log" 2>&1 </dev/null; echo "rc=$?" >>"$d.log" ) &
}

# _ch_wait_step DIR S: 0 once DIR/metrics.jsonl's newest step record is S or later (bounded by
# CHAOS_PHASE_S seconds without progress); 1 when the job ended first or stalled
_ch_wait_step() {
  local d=$1 s=$2 t0 last=-1 now
  t0=$(_ch_now)
  while now=$(_ch_last_step "$d"); (( ${now:--1} < s )); do
    grep -q '^rc=' "$d.log" 2>/dev/null && { CHAOS_WHY="the job ended before step $s"; return 1; }
    [[ ${now:--1} != "$last" ]] && last=${now:--1} t0=$(_ch_now)
    _ch_ge "$(_ch_since "$t0")" "${CHAOS_PHASE_S:-90}" && { CHAOS_WHY="no step for ${CHAOS_PHASE_S:-90} s before step $s"; return 1; }
    sleep 0.05
  done
}

# chaos_at_steps DIR LOSE GAIN K [ARGS...]: issue 33's E3 case: host hK is lost once step LOSE is
# recorded (it leaves DIR.hosts, its rank is SIGKILLed) and comes back once step GAIN is recorded
# after the relaunch; the job then runs to its end.  The same launch, files and checks
# (chaos_check) as chaos_run; 0 when both actions were made and the job ended 0.
chaos_at_steps() {
  local d=$1 lose=$2 gain=$3 k=$4 ip t0; shift 4
  CHAOS_KILLS=0 CHAOS_REJOINS=0 CHAOS_WHY='' CHAOS_S=''
  ip=$(_ch_ips | sed -n "$((k + 1))p")
  t0=$(_ch_now)
  _ch_launch "$d" "$@"
  local job=$!
  if _ch_wait_step "$d" "$lose"; then
    grep -vx "$ip" "$d.hosts" >"$d.hosts.new" && mv "$d.hosts.new" "$d.hosts"
    cluster_signal "$k" KILL dptrain 2>/dev/null
    CHAOS_KILLS=1
    echo "$(_ch_since "$t0") kill h$k $CLUSTER_N" >>"$d.chaos"
    # the relaunch cuts metrics.jsonl back to its checkpoint: wait for the failure first
    local w=0
    until grep -q '"kind": "failure"' "$d/launch.jsonl" 2>/dev/null || (( w > 600 )); do sleep 0.1; w=$((w + 1)); done
    if (( w <= 600 )) && _ch_wait_steady "$d" && _ch_wait_step "$d" "$gain"; then
      echo "$ip" >>"$d.hosts"
      CHAOS_REJOINS=1
      echo "$(_ch_since "$t0") rejoin h$k $((CLUSTER_N - 1))" >>"$d.chaos"
    else CHAOS_WHY=${CHAOS_WHY:-"the job did not recover within 60 s"}; fi
  fi
  wait "$job"
  CHAOS_S=$(_ch_since "$t0")
  [[ -z $CHAOS_WHY && $(sed -n 's/^rc=//p' "$d.log") == 0 ]] || { CHAOS_WHY=${CHAOS_WHY:-"launch exit $(sed -n 's/^rc=//p' "$d.log")"}; return 1; }
}

chaos_run() {
  local d=$1 fails=$2 rejoins=$3 min_s=$4 seed=$5; shift 5
  local ip=() k t0 next_kill now size
  local -A gone_at=()
  CHAOS_KILLS=0 CHAOS_REJOINS=0 CHAOS_WHY='' CHAOS_S=''
  RANDOM=$seed
  mapfile -t ip < <(_ch_ips)
  t0=$(_ch_now)
  _ch_launch "$d" "$@"
  local job=$!
  _ch_wait_steady "$d" || { CHAOS_WHY=${CHAOS_WHY:-"the job ended before its first steady state"}; wait "$job"; return 1; }
  next_kill=$(awk -v t="$(_ch_since "$t0")" -v r=$((15 + RANDOM % 16)) 'BEGIN {print t + r}')
  while (( CHAOS_KILLS < fails || CHAOS_REJOINS < rejoins )) || ! _ch_ge "$(_ch_since "$t0")" "$min_s" ||
        (( ${#gone_at[@]} > 0 )); do
    if grep -q '^rc=' "$d.log"; then CHAOS_WHY="the job ended after $CHAOS_KILLS losses and $CHAOS_REJOINS returns"; break; fi
    now=$(_ch_since "$t0")
    # a host lost 20 s ago comes back
    local back=
    for k in "${!gone_at[@]}"; do _ch_ge "$now" "$(awk -v g="${gone_at[$k]}" 'BEGIN {print g + 20}')" && back=$k && break; done
    if [[ -n $back ]] && _ch_steady "$d"; then
      local ups
      ups=$(grep -c '"kind": "scale_up"' "$d/launch.jsonl")
      unset "gone_at[$back]"
      echo "${ip[back]}" >>"$d.hosts"
      CHAOS_REJOINS=$((CHAOS_REJOINS + 1))
      echo "$now rejoin h$back $(_ch_launch_field "$d" size)" >>"$d.chaos"
      # wait for launch to grow the job (its record), then for the larger job to be steady
      local w=0
      until (( $(grep -c '"kind": "scale_up"' "$d/launch.jsonl") > ups )) || grep -q '^rc=' "$d.log" || (( w > 300 )); do sleep 0.1; w=$((w + 1)); done
      (( w > 300 )) && { CHAOS_WHY="no scale-up within 30 s of h$back's return"; break; }
      _ch_wait_steady "$d" || { CHAOS_WHY=${CHAOS_WHY:-"the job ended while growing"}; break; }
      continue
    fi
    # a loss: when due, with more than 2 hosts running, and losses still wanted
    if _ch_ge "$now" "$next_kill" && _ch_steady "$d" &&
       { (( CHAOS_KILLS < fails )) || ! _ch_ge "$now" "$min_s"; }; then
      mapfile -t run < <(_ch_running)
      size=${#run[@]}
      if (( size > 2 )); then
        k=${run[RANDOM % size]}
        grep -vx "${ip[k]}" "$d.hosts" >"$d.hosts.new" && mv "$d.hosts.new" "$d.hosts"
        cluster_signal "$k" KILL dptrain 2>/dev/null
        gone_at[$k]=$now
        CHAOS_KILLS=$((CHAOS_KILLS + 1))
        echo "$now kill h$k $size" >>"$d.chaos"
        next_kill=$(awk -v t="$now" -v r=$((15 + RANDOM % 16)) 'BEGIN {print t + r}')
        # the failure seen and the job steady again on the hosts left
        _ch_wait_steady "$d" || { CHAOS_WHY=${CHAOS_WHY:-"the job ended while recovering"}; break; }
        continue
      fi
    fi
    sleep 0.2
  done
  wait "$job"
  CHAOS_S=$(_ch_since "$t0")
  [[ -z $CHAOS_WHY && $(sed -n 's/^rc=//p' "$d.log") == 0 ]] || { CHAOS_WHY=${CHAOS_WHY:-"launch exit $(sed -n 's/^rc=//p' "$d.log")"}; return 1; }
}

# chaos_check DIR HASH N: the account of a chaos run against its actions.  HASH: the
# uninterrupted run's parameter hash; N: its --ckpt-every-steps.  0 when launch.jsonl holds one
# failure naming the lost host for each loss and one scale-up for each return, in order, every
# failure lost at most 2N steps (N, and a background write in flight), each step is recorded
# once from 1 to the last, and the final hash is HASH; else 1 with CHAOS_WHY set.
chaos_check() {
  local d=$1 want=$2 n=$3 got acts evs last
  got=$("$BIN" ckpt info "$d/checkpoint.bin" 2>/dev/null | awk '/^param hash:/ {print $3}')
  [[ -n $got && $got == "$want" ]] || { CHAOS_WHY="param hash ${got:-none}, the uninterrupted run's $want"; return 1; }
  # the actions as "kill IP" / "rejoin" against the records as "kill IP" / "rejoin"
  acts=$(awk -v st="$CLUSTER_STATE/hosts" 'BEGIN {while ((getline l < st) > 0) {split(l, f, " "); ip[f[1]] = f[2]}}
              $2 == "kill" {print "kill " ip[$3]} $2 == "rejoin" {print "rejoin"}' "$d.chaos" | tr '\n' ';')
  evs=$(sed -n 's/.*"kind": "failure".*"failed_hosts": \["\([0-9.]*\)"\].*/kill \1/p; s/.*"kind": "scale_up".*/rejoin/p' \
        "$d/launch.jsonl" | tr '\n' ';')
  [[ $acts == "$evs" ]] || { CHAOS_WHY="actions '$acts', launch.jsonl '$evs'"; return 1; }
  last=$(sed -n 's/.*"kind": "failure".*"steps_lost": \([0-9]*\).*/\1/p' "$d/launch.jsonl" | sort -n | tail -1)
  (( ${last:-0} <= 2 * n )) || { CHAOS_WHY="a failure lost $last steps, more than 2 x $n"; return 1; }
  last=$(grep -c '"kind": "step"' "$d/metrics.jsonl")
  [[ $(grep '"kind": "step"' "$d/metrics.jsonl" | sed -n 's/.*"step": \([0-9]*\),.*/\1/p' | tr '\n' ' ') == "$(seq -s ' ' 1 "$last") " ]] ||
    { CHAOS_WHY="the step records are not 1..$last once each"; return 1; }
  grep -q '"kind": "done"' "$d/launch.jsonl" || { CHAOS_WHY="no done record"; return 1; }
}

# chaos_summary DIR: one line: the losses, returns, recovery times (median, max), steps lost,
# the sizes the job ran at
chaos_summary() {
  local d=$1
  local rec lost sizes
  rec=$(sed -n 's/.*"recovery_s": \([0-9.]*\).*/\1/p' "$d/launch.jsonl" | sort -n |
        awk '{a[NR] = $1} END {if (NR) printf "recovery median %.1f s, max %.1f s", a[int((NR + 1) / 2)], a[NR]; else printf "no recovery"}')
  lost=$(sed -n 's/.*"kind": "failure".*"steps_lost": \([0-9]*\).*/\1/p' "$d/launch.jsonl" | awk '{s += $1} END {print s + 0}')
  sizes=$(sed -n 's/.*"kind": "launch".*"size": \([0-9]*\).*/\1/p' "$d/launch.jsonl" | tr '\n' ' ')
  # from each loss (the action's time) to the first step after its relaunch (the i-th recovered
  # record; both clocks start within milliseconds of each other)
  local k2s
  k2s=$(paste <(awk '$2 == "kill" {print $1}' "$d.chaos") \
              <(sed -n 's/{"time_s": \([0-9.]*\), "kind": "recovered".*/\1/p' "$d/launch.jsonl") |
        awk 'NF == 2 {print $2 - $1}' | sort -n |
        awk '{a[NR] = $1} END {if (NR) printf "loss to first step median %.1f s, max %.1f s", a[int((NR + 1) / 2)], a[NR]}')
  echo "$(grep -c ' kill ' "$d.chaos") losses, $(grep -c ' rejoin ' "$d.chaos") returns, $rec after the failure was seen, ${k2s:-no loss timed}, $lost steps lost in all, sizes: ${sizes% }"
}
