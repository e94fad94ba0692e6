#!/usr/bin/env bash
# What position-independent library objects cost the CLI (make install's libdptrain.so needs
# them, and libdptrain.a is made of the same objects): the CLI built as `make` builds it (PIC) and
# with `make PIC=` (no -fPIC), each into a build folder of its own, then
# `dptrain train --model mlp --epochs 1 --progress none` on 1 and 2 workers, the two builds
# alternating run by run (the first of each pair swapped every repetition); medians of wall
# time, user CPU time and the samples/s that the CLI reports.
#   bash bench/pic.sh                  # about 5 minutes (REPS=15)
#   REPS=25 bash bench/pic.sh
# Writes bench/results/pic-<date>.md.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=${REPS:-15}
RESULTS=${RESULTS:-bench/results}
J=${JOBS:-2}
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts pic
WORK=$(mktemp -d /tmp/dptrain-pic.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
make -s -j"$J" BUILD=build-bench-pic build-bench-pic/dptrain || exit 1
make -s -j"$J" PIC= BUILD=build-bench-nopic build-bench-nopic/dptrain || exit 1
grep -q -- -fPIC build-bench-pic/.cflags && ! grep -q -- -fPIC build-bench-nopic/.cflags ||
  { echo "the two builds do not differ in -fPIC" >&2; exit 1; }
RAW=$WORK/raw
for rep in $(seq 1 "$REPS"); do
  for W in 1 2; do
    order=(pic nopic); ((rep % 2)) || order=(nopic pic)
    for v in "${order[@]}"; do
      /usr/bin/time -f '%e %U %S' -o "$WORK/time" ./build-bench-$v/dptrain train --model mlp --epochs 1 \
        --progress none --workers $W >"$WORK/out" 2>&1 || { cat "$WORK/out" >&2; exit 1; }
      read -r el us _ <"$WORK/time"
      echo "$W $v $rep $el $us $(dptrain_sps "$WORK/out")" | tee -a "$RAW" >&2
    done
  done
done
median() { sort -n | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
col() { awk -v w="$1" -v v="$2" -v c="$3" '$1 == w && $2 == v {print $c}' "$RAW" | median; }
{
  echo "# bash bench/pic.sh (REPS=$REPS) at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  echo
  echo "dptrain train --model mlp --epochs 1 --progress none --workers W; PIC: the library objects"
  echo "with -fPIC -fno-semantic-interposition (make), no PIC: make PIC=; medians of $REPS runs each"
  echo
  echo "| workers | build | wall s | user CPU s | samples/s |"
  echo "|---:|---|---:|---:|---:|"
  for W in 1 2; do for v in nopic pic; do
    echo "| $W | $( [[ $v == pic ]] && echo PIC || echo 'no PIC') | $(col $W $v 4) | $(col $W $v 5) | $(col $W $v 6) |"
  done; done
  echo
  echo "raw: workers build repetition wall_s user_s samples_per_s"
  echo '```'
  cat "$RAW"
  echo '```'
} >"$OUTMD"
cat "$OUTMD"
echo "saved: $OUTMD" >&2
