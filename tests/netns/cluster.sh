#!/usr/bin/env bash
# shellcheck disable=SC2119,SC2120  # cluster_attach / cluster_down take an optional argument
# Several "machines" on one host: network namespaces joined by a bridge over rate-limited veth
# links, and mpirun across them with TCP as the only transport.  See tests/netns/README.md.
#
# As a command (needs root, iproute2 with tc, Open MPI):
#   bash tests/netns/cluster.sh up N [RATE]    N hosts h0..h(N-1), links shaped to RATE (tc syntax:
#                                              1gbit, 100mbit; "off" = unshaped) [1gbit]
#   bash tests/netns/cluster.sh run ARGS...    mpirun across the hosts: ARGS are extra mpirun
#                                              options, then the program and its arguments
#   bash tests/netns/cluster.sh shape RATE|off change the shaping of every link
#   bash tests/netns/cluster.sh pids K [NAME]  pids of the rank processes on host hK
#   bash tests/netns/cluster.sh signal K SIG [NAME]   send them SIG
#   bash tests/netns/cluster.sh cpus K         the cores of host hK (each host has its own)
#   bash tests/netns/cluster.sh status | down | gc
# The command keeps one cluster per CLUSTER_PREFIX (default "dpt-cli"), which lasts until down.
#
# As a library (source it):
#   source tests/netns/cluster.sh
#   cluster_trap                    # cluster_down on EXIT, INT and TERM: nothing is left behind
#   cluster_up 4 1gbit              # prefix dpt-$$ unless CLUSTER_PREFIX is set
#   cluster_run -np 4 ./prog args   # mpirun ...; its exit status
#   cluster_pids 2 prog; cluster_signal 2 KILL prog
#   cluster_down
# A cluster made by a script records the script's pid as its owner: cluster_up (and
# cluster.sh gc) first removes any cluster whose owner has died without cleaning up, and any
# earlier cluster with the same prefix.
#
# What cluster_up builds for prefix P (interface names <= 15 characters, so P <= 11):
#   namespaces P-h0..P-h(N-1), each with lo up and eth0 = 10.77.X.(K+1)/24, X a /24 not in use
#   (chosen under a lock, so concurrent clusters get different subnets);
#   bridge P-br in the root namespace with 10.77.X.254/24 (mpirun runs there and must reach the
#   orted daemons); veth pair P-hK (root side, a bridge port) <-> eth0 (in namespace P-hK);
#   a tbf qdisc on both ends of every veth pair, so each host's link is shaped both ways;
#   each host its own cores (see _cl_assign_cpus): rsh-agent.sh starts the host's orted under
#   taskset with them, and mpirun runs with --bind-to none so the ranks keep them.
#   State in $DPT_STATE_ROOT/P (/run/dpt-netns/P): owner, net, bridge, rate, hosts, hostfile,
#   cpus ("hK LIST" per host, LIST in taskset -c syntax).
# DPT_TBF_BURST / DPT_TBF_LATENCY override the tbf burst (bytes) and latency (10ms).

DPT_NETNS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DPT_STATE_ROOT=${DPT_STATE_ROOT:-/run/dpt-netns}

_cl_err() { echo "cluster: $*" >&2; }

# cluster_check: 0 when this host can run clusters, else prints why to stdout and returns 1
cluster_check() {
  if [[ $(id -u) -ne 0 ]]; then echo "needs root (network namespaces)"; return 1; fi
  local t
  for t in ip tc mpirun unshare flock taskset; do
    command -v "$t" >/dev/null 2>&1 || { echo "$t not found"; return 1; }
  done
  if ! unshare --net true 2>/dev/null; then echo "cannot create network namespaces here"; return 1; fi
  return 0
}

# _cl_state_of PREFIX: the state directory of a prefix
_cl_state_of() { echo "$DPT_STATE_ROOT/$1"; }

