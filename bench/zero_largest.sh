#!/usr/bin/env bash
# The largest gpt that trains at each ZeRO stage with 2 workers under a memory limit (issue 13,
# "The largest model"; docs/results.md).
#
# The model family: gpt:layers=LAYERS,heads=D/64,dim=D,ctx=CTX (vocab 256, the fortunes corpus),
# D on a grid of STEP; its parameters are exactly
#     psi(D) = (256 + CTX) D + LAYERS (12 D^2 + 13 D) + 2 D
# (tok, pos; per block ln1, qkv, proj, ln2, fc, fc_out; ln_f: src/nn/models.c).  A run is
# `dptrain train --workers 2 --zero Z --optim adamw` for STEPS steps of BATCH windows (no
# evaluation: --max-steps ends it first), and it FITS when it exits 0 with a peak resident set
# (/usr/bin/time's %M: the process, so both thread workers) of at most LIMIT_MIB.
#
# Why a measured peak and not an enforced limit: `prlimit --as` caps address space, and stages 2
# and 3 keep their slabs' address space while giving the pages back (madvise, src/ddp/zero.c), so
# it would charge them for memory they do not hold; this machine has no swap, so the resident peak
# is what a machine of LIMIT_MIB must hold.  Over the limit, the watcher in run() stops the run at
# once, so a limit near the machine's own memory is safe to probe (fresh pages fault in at ~0.3
# GB/s here, so a run of ~20 GB takes minutes).
# Per stage: (1) two calibration runs (D = CAL) fit peak = a + b psi (b: bytes per parameter of
# the process, a: code, data, buffers); (2) the fit predicts the largest D on the grid within
# LIMIT_MIB, which is run, and then the grid is walked up (while it fits) or down (until it fits),
# at most WALK runs, so the reported width is measured, with the next width up shown not to fit;
# (3) the same fit, extrapolated, gives the largest width within the machine's MemTotal (predicted,
# not run).
#   bash bench/zero_largest.sh                       # about 5 minutes (loaded: more)
#   LIMIT_MIB=2048 STAGES="0 3" bash bench/zero_largest.sh
#   LIMIT_MIB=20480 LAYERS=12 CAL="192 320" BATCH=2 bash bench/zero_largest.sh   # the machine: ~1 hour
#   ... STAGES="1 3" FROM="1:2432 3:2624" ...   # resume the walks of an interrupted run at those widths
# Writes bench/results/zero_largest-<date>.txt (needs `make`).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck disable=SC2034  # bench_facts (bench/lib.sh) reads it
ROOT=$PWD
LIMIT_MIB=${LIMIT_MIB:-1024}
LAYERS=${LAYERS:-4}
CTX=${CTX:-32}
BATCH=${BATCH:-4}
STEPS=${STEPS:-2}
STEP=${STEP:-64} # a multiple of 64 (heads = D / 64)
CAL=${CAL:-"256 448"}
STAGES=${STAGES:-"0 1 2 3"}
WALK=${WALK:-4}
RESERVE_MIB=${RESERVE_MIB:-512}
RESULTS=${RESULTS:-bench/results}
DPTRAIN=${DPTRAIN:-build/dptrain}
FROM=${FROM:-} # "Z:D ...": start stage Z's walk at width D instead of the fit's prediction
TOKENS=${TOKENS:-}
[[ -x $DPTRAIN && -x /usr/bin/time ]] || { echo "build $DPTRAIN first (make); needs /usr/bin/time" >&2; exit 1; }
WORK=$(mktemp -d /tmp/zero_largest.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
die() { echo "zero_largest: $*" >&2; exit 1; }
note() { echo "# $*"; }
# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_facts zero_largest
OUT=$RESULTS/zero_largest-$STAMP.txt
LIMIT_KB=$((LIMIT_MIB * 1024))
MEM_KB=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)

psi() { awk -v d="$1" -v L="$LAYERS" -v T="$CTX" 'BEGIN { printf "%.0f", (256 + T) * d + L * (12 * d * d + 13 * d) + 2 * d }'; }

