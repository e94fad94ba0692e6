#!/usr/bin/env bash
# Memory per rank with the model split (issue 31, Q4): a gpt whose AdamW state does not fit one
# worker's memory budget fits it in 2 pipeline stages, one process each.
#
#   bench/pp_memory.sh                   # as root (the budget is a cgroup)
#   MODEL=gpt:layers=8,heads=8,dim=512,ctx=32 TOKENS=file.bin REPS=3 bench/pp_memory.sh
#
# Tokens: Debian's /usr/share/common-licenses through prepare-text (TOKENS= another token file).
# Runs, each under mpirun (Open MPI, shared memory), AdamW, global batch 8, 3 steps:
#   one      mpirun -np 1 dptrain train --workers 1           (the whole model in one process)
#   pp2      mpirun -np 2 dptrain train --workers 1 --pp 2 --micro-batches 2   (a stage each)
#   pp2out   pp2 with --out and --ckpt-every-steps 1: a checkpoint after every step, each stage
#            streaming its span to rank 0 (a pipeline across processes writes in the step)
#   base     the same process on a 1-block, 8-wide gpt: what a rank holds besides the model
#            (the binary, its libraries, Open MPI's segments)
# REPS times each, interleaved; medians (the peaks move by tens of MB from run to run: where the
# allocator places the evaluation's and the micro-batches' blocks).
# Each rank's peak RSS from /usr/bin/time (%M, KiB; reported in MB of 10^6 bytes, the plan's unit), against `dptrain plan`'s memory figure for the
# layout (one worker: weights, gradient, AdamW's two moments; a stage: its span's, and its
# micro-batches' activations as the layers measure them) plus the base.
#
# The budget: a cgroup v1 memory limit per rank (memory.limit_in_bytes; this machine has no
# swap), set halfway between one worker's peak and the larger stage's.  Under it one worker is
# killed by the kernel's OOM killer (exit 137); both stages finish, with the validation loss
# of the run without a budget.  Needs root and /sys/fs/cgroup/memory (cgroup v1); without them
# the budget runs are left out and the report says so.
# Output: bench/results/pp_memory-<stamp>.md and .tsv.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RESULTS=${RESULTS:-$ROOT/bench/results}
DPTRAIN=${DPTRAIN:-$ROOT/build/dptrain}
MODEL=${MODEL:-gpt:layers=8,heads=8,dim=512,ctx=32}
REPS=${REPS:-3}
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_start pp_memory
TSV=${OUTMD%.md}.tsv
command -v mpirun >/dev/null || die "needs mpirun (scripts/install-deps.sh installs Open MPI)"
[ -x "$DPTRAIN" ] || die "no $DPTRAIN: run make first"
if [ -z "${TOKENS:-}" ]; then # (Debian's license texts: the same bytes on every machine and commit)
    TOKENS=$WORK/tokens.bin
    "$DPTRAIN" prepare-text /usr/share/common-licenses --out "$TOKENS" >/dev/null || die "prepare-text failed"
fi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader,tcp)
ARGS=(--data "$TOKENS" --batch 8 --max-steps 3 --optim adamw --lr 1e-3 --seed 1 --progress none --backend mpi --workers 1)
CG=/sys/fs/cgroup/memory

# a rank's wrapper: its peak into $WORK/peak-<tag>-<rank>, inside a cgroup of LIMIT bytes if set
cat >"$WORK/rank.sh" <<'WRAP'
#!/usr/bin/env bash
r=${OMPI_COMM_WORLD_RANK:-0}
if [ -n "${LIMIT:-}" ]; then
    g=/sys/fs/cgroup/memory/dptrain-pp-memory-$PPID-$r
    mkdir -p "$g" && echo "$LIMIT" >"$g/memory.limit_in_bytes" && echo $$ >"$g/cgroup.procs"
fi
exec /usr/bin/time -f "%M %x" -o "$WORK/peak-$TAG-$r" "$@"
WRAP
chmod +x "$WORK/rank.sh"
run() { # TAG NP LIMIT ARGS...: the job's exit status; its log in $WORK/TAG.log
    local tag=$1 np=$2 limit=$3
    shift 3
    set +e
    WORK=$WORK TAG=$tag LIMIT=$limit "${MPIRUN[@]}" -x WORK -x TAG -x LIMIT -np "$np" "$WORK/rank.sh" "$DPTRAIN" train "$@" \
        >"$WORK/$tag.log" 2>&1
    local rc=$?
    set -e
    rmdir "$CG"/dptrain-pp-memory-* 2>/dev/null || true
    return $rc
}
peak_mb() { awk '{printf "%.1f", $1 * 1024 / 1e6}' "$WORK/peak-$1-$2"; } # (time's KiB, in MB as the plan's)
val_of() { sed -n 's/^done: .*val loss \([0-9.]*\).*/\1/p' "$WORK/$1.log"; }