# _cl_rate_bytes RATE: bytes per second of a tc rate (bit, kbit, mbit, gbit, tbit; k = 1000)
_cl_rate_bytes() {
  local r=${1,,} n u m
  n=${r%%[a-z]*}; u=${r#"$n"}
  case $u in
    bit | '') m=1 ;; kbit) m=1000 ;; mbit) m=1000000 ;; gbit) m=1000000000 ;; tbit) m=1000000000000 ;;
    *) return 1 ;;
  esac
  awk -v n="$n" -v m="$m" 'BEGIN { if (n + 0 <= 0) exit 1; printf "%.0f\n", n * m / 8 }'
}

# _cl_tbf_args RATE: the tbf parameters for RATE ("rate R burst B latency L")
# burst: the bucket size, the bytes that may leave back to back at the veth's own (unlimited)
# speed.  It must hold at least one whole packet as the qdisc sees it: veth does GSO, so a
# "packet" is up to 64 KiB (tbf would otherwise have to split every super-packet), and it should
# cover the rate for about one timer interval, since the qdisc's watchdog cannot release packets
# in finer steps (HZ=250 here: 4 ms, though tbf's hrtimer is finer; 1 ms at 1 Gbit/s = 125 KB).
# We take max(128 KiB, 1 ms of the rate): at 1 Gbit/s 128 KiB, about 1 ms of line time, so
# bursts stay short and the average rate is accurate while big GSO packets pass whole.
# (Measured here: bursts of 128 KiB to 1 MiB all gave 113-118 MB/s for a 16 MiB ping-pong.)
# latency: how long a packet may wait in the queue before tbf drops it (sets the queue size,
# rate x latency + burst, about 1.4 MB at 1 Gbit/s for 10 ms): enough to absorb a TCP window
# without drops, small enough not to add large delays.
_cl_tbf_args() {
  local bytes burst
  bytes=$(_cl_rate_bytes "$1") || { _cl_err "bad rate '$1' (use tc syntax: 1gbit, 100mbit)"; return 1; }
  burst=$((bytes / 1000))
  ((burst < 131072)) && burst=131072
  echo "rate $1 burst ${DPT_TBF_BURST:-$burst} latency ${DPT_TBF_LATENCY:-10ms}"
}

# cluster_shape RATE|off: (re)shape every link of the current cluster in both directions
cluster_shape() {
  local rate=$1 st=${CLUSTER_STATE:-} args='' n ip ns veth
  [[ -n $st && -r $st/hosts ]] || { _cl_err "no cluster (cluster_up first)"; return 1; }
  if [[ $rate != off ]]; then args=$(_cl_tbf_args "$rate") || return 1; fi
  while read -r n ip ns veth; do
    if [[ $rate == off ]]; then
      tc qdisc del dev "$veth" root 2>/dev/null
      ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null
    else
      # shellcheck disable=SC2086
      tc qdisc replace dev "$veth" root tbf $args || return 1                     # towards hK
      # shellcheck disable=SC2086
      ip netns exec "$ns" tc qdisc replace dev eth0 root tbf $args || return 1    # from hK
    fi
  done <"$st/hosts"
  echo "$rate" >"$st/rate"
}

# _cl_cpus_avail: the cores this process may run on, one line, "0 1 2 3" (its affinity mask, from
# /proc/self/status: what a cgroup cpuset, taskset or an outer launcher's binding leaves us)
_cl_cpus_avail() {
  local list r a b c out=() parts=()
  list=$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status)
  IFS=, read -ra parts <<<"$list"
  for r in "${parts[@]}"; do
    if [[ $r == *-* ]]; then a=${r%-*} b=${r#*-}; for ((c = a; c <= b; c++)); do out+=("$c"); done
    elif [[ -n $r ]]; then out+=("$r"); fi
  done
  echo "${out[*]}"
}