# run D Z: one run; prints "D Z psi peak_kB wall_s rc".  A watcher polls the run's peak resident
# set (VmHWM) every 0.2 s and stops it as soon as it passes LIMIT_MIB: such a run does not fit, and
# it is reported with exit 137 and the peak it had reached (so a width above the machine is shown
# not to fit without the kernel's OOM killer choosing whom to kill).  It also stops the run, as an
# error (exit 125, the script then stops), when the machine's MemAvailable falls under RESERVE_MIB:
# then other jobs hold memory the run would need, and no verdict on the width can be drawn.
run() {
    local d=$1 z=$2 rc tpid pid hwm avail killed=0
    /usr/bin/time -f '%M %e' -o "$WORK/time" "$DPTRAIN" train --model "gpt:layers=$LAYERS,heads=$((d / 64)),dim=$d,ctx=$CTX" \
        --data "$TOKENS" --workers 2 --zero "$z" --batch "$BATCH" --max-steps "$STEPS" --train-limit $((BATCH * STEPS)) \
        --test-limit 8 --optim adamw --lr 1e-3 --progress none >"$WORK/run.log" 2>&1 &
    tpid=$!
    while kill -0 "$tpid" 2>/dev/null; do
        sleep 0.2
        pid=$(pgrep -P "$tpid" | head -n 1)
        [[ -n $pid ]] || continue
        hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
        avail=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
        if [[ -n $hwm && $hwm -gt $LIMIT_KB ]]; then
            killed=137; kill -9 "$pid" 2>/dev/null; echo "$hwm" >"$WORK/hwm"
        elif [[ $avail -lt $((RESERVE_MIB * 1024)) ]]; then
            killed=125; kill -9 "$pid" 2>/dev/null
        fi
    done
    wait "$tpid"; rc=$?
    # (the last line: time writes "Command terminated by signal N" above it)
    read -r kb wall < <(tail -n 1 "$WORK/time" 2>/dev/null) || { kb=0; wall=0; }
    if [[ $killed -eq 137 ]]; then
        rc=137 kb=$(cat "$WORK/hwm")
        echo "# D=$d --zero $z stopped at a peak of $((kb / 1024)) MiB, over the limit" >&2
    elif [[ $killed -eq 125 ]]; then
        echo "# D=$d --zero $z stopped: MemAvailable under $RESERVE_MIB MiB (other jobs); no verdict" >&2
        rc=125
    elif [[ $rc -ne 0 ]]; then
        echo "# D=$d --zero $z failed (exit $rc): $(grep -m1 'error' "$WORK/run.log")" >&2
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$d" "$z" "$(psi "$d")" "$kb" "$wall" "$rc"
    [[ $rc -ne 125 ]]
}
# widest A B BYTES: the largest grid width D whose predicted peak A + B psi(D) is within BYTES
widest() {
    awk -v a="$1" -v b="$2" -v lim="$3" -v s="$STEP" -v L="$LAYERS" -v T="$CTX" 'BEGIN {
        d = s
        while (1) { n = d + s; p = (256 + T) * n + L * (12 * n * n + 13 * n) + 2 * n
                    if (b <= 0 || a + b * p > lim || n > 65536) break; d = n }
        print d }'
}
fits() { awk -F'\t' -v lim="$LIMIT_KB" '{ exit !($6 == 0 && $4 > 0 && $4 <= lim) }' <<<"$1"; }

{
    echo "# bash bench/zero_largest.sh (LIMIT_MIB=$LIMIT_MIB LAYERS=$LAYERS CTX=$CTX BATCH=$BATCH STEPS=$STEPS STEP=$STEP CAL=\"$CAL\" FROM=\"$FROM\" DPTRAIN=$DPTRAIN), git $GIT_REV"
    echo "# CPU: $CPU_MODEL, $NCPU cores (lscpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1));" \
         "load average at the start: $LOAD1; MemTotal $MEM_KB kB"
    bench_tokens
    echo "# tokens: $TOKENS"
    echo "# model gpt:layers=$LAYERS,heads=D/64,dim=D,ctx=$CTX; dptrain train --workers 2 --zero Z --batch $BATCH --max-steps $STEPS --optim adamw"
    echo "# runs: D, zero, psi, peak_rss_kB, wall_s, exit"
    summary=()
    for z in $STAGES; do
        cal=()
        for d in $CAL; do
            line=$(run "$d" "$z") || die "no verdict"; printf 'cal\t%s\n' "$line"; cal+=("$line")
        done
        # fit peak_bytes = a + b psi through the two calibration runs
        read -r a b < <(printf '%s\n%s\n' "${cal[0]}" "${cal[1]}" | awk -F'\t' '
            NR == 1 { p1 = $3; r1 = $4 * 1024 } NR == 2 { p2 = $3; r2 = $4 * 1024 }
            END { b = (r2 - r1) / (p2 - p1); printf "%.0f %.4f\n", r1 - b * p1, b }')
        pred=$(widest "$a" "$b" $((LIMIT_KB * 1024)))
        for f in $FROM; do [[ ${f%%:*} == "$z" ]] && pred=${f#*:}; done
        best=0 bestline="" over=""
        line=$(run "$pred" "$z") || die "no verdict"; printf 'walk\t%s\n' "$line"
        if fits "$line"; then  # up the grid while it fits
            best=$pred bestline=$line d=$((pred + STEP))
            for ((i = 1; i < WALK; i++)); do
                line=$(run "$d" "$z") || die "no verdict"; printf 'walk\t%s\n' "$line"
                if fits "$line"; then best=$d bestline=$line d=$((d + STEP)); else over=$line; break; fi
            done
        else                   # down the grid until it fits
            over=$line d=$((pred - STEP))
            for ((i = 1; i < WALK && d >= STEP; i++)); do
                line=$(run "$d" "$z") || die "no verdict"; printf 'walk\t%s\n' "$line"
                if fits "$line"; then best=$d bestline=$line; break; else over=$line d=$((d - STEP)); fi
            done
        fi
        mach=$(widest "$a" "$b" $((MEM_KB * 1024)))
        summary+=("$(awk -F'\t' -v z="$z" -v a="$a" -v b="$b" -v pred="$pred" -v best="$best" -v bl="${bestline:-}" \
            -v over="$over" -v mach="$mach" -v mpsi="$(psi "$mach")" 'BEGIN {
            split(bl, x, "\t"); split(over, y, "\t")
            printf "%s\t%.1f\t%.1f\t%s\t%s\t%s\t%.1f\t%s\t%s\t%s\t%.2f\n", z, b, a / 1048576, pred, best, x[3] / 1e6, x[4] / 1024,
                   y[1] == "" ? "-" : y[1], y[4] == "" ? "-" : sprintf("%.1f", y[4] / 1024), mach, mpsi / 1e9 }')")
    done
    echo
    echo "## largest width per stage, 2 workers, limit $LIMIT_MIB MiB (peak RSS; MiB = 2^20 bytes)"
    printf 'zero\tbytes_per_param\tfixed_MiB\tpredicted_D\tlargest_D_run\tpsi_M\tits_peak_MiB\tnext_D\tnext_peak_MiB\tD_at_MemTotal\tpsi_B_at_MemTotal\n'
    printf '%s\n' "${summary[@]}"
} 2>&1 | tee "$OUT"
echo "wrote $OUT"