# the median of REPS peaks, and their range: "median min-max"
med() { tr ' ' '\n' <<<"$*" | sort -n | awk '{v[NR] = $1} END {printf "%.1f %.1f-%.1f", v[int((NR + 1) / 2)], v[1], v[NR]}'; }
BASES= ONES= S0S= S1S= O0S= O1S=
for r in $(seq "$REPS"); do
    note "repetition $r of $REPS: base, one worker, 2 stages ($MODEL)"
    run base 1 "" --model gpt:layers=1,heads=1,dim=8,ctx=8 "${ARGS[@]}" || die "the base run failed: $(tail -2 "$WORK/base.log")"
    run one 1 "" --model "$MODEL" "${ARGS[@]}" || die "one worker failed: $(tail -2 "$WORK/one.log")"
    run pp2 2 "" --model "$MODEL" "${ARGS[@]}" --pp 2 --micro-batches 2 || die "2 stages failed: $(tail -2 "$WORK/pp2.log")"
    run pp2out 2 "" --model "$MODEL" "${ARGS[@]}" --pp 2 --micro-batches 2 --out "$WORK/out$r" --ckpt-every-steps 1 ||
        die "2 stages with --out failed: $(tail -2 "$WORK/pp2out.log")"
    BASES+=" $(peak_mb base 0)" ONES+=" $(peak_mb one 0)" S0S+=" $(peak_mb pp2 0)" S1S+=" $(peak_mb pp2 1)"
    O0S+=" $(peak_mb pp2out 0)" O1S+=" $(peak_mb pp2out 1)"
done
read -r BASE _ <<<"$(med $BASES)"
read -r ONE ONE_R <<<"$(med $ONES)"
read -r S0 S0_R <<<"$(med $S0S)"
read -r S1 S1_R <<<"$(med $S1S)"
read -r O0 O0_R <<<"$(med $O0S)"
read -r O1 O1_R <<<"$(med $O1S)"
# the plan's memory per worker (its weights, gradient, optimizer state and activations held):
# one worker as a 1-stage layout, each stage of the 2-stage one
stages() { "$DPTRAIN" plan --model "$MODEL" --optim adamw --batch 8 "$@" |
    sed -n 's/^  stage \([0-9]\) .*per worker \([0-9.]*\) MB (activations \([0-9.]*\) MB).*/\1 \2 \3/p'; }
PLAN1=$(stages --workers 1 --pp 1) PLANS=$(stages --workers 2 --pp 2 --micro-batches 2)
[ -n "$PLAN1" ] && [ -n "$PLANS" ] || die "dptrain plan gave no memory figure per stage (in MB)"
PV=$(awk '{print $2}' <<<"$PLAN1") ONE_ACT=$(awk '{print $3}' <<<"$PLAN1")
P0=$(awk '$1 == 0 {print $2}' <<<"$PLANS") P1=$(awk '$1 == 1 {print $2}' <<<"$PLANS")
A0=$(awk '$1 == 0 {print $3}' <<<"$PLANS") A1=$(awk '$1 == 1 {print $3}' <<<"$PLANS")

BUDGET=NA ONE_RC=NA PP_RC=NA PPB0=NA PPB1=NA VALB=NA PPO_RC=NA
if [ "$(id -u)" = 0 ] && [ -w "$CG" ]; then
    BUDGET=$(awk -v a="$ONE" -v b="$S0" -v c="$S1" 'BEGIN {m = b > c ? b : c; printf "%d", (a + m) / 2 * 1e6}')
    note "under a budget of $((BUDGET / 1000000)) MB a rank"
    run oneb 1 "$BUDGET" --model "$MODEL" "${ARGS[@]}" && ONE_RC=0 || ONE_RC=$?
    run ppb 2 "$BUDGET" --model "$MODEL" "${ARGS[@]}" --pp 2 --micro-batches 2 && PP_RC=0 || PP_RC=$?
    PPB0=$(peak_mb ppb 0) PPB1=$(peak_mb ppb 1) VALB=$(val_of ppb)
    run ppbout 2 "$BUDGET" --model "$MODEL" "${ARGS[@]}" --pp 2 --micro-batches 2 --out "$WORK/outb" \
        --ckpt-every-steps 1 && PPO_RC=0 || PPO_RC=$?
else
    note "not root, or no cgroup v1 memory controller at $CG: the budget runs are left out"