# _cl_assign_cpus N: the cores of each of N hosts, one line "hK LIST" per host (LIST for taskset
# -c).  With C available cores c_0..c_(C-1): when N <= C host k gets the block c_(kC/N) ..
# c_((k+1)C/N - 1) (integer division: disjoint blocks of floor or ceil of C/N cores, all cores
# used); when N > C host k gets the single core c_(k mod C), round-robin, so a core serves at
# most ceil(N/C) hosts.  Hosts share cores only when there are more hosts than cores.  A host's
# ranks and their threads (several ranks per host, --workers T) all share the host's set, as on
# a machine with that many cores.  Without this every host's orted would bind its rank to the
# first core (or all to the same socket): N emulated hosts computing on one core.
_cl_assign_cpus() {
  local n=$1 cores k c lo hi list
  read -ra cores <<<"$(_cl_cpus_avail)"
  c=${#cores[@]}
  ((c >= 1)) || { _cl_err "no cores in this process's affinity mask"; return 1; }
  for ((k = 0; k < n; k++)); do
    if ((n <= c)); then
      lo=$((k * c / n)) hi=$(((k + 1) * c / n))
      list=$(IFS=,; echo "${cores[*]:lo:hi-lo}")
    else
      list=${cores[k % c]}
    fi
    echo "h$k $list"
  done
}

# _cl_free_net: a 10.77.X prefix no cluster and no interface of this host uses (under the lock)
_cl_free_net() {
  local used x
  used=$(ip -4 -o addr show 2>/dev/null | grep -oE '10\.77\.[0-9]+\.' ; cat "$DPT_STATE_ROOT"/*/net 2>/dev/null | sed 's/$/./')
  for ((x = 0; x < 256; x++)); do
    grep -qxF "10.77.$x." <<<"$used" || { echo "10.77.$x"; return 0; }
  done
  return 1
}

# cluster_gc: removes clusters whose owning process has died (a run killed before its trap)
cluster_gc() {
  local d owner
  for d in "$DPT_STATE_ROOT"/*/; do
    [[ -f $d/owner ]] || continue
    owner=$(<"$d/owner")
    if [[ $owner =~ ^[0-9]+$ && $owner -gt 0 ]] && ! kill -0 "$owner" 2>/dev/null; then
      _cl_err "removing stale cluster $(basename "$d") (owner $owner is gone)"
      _cl_down_state "${d%/}"
    fi
  done
}

# cluster_up N [RATE]: builds the cluster (see the top of the file); sets CLUSTER_PREFIX,
# CLUSTER_STATE, CLUSTER_NET (10.77.X), CLUSTER_N, CLUSTER_HOSTFILE
cluster_up() {
  local n=${1:-4} rate=${2:-1gbit} why
  why=$(cluster_check) || { _cl_err "$why"; return 1; }
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 16 ]] || { _cl_err "N must be 1..16"; return 1; }
  [[ $rate == off ]] || _cl_tbf_args "$rate" >/dev/null || return 1
  CLUSTER_PREFIX=${CLUSTER_PREFIX:-dpt-$$}
  if [[ ! $CLUSTER_PREFIX =~ ^[A-Za-z0-9][A-Za-z0-9-]{0,10}$ ]]; then
    _cl_err "prefix '$CLUSTER_PREFIX': 1-11 letters, digits, '-' (interface names are <= 15)"; return 1
  fi
  mkdir -p "$DPT_STATE_ROOT"
  cluster_gc
  local st
  st=$(_cl_state_of "$CLUSTER_PREFIX")
  if [[ -e $st ]] || ip netns list | grep -q "^$CLUSTER_PREFIX-h[0-9]"; then
    _cl_err "removing an earlier cluster with prefix $CLUSTER_PREFIX"
    _cl_down_state "$st"
  fi
  CLUSTER_STATE=$st CLUSTER_N=$n
  export CLUSTER_PREFIX CLUSTER_STATE
  # choose the subnet and record the intended names before creating anything, under the lock,
  # so a crash at any point leaves state that down / gc can clean up
  local net
  {
    flock 9
    net=$(_cl_free_net) || { _cl_err "no free 10.77.X.0/24"; return 1; }
    mkdir -p "$st" && echo "$net" >"$st/net" && echo "${CLUSTER_OWNER:-$$}" >"$st/owner"
  } 9>"$DPT_STATE_ROOT/.lock"
  CLUSTER_NET=$net CLUSTER_HOSTFILE=$st/hostfile
  local br=$CLUSTER_PREFIX-br k
  echo "$br" >"$st/bridge"
  : >"$st/hosts"; : >"$st/hostfile"
  for ((k = 0; k < n; k++)); do
    echo "h$k $net.$((k + 1)) $CLUSTER_PREFIX-h$k $CLUSTER_PREFIX-h$k" >>"$st/hosts"
    echo "$net.$((k + 1)) slots=1" >>"$st/hostfile"
  done
  _cl_assign_cpus "$n" >"$st/cpus" || return 1
  {
    ip link add "$br" type bridge &&
      ip addr add "$net.254/24" dev "$br" &&
      ip link set "$br" up
  } || { _cl_err "bridge $br failed"; return 1; }
  local name ip ns veth
  while read -r name ip ns veth; do
    {
      ip netns add "$ns" &&
        ip link add "$veth" type veth peer name eth0 netns "$ns" &&
        ip link set "$veth" master "$br" &&
        ip link set "$veth" up &&
        ip -n "$ns" link set lo up &&
        ip -n "$ns" addr add "$ip/24" dev eth0 &&
        ip -n "$ns" link set eth0 up
    } || { _cl_err "host $name ($ns) failed"; return 1; }
  done <"$st/hosts"
  echo off >"$st/rate"
  [[ $rate == off ]] || cluster_shape "$rate" || return 1
  # reachability from the root namespace: "connection refused" from port 9 means the host
  # answered; a timeout means it did not
  while read -r name ip ns veth; do
    local msg
    msg=$(timeout 3 bash -c "exec 3<>/dev/tcp/$ip/9" 2>&1)
    if [[ $msg != *refused* ]]; then _cl_err "host $name ($ip) unreachable: ${msg:-timeout}"; return 1; fi
  done <"$st/hosts"
  return 0
}

