#!/usr/bin/env bash
# Two builds side by side: samples/s of each one's throughput line, interleaved run by run, medians
# of REPS, for a list of configurations MODEL_wPtT (P workers x T threads; MODEL mlp, cnn, resnet
# or gpt, gpt being gpt:layers=4,heads=4,dim=128,ctx=64 on the fortunes tokens).
#   OLD=/path/to/dptrain-before NEW=build/dptrain bash bench/ab.sh        # the four models, 1 x 1
#   CONFIGS="cnn_w2t1 gpt_w1t2" NAME=gemm_tiles OLD=... bash bench/ab.sh
# Writes bench/results/NAME-<date>.txt (NAME=ab by default).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck disable=SC2034 # (lib.sh reads $ROOT)
ROOT=$PWD
RESULTS=${RESULTS:-bench/results}
OLD=${OLD:?OLD=path of the dptrain to compare against}
NEW=${NEW:-build/dptrain}
REPS=${REPS:-3}
NAME=${NAME:-ab}
CONFIGS=${CONFIGS:-"mlp_w1t1 cnn_w1t1 resnet_w1t1 gpt_w1t1"}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
# shellcheck disable=SC2034 # (lib.sh's bench_tokens runs $DPTRAIN)
DPTRAIN=$NEW
WORK=$(mktemp -d /tmp/dptrain-ab.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
TOKENS=''
die() { echo "$NAME: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }
[ -x "$OLD" ] || die "OLD=$OLD is not an executable"
[ -x "$NEW" ] || die "NEW=$NEW is not an executable (build it: make)"
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts "$NAME"
[[ $CONFIGS == *gpt* ]] && bench_tokens
opts_of() { # CONFIG: the train options, into OPTS
  [[ $1 =~ ^([a-z]+)_w([1-9][0-9]*)t([1-9][0-9]*)$ ]] || die "bad configuration '$1' (expected MODEL_wPtT, e.g. cnn_w2t1)"
  local model=${BASH_REMATCH[1]} p=${BASH_REMATCH[2]} t=${BASH_REMATCH[3]}
  # shellcheck disable=SC2054 # (gpt's commas are its model spec's)
  case $model in
  mlp) OPTS=(--model mlp --data "$DATA" --batch 128 --max-steps 300) ;;
  cnn) OPTS=(--model cnn --data "$DATA" --batch 128 --max-steps 120) ;;
  resnet) OPTS=(--model resnet --data "$DATA" --batch 128 --max-steps 30) ;;
  gpt) OPTS=(--model gpt:layers=4,heads=4,dim=128,ctx=64 --data "$TOKENS" --batch 32 --optim adamw --lr 1e-3 --max-steps 80) ;;
  *) die "unknown model '$model' in '$1' (mlp, cnn, resnet, gpt)" ;;
  esac
  OPTS+=(--workers "$p" --threads "$t")
}
for c in $CONFIGS; do opts_of "$c"; done # (refuses a bad list before any run)
run() { # run BIN CONFIG: samples/s, or NA (with the run's last lines on stderr) when it gave none
  opts_of "$2"
  local out v
  out=$("$1" train "${OPTS[@]}" --epochs 1 --test-limit 200 --progress none 2>&1)
  v=$(sed -n 's/^throughput: \([0-9.]*\) samples.*/\1/p' <<<"$out")
  if [ -z "$v" ]; then
    note "$1 $2: no throughput line; its last lines:"
    tail -n 3 <<<"$out" >&2
    v=NA
  fi
  echo "$v"
}
: >"$WORK/raw"
for rep in $(seq "$REPS"); do
  for c in $CONFIGS; do
    echo "$c old $rep $(run "$OLD" "$c")" >>"$WORK/raw"
    echo "$c new $rep $(run "$NEW" "$c")" >>"$WORK/raw"
  done
done
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
{
  echo "# OLD=$OLD NEW=$NEW CONFIGS=\"$CONFIGS\" bash bench/ab.sh (REPS=$REPS) at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  printf "%-12s %10s %10s %8s  %s\n" config old new change "all runs (old; new)"
  for c in $CONFIGS; do
    o=$(awk -v k="$c" '$1 == k && $2 == "old" {print $4}' "$WORK/raw" | median)
    n=$(awk -v k="$c" '$1 == k && $2 == "new" {print $4}' "$WORK/raw" | median)
    printf "%-12s %10s %10s %8s  %s; %s\n" "$c" "$o" "$n" "$(awk -v a="$n" -v b="$o" 'BEGIN {if (a + 0 > 0 && b + 0 > 0) printf "%+.1f%%", 100 * (a / b - 1); else printf "n/a"}')" \
      "$(awk -v k="$c" '$1 == k && $2 == "old" {printf "%s ", $4}' "$WORK/raw")" "$(awk -v k="$c" '$1 == k && $2 == "new" {printf "%s ", $4}' "$WORK/raw")"
  done
} | tee "$RESULTS/$NAME-$STAMP.txt"
echo "wrote $RESULTS/$NAME-$STAMP.txt" >&2
