#!/usr/bin/env bash
# Accuracy recipes on Fashion-MNIST: dptrain and PyTorch 1.13 on the same recipe,
# final test accuracy and wall time side by side.  Full runs take long (resnet:
# 15 epochs); run it by hand, on an otherwise quiet machine if the times matter.
#
#   bench/accuracy.sh                        # mlp, cnn, resnet
#   MODELS="mlp cnn" bench/accuracy.sh       # pick models
#
# Recipes (identical flags for both; batch 128, SGD lr 0.05 momentum 0.9):
#   mlp     5 epochs, constant lr                                   target >= 87.5%
#   cnn     5 epochs, constant lr                                   target >= 91.0%
#   resnet  15 epochs, cosine schedule with 1 epoch (469 steps) of linear warmup,
#           weight decay 5e-4, random crop (pad 2) and horizontal flip   target >= 92.5%
# Both evaluate on the full 10k test set after every epoch (included in the wall time).
#
# Environment knobs:
#   MODELS="mlp cnn resnet"  THREADS=2  SEED=1  WORKERS=1 (dptrain data-parallel workers)
#   DPTRAIN=./build/dptrain  PY=/usr/bin/python3  RESULTS=bench/results
#   SKIP_DPTRAIN=1 / SKIP_PYTORCH=1   run one side only
#   EXTRA_ARGS="..."         appended to both command lines (e.g. --train-limit 5000 for a smoke test)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

MODELS=${MODELS:-"mlp cnn resnet"}
THREADS=${THREADS:-2}
SEED=${SEED:-1}
DPTRAIN=${DPTRAIN:-./build/dptrain}
PY=${PY:-/usr/bin/python3}
RESULTS=${RESULTS:-bench/results}
SKIP_DPTRAIN=${SKIP_DPTRAIN:-0}
SKIP_PYTORCH=${SKIP_PYTORCH:-0}
EXTRA_ARGS=${EXTRA_ARGS:-}

die() { echo "accuracy: error: $*" >&2; exit 1; }
note() { echo "accuracy: $*" >&2; }

if [ "$SKIP_DPTRAIN" != 1 ]; then
    [ -x "$DPTRAIN" ] || die "$DPTRAIN not found or not executable: build it first (make), set DPTRAIN=PATH, or SKIP_DPTRAIN=1"
fi
if [ "$SKIP_PYTORCH" != 1 ]; then
    "$PY" -c 'import torch, numpy' 2>/dev/null ||
        die "$PY cannot import torch and numpy (python3-torch python3-numpy), or SKIP_PYTORCH=1"
fi

# recipe MODEL -> "EPOCHS TARGET% FLAGS..."
recipe() {
    case $1 in
    mlp) echo "5 87.5" ;;
    cnn) echo "5 91.0" ;;
    resnet) echo "15 92.5 --schedule cosine --warmup 469 --weight-decay 5e-4 --crop-pad 2 --hflip" ;;
    *) die "unknown model $1 (expected mlp, cnn or resnet)" ;;
    esac
}

STAMP=$(date +%Y-%m-%d-%H%M%S)
LOGDIR=$RESULTS/accuracy-$STAMP
OUTMD=$RESULTS/accuracy-$STAMP.md
mkdir -p "$LOGDIR"
TABLE=$LOGDIR/table.tsv   # model side epochs target acc% time_s
: >"$TABLE"

# "ACC K" from the last "epoch K/E ... test acc XX.XX% ..." line: final test accuracy
# (percent) and the epoch it was measured after.
final_acc() { sed -n 's/^epoch \([0-9]*\)\/[0-9]* .*test acc \([0-9.]*\)%.*/\2 \1/p' "$1" | tail -n 1; }