# cluster_attach [PREFIX]: use an existing cluster (made by "cluster.sh up") in this shell
cluster_attach() {
  CLUSTER_PREFIX=${1:-${CLUSTER_PREFIX:-dpt-cli}}
  CLUSTER_STATE=$(_cl_state_of "$CLUSTER_PREFIX")
  [[ -r $CLUSTER_STATE/hosts ]] || { _cl_err "no cluster $CLUSTER_PREFIX (cluster.sh up first)"; return 1; }
  CLUSTER_NET=$(<"$CLUSTER_STATE/net") CLUSTER_HOSTFILE=$CLUSTER_STATE/hostfile
  CLUSTER_N=$(wc -l <"$CLUSTER_STATE/hosts")
  export CLUSTER_PREFIX CLUSTER_STATE
}

# cluster_cpus K: the cores of host hK (taskset -c syntax)
cluster_cpus() { awk -v h="h$1" '$1 == h {print $2}' "$CLUSTER_STATE/cpus" 2>/dev/null | grep .; }

# _cl_hosts_listing STATE: the hosts file with each host's cores appended ("... cpus LIST")
_cl_hosts_listing() {
  awk 'NR == FNR {c[$1] = $2; next} {print $0, "cpus", ($1 in c ? c[$1] : "?")}' "$1/cpus" "$1/hosts" 2>/dev/null ||
    cat "$1/hosts"
}

# cluster_mpirun_opts: the mpirun options for this cluster, one per line.  --bind-to none: each
# host's orted already runs on the host's own cores (rsh-agent.sh, taskset), and the ranks
# inherit that set; Open MPI's default binding would instead pin every host's rank to the first
# core of the machine (or the first socket), the same one on every host.
cluster_mpirun_opts() {
  local net
  net=$(<"$CLUSTER_STATE/net")
  printf '%s\n' --allow-run-as-root --hostfile "$CLUSTER_STATE/hostfile" --bind-to none \
    --mca plm_rsh_agent "$DPT_NETNS_DIR/rsh-agent.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca pml ob1 --mca btl tcp,self --mca osc '^ucx' \
    --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24"
}

