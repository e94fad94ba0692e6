# shellcheck shell=bash
# Shared by the bench scripts (sourced, not run): the facts every report prints beside its
# figures, and the CPU time of a timed command.

# bench_facts NAME: STAMP (date-time), OUTMD ($RESULTS/NAME-STAMP.md), LOAD1 (load average now),
# CPU_MODEL (lscpu's model name, as /proc/cpuinfo has it), NCPU, GIT_REV (of $ROOT).
# shellcheck disable=SC2034  # the sourcing script prints them
bench_facts() {
    mkdir -p "$RESULTS"
    STAMP=$(date +%Y-%m-%d-%H%M%S)
    OUTMD=$RESULTS/$1-$STAMP.md
    LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
    CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
    NCPU=$(nproc)
    GIT_REV=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)
}

# bench_start NAME: what a script starts with: WORK (a temporary folder, removed at exit), die
# and note (messages on stderr naming the script), then bench_facts NAME.
bench_start() {
    BENCH_NAME=$1
    WORK=$(mktemp -d "/tmp/dptrain-$1.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
    die() { echo "$BENCH_NAME: $*" >&2; exit 1; }
    note() { echo "# $*" >&2; }
    bench_facts "$1"
}

# dptrain_sps FILE: the samples/s of dptrain's last `throughput:` line in FILE; empty when
# there is none.
dptrain_sps() {
    sed -n 's/^throughput: *\([0-9][0-9.eE+-]*\) *samples\/s.*/\1/p' "$1" | tail -n 1
}

# cpu_busy FILE: the cores a command kept busy, (user + sys) / wall, from the
# `/usr/bin/time -f '%e %U %S' -o FILE` line it left; NA without one.
cpu_busy() {
    local el us sy _
    read -r el us sy _ <"$1" 2>/dev/null || true
    awk -v e="${el:-0}" -v u="${us:-0}" -v s="${sy:-0}" 'BEGIN { if (e > 0) printf "%.2f", (u + s) / e; else print "NA" }'
}

# bench_tokens: TOKENS, the default corpus (the fortunes packages) prepared into $WORK by
# `$DPTRAIN prepare-text` unless TOKENS already names a token file; dies (the script's die)
# when it cannot be made or read.
bench_tokens() {
    if [ -z "$TOKENS" ]; then
        TOKENS=$WORK/fortunes.bin
        "$DPTRAIN" prepare-text --out "$TOKENS" >"$WORK/prepare.log" 2>&1 ||
            { cat "$WORK/prepare.log" >&2; die "dptrain prepare-text failed (the fortunes packages: scripts/install-deps.sh)"; }
        note "$(cat "$WORK/prepare.log")"
    fi
    [ -r "$TOKENS" ] || die "token file $TOKENS not readable"
}

# step_throughput FILE: "samples/s steps" from a run's metrics.jsonl, over the step records
# after the WARMUP-th (sum of samples / sum of step_s); "NA 0" without any.  Uses $PY, $WARMUP.
step_throughput() {
    "$PY" - "$1" "$WARMUP" <<'PYEOF'
import json, sys
n = t = k = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") == "step" and r["step"] > int(sys.argv[2]):
        n += r["samples"]; t += r["step_s"]; k += 1
print(f"{n / t:.1f} {k}" if t > 0 else "NA 0")
PYEOF
}

# bench_interleaved REPS NAME...: the sourcing script's `run_one NAME REP` for every NAME in
# each repetition, side by side, the order rotated by one from a repetition to the next (so
# no variant always runs first or right after the same one); the script's note per repetition.
bench_interleaved() {
    local reps=$1 rep i
    shift
    local names=("$@")
    for rep in $(seq 1 "$reps"); do
        note "repetition $rep/$reps"
        for i in $(seq 0 $(($# - 1))); do
            run_one "${names[$(((i + rep - 1) % $#))]}" "$rep"
        done
    done
}