run_side() {
    local side=$1 model=$2 epochs=$3 target=$4
    shift 4
    local common=(--model "$model" --epochs "$epochs" --batch 128 --lr 0.05 --momentum 0.9
                  --threads "$THREADS" --seed "$SEED" "$@")
    # shellcheck disable=SC2206
    local extra=($EXTRA_ARGS)
    local pin=(OMP_NUM_THREADS="$THREADS" OPENBLAS_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS")
    local cmd
    if [ "$side" = dptrain ]; then
        cmd=(env "${pin[@]}" "$DPTRAIN" train --workers "${WORKERS:-1}" "${common[@]}" "${extra[@]}" --progress lines)
    else
        cmd=(env "${pin[@]}" "$PY" bench/pytorch_train.py "${common[@]}" "${extra[@]}" --eval-every-epoch)
    fi
    local log=$LOGDIR/$model-$side.log
    note "$model / $side: ${cmd[*]}"
    local t0 t1 rc=0
    t0=$(date +%s.%N)
    { echo "# ${cmd[*]}"; "${cmd[@]}" 2>&1; } | tee "$log" | sed -n '/^epoch /s/^/    /p' >&2 || rc=$?
    t1=$(date +%s.%N)
    [ "$rc" = 0 ] || note "$model / $side: exited with status $rc (see $log)"
    local acc k
    read -r acc k <<<"$(final_acc "$log")" || true
    if [ -n "$acc" ] && [ "$k" != "$epochs" ]; then
        note "$model / $side: stopped after epoch $k of $epochs (see $log)"
        acc="$acc@$k"
    fi
    [ -n "$acc" ] || { note "$model / $side: no test accuracy found (see $log)"; tail -n 5 "$log" | sed 's/^/    /' >&2; acc=NA; }
    printf '%s\t%s\t%s\t%s\t%s\t%.1f\n' "$model" "$side" "$epochs" "$target" "$acc" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" >>"$TABLE"
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for model in $MODELS; do
    read -r epochs target flags <<<"$(recipe "$model")"
    # shellcheck disable=SC2086
    [ "$SKIP_DPTRAIN" = 1 ] || run_side dptrain "$model" "$epochs" "$target" $flags
    # shellcheck disable=SC2086
    [ "$SKIP_PYTORCH" = 1 ] || run_side pytorch "$model" "$epochs" "$target" $flags
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

{
    echo "# Fashion-MNIST accuracy: dptrain vs PyTorch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?')"
    echo
    echo "- date: $(date '+%Y-%m-%d %H:%M:%S %Z'); git \`$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)\`; $THREADS threads, seed $SEED"
    echo "- machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(nproc) CPUs; load average at start $LOAD0, at end $LOAD1"
    echo "- common recipe: batch 128, SGD lr 0.05 momentum 0.9; test accuracy on the full 10k test set after the last epoch${EXTRA_ARGS:+; extra flags \`$EXTRA_ARGS\`}"
    echo "- logs: \`$LOGDIR/\`"
    echo
    echo "| model | epochs | recipe | target | dptrain acc | PyTorch acc | dptrain time | PyTorch time |"
    echo "|---|---:|---|---:|---:|---:|---:|---:|"
    for model in $MODELS; do
        read -r epochs target flags <<<"$(recipe "$model")"
        get() { awk -F'\t' -v m="$model" -v s="$1" -v c="$2" '$1 == m && $2 == s { print $c }' "$TABLE" | tail -n 1; }
        cell_acc() {
            local a
            a=$(get "$1" 5)
            if [ -z "$a" ]; then echo "-"
            elif [ "$a" = NA ]; then echo "failed"
            elif [ "${a#*@}" != "$a" ]; then echo "${a%@*}% (only ${a#*@} epochs)"
            else awk -v a="$a" -v t="$target" 'BEGIN { printf "%.2f%% %s", a, (a >= t ? "(ok)" : "(below)") }'
            fi
        }
        cell_time() { local x; x=$(get "$1" 6); [ -n "$x" ] && echo "${x}s" || echo "-"; }
        echo "| $model | $epochs | \`${flags:-constant lr}\` | $target% | $(cell_acc dptrain) | $(cell_acc pytorch) | $(cell_time dptrain) | $(cell_time pytorch) |"
    done
} >"$OUTMD"
cat "$OUTMD"
note "report written to $OUTMD"