# cluster_run ARGS...: mpirun across the hosts (pml ob1 over the TCP BTL only, no shared
# memory, no UCX), ARGS = extra mpirun options, the program and its arguments.  Without -np /
# -n in ARGS mpirun starts one rank per host.  Returns mpirun's exit status.
# mpirun runs in the background and the function waits for it, so that a signal to the calling
# script runs its trap at once (cluster_trap: exit, cluster_down kills the job) instead of after
# mpirun ends; mpirun's stdin is /dev/null.  (The command "cluster.sh run" runs it in the
# foreground instead, so Ctrl-C reaches mpirun directly.)
cluster_run() {
  [[ -n ${CLUSTER_STATE:-} && -r $CLUSTER_STATE/hostfile ]] || { _cl_err "no cluster (cluster_up first)"; return 1; }
  local opts pid
  mapfile -t opts < <(cluster_mpirun_opts)
  DPT_CLUSTER_STATE=$CLUSTER_STATE mpirun "${opts[@]}" "$@" </dev/null &
  pid=$!
  wait "$pid"
}

# cluster_pids K [NAME]: the rank processes on host hK (children of its orted), only those whose
# command name is NAME when given; one pid per line
cluster_pids() {
  local k=$1 name=${2:-} ns pid comm ppid pcomm
  ns=$(awk -v h="h$k" '$1 == h {print $3}' "$CLUSTER_STATE/hosts" 2>/dev/null)
  [[ -n $ns ]] || { _cl_err "no host h$k"; return 1; }
  for pid in $(ip netns pids "$ns" 2>/dev/null); do
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
    ppid=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
    pcomm=$(cat "/proc/$ppid/comm" 2>/dev/null)
    if [[ -n $name ]]; then
      [[ $comm == "${name:0:15}" ]] && echo "$pid"
    elif [[ $pcomm == orted ]]; then
      echo "$pid"
    fi
  done
}

# cluster_signal K SIG [NAME]: send SIG (KILL, STOP, CONT, 9, ...) to the ranks on host hK;
# fails when there is none
cluster_signal() {
  local k=$1 sig=$2 pids
  pids=$(cluster_pids "$k" "${3:-}")
  [[ -n $pids ]] || { _cl_err "no rank process on h$k"; return 1; }
  # shellcheck disable=SC2086
  kill -s "${sig#SIG}" $pids
}