fi
printf 'run\trank\tpeak_mb\tplan_mb\tbase_mb\n' >"$TSV"
printf 'one\t0\t%s\t%s\t%s\n' "${ONES# }" "$PV" "${BASES# }" >>"$TSV"
printf 'pp2\t0\t%s\t%s\t%s\n' "${S0S# }" "$P0" "${BASES# }" >>"$TSV"
printf 'pp2\t1\t%s\t%s\t%s\n' "${S1S# }" "$P1" "${BASES# }" >>"$TSV"
printf 'pp2out\t0\t%s\t%s\t%s\n' "${O0S# }" "$P0" "${BASES# }" >>"$TSV"
printf 'pp2out\t1\t%s\t%s\t%s\n' "${O1S# }" "$P1" "${BASES# }" >>"$TSV"
printf 'budget_one\t0\tNA\t%s\texit %s\n' "$BUDGET" "$ONE_RC" >>"$TSV"
printf 'budget_pp2\t0\t%s\t%s\texit %s\n' "$PPB0" "$BUDGET" "$PP_RC" >>"$TSV"
printf 'budget_pp2\t1\t%s\t%s\texit %s\n' "$PPB1" "$BUDGET" "$PP_RC" >>"$TSV"
printf 'budget_pp2out\t0\tNA\t%s\texit %s\n' "$BUDGET" "$PPO_RC" >>"$TSV"
ratio() { awk -v m="$1" -v b="$BASE" -v p="$2" 'BEGIN {printf "%.2f", (m - b) / p}'; }
{
    echo "# Memory per rank: one worker against 2 pipeline stages"
    echo
    echo "CPU: $CPU_MODEL, $NCPU CPUs (load at start $LOAD1); dptrain $GIT_REV; $MODEL, AdamW, global batch 8, 3 steps, under mpirun."
    echo
    echo "$(grep '^dptrain: model' "$WORK/one.log" | head -1 | sed 's/^dptrain: //')"
    echo
    echo "$(grep '^pipeline:' "$WORK/pp2.log" | head -1)"
    echo
    echo "Peaks: medians of $REPS repetitions (their range beside them)."
    echo
    echo "| run | rank | peak RSS (MB) | less the base $BASE MB | plan (MB) | (peak − base) / plan |"
    echo "|---|---:|---:|---:|---:|---:|"
    echo "| one worker | 0 | $ONE ($ONE_R) | $(awk -v a="$ONE" -v b="$BASE" 'BEGIN {printf "%.1f", a - b}') | $PV (activations $ONE_ACT) | $(ratio "$ONE" "$PV") |"
    echo "| 2 stages | 0 | $S0 ($S0_R) | $(awk -v a="$S0" -v b="$BASE" 'BEGIN {printf "%.1f", a - b}') | $P0 (activations $A0) | $(ratio "$S0" "$P0") |"
    echo "| 2 stages | 1 | $S1 ($S1_R) | $(awk -v a="$S1" -v b="$BASE" 'BEGIN {printf "%.1f", a - b}') | $P1 (activations $A1) | $(ratio "$S1" "$P1") |"
    echo "| 2 stages, a checkpoint every step | 0 | $O0 ($O0_R) | $(awk -v a="$O0" -v b="$BASE" 'BEGIN {printf "%.1f", a - b}') | $P0 | $(ratio "$O0" "$P0") |"
    echo "| 2 stages, a checkpoint every step | 1 | $O1 ($O1_R) | $(awk -v a="$O1" -v b="$BASE" 'BEGIN {printf "%.1f", a - b}') | $P1 | $(ratio "$O1" "$P1") |"
    echo
    echo "The base: the same process on a 1-block, 8-wide gpt (the binary, its libraries, Open MPI): $BASE MB."
    echo "The larger stage against one worker: $(awk -v a="$S0" -v b="$S1" -v o="$ONE" 'BEGIN {m = a > b ? a : b; printf "%.2f", m / o}')x."
    echo
    if [ "$BUDGET" = NA ]; then
        echo "The budget runs were left out (not root, or no cgroup v1 memory controller)."
    else
        echo "Under a cgroup memory limit of $((BUDGET / 1000000)) MB a rank (memory.limit_in_bytes, no swap):"
        echo "one worker exits $ONE_RC ($( [ "$ONE_RC" = 137 ] && echo "killed by the OOM killer" || echo "not killed")); 2 stages exit $PP_RC,"
        echo "peaks $PPB0 and $PPB1 MB, validation loss $VALB (without the budget: $(val_of pp2); one worker: $(val_of one))."
        echo "2 stages with --out and a checkpoint every step exit $PPO_RC under the same limit."
    fi
    echo
    echo "Raw rows: $(basename "$TSV")."
} >"$OUTMD"
cat "$OUTMD"
