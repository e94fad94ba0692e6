#!/usr/bin/env bash
# What --deterministic costs (issue 32, S4: target >= 0.9x of ordinary training with the default
# settings): samples/s of the throughput line at 2 workers x 1 thread, side by side, interleaved,
# REPS repetitions, for mlp, cnn and gpt:
#   dp2   ordinary training (NEW)
#   det   --deterministic, the default chunk (NEW)
#   old   --deterministic with OLD, a build before a change (optional): the change's own gain
# The ratio det / dp2 is the median of the per-repetition ratios [min..max].
#   bash bench/det_cost.sh                                   # about 3 minutes
#   OLD=/path/to/dptrain-before bash bench/det_cost.sh
# Writes bench/results/det_cost-<date>.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RESULTS=${RESULTS:-bench/results}
OLD=${OLD:-}
NEW=${NEW:-build/dptrain}
REPS=${REPS:-5}
MODELS=${MODELS:-mlp cnn gpt}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
DPTRAIN=$NEW   # (bench_tokens runs it)
export DPTRAIN
TOKENS=''
GPT=gpt:layers=4,heads=4,dim=128,ctx=64
# shellcheck disable=SC2034 # (lib.sh reads $ROOT)
ROOT=$PWD
# shellcheck source=lib.sh
source bench/lib.sh
bench_start det_cost
[[ $MODELS == *gpt* ]] && bench_tokens
run() { # run BIN MODEL [more options]: samples/s
  local bin=$1 m=$2 opts=()
  shift 2
  case $m in
  mlp) opts=(--model mlp --data "$DATA" --batch 128 --lr 0.05 --momentum 0.9 --max-steps 600) ;;
  cnn) opts=(--model cnn --data "$DATA" --batch 128 --lr 0.05 --momentum 0.9 --max-steps 150) ;;
  gpt) opts=(--model "$GPT" --data "$TOKENS" --batch 32 --optim adamw --lr 1e-3 --max-steps 100) ;;
  esac
  "$bin" train "${opts[@]}" "$@" --workers 2 --threads 1 --epochs 100 --test-limit 100 --progress none 2>&1 |
    sed -n 's/^throughput: \([0-9.]*\) samples.*/\1/p'
}
variants=(dp2 det)
[[ -n $OLD ]] && variants+=(old)
: >"$WORK/raw"
for rep in $(seq "$REPS"); do
  for m in $MODELS; do
    for v in "${variants[@]}"; do
      case $v in
      dp2) s=$(run "$NEW" "$m") ;;
      det) s=$(run "$NEW" "$m" --deterministic) ;;
      old) s=$(run "$OLD" "$m" --deterministic) ;;
      esac
      echo "$m $v $rep ${s:-NA}" >>"$WORK/raw"
    done
  done
done
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
ratio() { # ratio M A B: median [min..max] of A/B over the repetitions
  awk -v m="$1" -v a="$2" -v b="$3" '$1 == m && $2 == a {x[$3] = $4} $1 == m && $2 == b {y[$3] = $4}
    END {for (r in x) if (r in y && y[r] > 0) print x[r] / y[r]}' "$WORK/raw" | sort -g |
    awk '{a[NR] = $1} END {if (NR) printf "%.2fx [%.2f..%.2f]", a[int((NR + 1) / 2)], a[1], a[NR]; else printf "n/a"}'
}
{
  echo "# ${OLD:+OLD=$OLD }bash bench/det_cost.sh (REPS=$REPS MODELS=\"$MODELS\") at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  echo "# samples/s at 2 workers x 1 thread, medians; ratios: medians of the per-repetition ratios [min..max]"
  printf "%-5s %10s %10s %10s  %-24s %-24s\n" model dp2 det old "det / dp2" "det / old det"
  for m in $MODELS; do
    d=$(awk -v k="$m" '$1 == k && $2 == "dp2" {print $4}' "$WORK/raw" | median)
    t=$(awk -v k="$m" '$1 == k && $2 == "det" {print $4}' "$WORK/raw" | median)
    o=$(awk -v k="$m" '$1 == k && $2 == "old" {print $4}' "$WORK/raw" | median)
    printf "%-5s %10s %10s %10s  %-24s %-24s\n" "$m" "$d" "$t" "${o:--}" "$(ratio "$m" det dp2)" \
      "$([[ -n $OLD ]] && ratio "$m" det old || echo -)"
  done
  echo "# raw: model variant repetition samples/s"
  cat "$WORK/raw"
} | tee "$RESULTS/det_cost-$STAMP.txt"
echo "wrote $RESULTS/det_cost-$STAMP.txt" >&2