# _cl_tagged STATE: pids of processes started by cluster_run for this cluster (mpirun, the
# agents, orted, the ranks: they all carry DPT_CLUSTER_STATE=STATE in their environment)
_cl_tagged() {
  local f pid
  # shellcheck disable=SC2013  # /proc paths have no spaces
  for f in $(grep -lzxF -- "DPT_CLUSTER_STATE=$1" /proc/[0-9]*/environ 2>/dev/null); do
    pid=${f#/proc/}; pid=${pid%/environ}
    [[ $pid == "$$" || $pid == "${BASHPID:-}" ]] || echo "$pid"
  done
}

# _cl_down_state STATE: removes the cluster of that state directory (and whatever its names
# say exists)
_cl_down_state() {
  local st=$1 prefix pids killed="" p ns
  prefix=$(basename "$st")
  # every process of the cluster: mpirun and the launchers in the root namespace, orted and the
  # ranks inside the namespaces (tagged, or found by ip netns pids), until none is left
  local nss
  nss=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-h[0-9]+$")
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(_cl_tagged "$st"; for ns in $nss; do ip netns pids "$ns" 2>/dev/null; done)
    [[ -z $pids ]] && break
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null
    killed="$killed $pids"
    sleep 0.1
  done
  [[ -n $pids ]] && _cl_err "processes still alive in $prefix: $pids"
  # SIGKILL takes effect asynchronously: wait until every killed process has exited (a zombie
  # waiting for its parent to reap it has)
  for _ in $(seq 100); do
    pids=''
    for p in $killed; do
      [[ -e /proc/$p ]] || continue
      [[ $(awk '/^State:/ {print $2}' "/proc/$p/status" 2>/dev/null) == [ZX] ]] || pids="$pids $p"
    done
    [[ -z $pids ]] && break
    sleep 0.1
  done
  [[ -n $pids ]] && _cl_err "killed but still exiting after 10 s in $prefix:$pids"
  for ns in $nss; do ip netns del "$ns" 2>/dev/null; done
  local dev
  for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^$prefix-(br|h[0-9]+)$"); do
    ip link del "$dev" 2>/dev/null
  done
  rm -rf "$st"
}

# cluster_down [PREFIX]: removes a cluster: its processes, namespaces, veths, bridge, state;
# without PREFIX the current one (and forgets it)
cluster_down() {
  if [[ $# -gt 0 ]]; then
    _cl_down_state "$(_cl_state_of "$1")"
    [[ $1 == "${CLUSTER_PREFIX:-}" ]] && unset CLUSTER_STATE
    return 0
  fi
  [[ -n ${CLUSTER_PREFIX:-} ]] || return 0
  _cl_down_state "${CLUSTER_STATE:-$(_cl_state_of "$CLUSTER_PREFIX")}"
  unset CLUSTER_STATE
  return 0
}

# cluster_down_mine: removes the current cluster and every cluster this process owns
cluster_down_mine() {
  local d
  cluster_down
  for d in "$DPT_STATE_ROOT"/*/; do
    [[ -f $d/owner && $(<"$d/owner") == "$$" ]] && _cl_down_state "${d%/}"
  done
  return 0
}

# cluster_trap: removes this script's clusters whenever it ends (EXIT, and INT/TERM/HUP turned
# into an exit so the EXIT trap runs; during the cleanup further signals are ignored, so a
# second Ctrl-C does not cut it short).  EXTRA_CLEANUP, if set, is run first.
cluster_trap() {
  trap 'trap "" INT TERM HUP; ${EXTRA_CLEANUP:-:}; cluster_down_mine' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
}

cluster_status() {
  local d
  for d in "$DPT_STATE_ROOT"/*/; do
    [[ -f $d/hosts ]] || continue
    echo "cluster $(basename "$d"): net $(<"$d/net").0/24, rate $(cat "$d/rate" 2>/dev/null), owner $(<"$d/owner")"
    _cl_hosts_listing "${d%/}" | sed 's/^/  /'
  done
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -u
  cmd=${1:-}; shift || true
  CLUSTER_PREFIX=${CLUSTER_PREFIX:-dpt-cli}
  case $cmd in
    up)
      CLUSTER_OWNER=0 cluster_up "$@" || { cluster_down; exit 1; }
      echo "cluster $CLUSTER_PREFIX: $CLUSTER_N hosts on $CLUSTER_NET.0/24, links $(<"$CLUSTER_STATE/rate")"
      echo "hostfile: $CLUSTER_HOSTFILE"
      _cl_hosts_listing "$CLUSTER_STATE" | sed 's/^/  /' ;;
    down) cluster_attach 2>/dev/null; cluster_down ;;
    run)
      cluster_attach || exit 1
      mapfile -t opts < <(cluster_mpirun_opts)
      DPT_CLUSTER_STATE=$CLUSTER_STATE exec mpirun "${opts[@]}" "$@" ;;
    shape) cluster_attach && cluster_shape "$@" ;;
    pids) cluster_attach && cluster_pids "$@" ;;
    signal) cluster_attach && cluster_signal "$@" ;;
    opts) cluster_attach && cluster_mpirun_opts ;;
    cpus) cluster_attach && cluster_cpus "$@" ;;
    status) cluster_status ;;
    gc) cluster_gc ;;
    *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
fi
