#!/usr/bin/env bash
# Open MPI "rsh agent" for the namespace cluster of tests/netns/cluster.sh: it stands in for ssh.
#
# Open MPI (plm rsh) runs it like ssh:   rsh-agent.sh [ssh options] HOST WORD...
# and expects, as with ssh, that the WORDs joined by spaces are run by a shell on HOST (the words
# carry shell quoting meant for that remote shell, e.g. -mca orte_hnp_uri "1234.0;tcp://...").
# HOST is a name or IP address from the cluster's hostfile; the agent looks it up in the cluster's
# state (DPT_CLUSTER_STATE, set by cluster_run; without it every cluster under DPT_STATE_ROOT is
# searched) and runs
#     taskset -c CPUS ip netns exec NS unshare --uts sh -c 'hostname NAME; exec sh -c "$WORDS"'
# i.e. in the host's network namespace, on the host's own cores (CPUS from the cluster's cpus
# file; orted and the ranks it starts inherit the set, since cluster.sh runs mpirun with
# --bind-to none) and, like a separate machine, with its own host name.
# Like ssh (which gives the remote command a fresh login environment), the command starts with
# a small environment: PATH, HOME, LANG, the cluster tag DPT_CLUSTER_STATE (cluster_down uses it
# to find every process of the cluster) and whatever DPT_AGENT_ENV names (space-separated
# variable names to pass on).  DPT_AGENT_LOG=FILE appends every call's arguments to FILE.
set -u
if [[ -n ${DPT_AGENT_LOG:-} ]]; then
  { printf 'agent:'; printf ' [%s]' "$@"; printf '\n'; } >>"$DPT_AGENT_LOG" 2>/dev/null
fi
# skip ssh options: the ones that take an argument (separate or attached), then plain flags
while [[ $# -gt 0 ]]; do
  case $1 in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -[bcDEeFIiJLlmOopQRSWw]?*) shift ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [[ $# -lt 2 ]]; then
  echo "rsh-agent: usage: rsh-agent.sh [ssh options] HOST COMMAND..." >&2
  exit 255
fi
host=${1#*@}   # user@host: the user part means nothing here
shift
cmd="$*"

root=${DPT_STATE_ROOT:-/run/dpt-netns}
if [[ -n ${DPT_CLUSTER_STATE:-} ]]; then files=("$DPT_CLUSTER_STATE/hosts"); else files=("$root"/*/hosts); fi
ns='' name='' st=''
for f in "${files[@]}"; do
  [[ -r $f ]] || continue
  # hosts: one line per host "NAME IP NAMESPACE VETH"
  while read -r n ip nsname _; do
    if [[ $host == "$n" || $host == "$ip" ]]; then ns=$nsname name=$n; break 2; fi
  done <"$f"
done
if [[ -z $ns ]]; then
  echo "rsh-agent: unknown host '$host' (not in ${files[*]})" >&2
  exit 255
fi
# cpus: one line per host "NAME LIST" (written by cluster_up); a cluster without it (made by an
# older cluster.sh) runs unpinned
st=$(dirname "$f")   # f: the hosts file that named the host
pin=()
cpus=$(awk -v h="$name" '$1 == h {print $2}' "$st/cpus" 2>/dev/null)
[[ -n $cpus ]] && pin=(taskset -c "$cpus")

envs=(PATH="${PATH:-/usr/local/bin:/usr/bin:/bin}" HOME="${HOME:-/root}" LANG=C)
[[ -n ${DPT_CLUSTER_STATE:-} ]] && envs+=(DPT_CLUSTER_STATE="$DPT_CLUSTER_STATE")
for v in ${DPT_AGENT_ENV:-}; do
  [[ -n ${!v+x} ]] && envs+=("$v=${!v}")
done
# shellcheck disable=SC2016  # $1 and $2 belong to the inner shell
exec env -i "${envs[@]}" "${pin[@]}" ip netns exec "$ns" unshare --uts -- \
  sh -c 'hostname "$1" || exit 255; exec sh -c "$2"' rsh-agent "$name" "$cmd"
