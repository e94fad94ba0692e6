#!/usr/bin/env bash
# ZeRO where the layers are large (issue 31, Q0; docs/results.md "ZeRO where the layers are
# large"): --zero-unit-mb against whole-layer ranges on MODEL (default the issue's
# mlp:784,8192,8192,8192,10: 141M parameters, two layers of 67M), AdamW, 2 thread workers.
#  1. memory: build/bench/zero_mem MODEL 2 Z DATA U for Z = 0..3 and U = 0 (none) and each of
#     UNITS, REPS repetitions each (median reported): the process's peak RSS (getrusage), each
#     stage's against plain (Z = 0, no unit), and the model-state part per worker against its
#     bound, formula + act + inflight (the units in flight, the library's own count; the plan
#     prints the same: `dptrain plan --model MODEL --workers 2 --zero-unit-mb U`).
#  2. speed: `dptrain train --workers 2 --optim adamw --batch BATCH --max-steps STEPS` samples/s
#     (its "throughput:" line) for --zero 0 and --zero 3, each without a unit and with the first
#     of UNITS, REPS interleaved repetitions (median reported): what the slices cost.
#  3. gpt (PARTS has "gpt"): `dptrain train --model GPT --workers 2 --optim adamw --batch 8
#     --max-steps 3` on Debian's license texts (prepare-text), --zero 0, --zero 3, and --zero 3
#     with the first of GPT_UNITS: the process's peak RSS (/usr/bin/time %M), REPS repetitions
#     (median), beside the plan's units in flight per worker (`dptrain plan --model GPT --workers 2
#     [--zero-unit-mb U]`): the blocks cut into their children's ranges.
#   bash bench/zero_unit.sh                    # about 12 minutes on 2 cores
#   UNITS="8 16 64" REPS=1 PARTS=mem bash bench/zero_unit.sh
# Writes bench/results/zero_unit-<date>.md (the tables) and .tsv (every run), needs `make`.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck disable=SC2034  # bench_facts (bench/lib.sh) reads it
ROOT=$PWD
MODEL=${MODEL:-mlp:784,8192,8192,8192,10}
UNITS=${UNITS:-16}
REPS=${REPS:-3}
BATCH=${BATCH:-128}
STEPS=${STEPS:-12}
PARTS=${PARTS:-mem speed gpt}
GPT=${GPT:-gpt:layers=4,heads=8,dim=1024,ctx=32}
GPT_UNITS=${GPT_UNITS:-8}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
RESULTS=${RESULTS:-bench/results}
MEM=build/bench/zero_mem
BIN=build/dptrain
[[ -x $MEM && -x $BIN ]] || { echo "build $MEM and $BIN first (make)" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_start zero_unit
TSV=$RESULTS/zero_unit-$STAMP.tsv
median() { tr ' ' '\n' | grep -v '^$' | grep -v NA | sort -g | awk '{a[NR] = $1} END {print NR ? a[int((NR + 1) / 2)] : "NA"}'; }
has() { [[ " $PARTS " == *" $1 "* ]]; }
printf 'part\trep\tzero\tunit_mb\tvalue\trss_per_worker\tformula\tact\tinflight\trss/bound\n' >"$TSV"
declare -A rss=() bound=() per=() form=() infl=() sps=()
if has mem; then
  for rep in $(seq "$REPS"); do
    for u in 0 $UNITS; do
      for z in 0 1 2 3; do
        line=$("$MEM" "$MODEL" 2 "$z" "$DATA" "$u") || die "zero_mem $MODEL 2 $z $DATA $u failed"
        # zero_mem's columns (bench/zero_mem.c): 12 rss_peak, 13 formula, 14 act, 15 inflight,
        # 17 rss_per_worker, 18 rss/bound
        read -r r f a i w b < <(awk -F'\t' '{print $12, $13, $14, $15, $17, $18}' <<<"$line")
        printf 'mem\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rep" "$z" "$u" "$r" "$w" "$f" "$a" "$i" "$b" >>"$TSV"
        rss[$z $u]="${rss[$z $u]:-} $r" bound[$z $u]="${bound[$z $u]:-} $b" per[$z $u]="${per[$z $u]:-} $w"
        form[$z $u]=$f infl[$z $u]=$i
        note "mem rep $rep zero $z unit $u: peak RSS $r"
      done
    done
  done
fi
UNIT1=${UNITS%% *}
if has speed; then
  for rep in $(seq "$REPS"); do
    for z in 0 3; do
      for u in 0 "$UNIT1"; do
        args=(--zero "$z")
        [[ $u != 0 ]] && args+=(--zero-unit-mb "$u")
        "$BIN" train --model "$MODEL" --data "$DATA" --workers 2 --optim adamw --lr 1e-3 --batch "$BATCH" \
          --max-steps "$STEPS" --test-limit 256 --progress none "${args[@]}" >"$WORK/run.log" 2>&1 ||
          die "train --zero $z unit $u failed: $(tail -n 1 "$WORK/run.log")"
        v=$(dptrain_sps "$WORK/run.log")
        printf 'speed\t%s\t%s\t%s\t%s\t\t\t\t\t\n' "$rep" "$z" "$u" "${v:-NA}" >>"$TSV"
        sps[$z $u]="${sps[$z $u]:-} ${v:-NA}"
        note "speed rep $rep zero $z unit $u: ${v:-NA} samples/s"
      done
    done
  done
fi
declare -A grss=()
if has gpt; then
  TOKENS=$WORK/tokens.bin
  "$BIN" prepare-text /usr/share/common-licenses --out "$TOKENS" >/dev/null || die "prepare-text failed"
  for rep in $(seq "$REPS"); do
    for cfg in "0 0" "3 0" "3 ${GPT_UNITS%% *}"; do
      read -r z u <<<"$cfg"
      args=(--zero "$z")
      [[ $u != 0 ]] && args+=(--zero-unit-mb "$u")
      /usr/bin/time -f '%M' -o "$WORK/gpt.time" "$BIN" train --model "$GPT" --data "$TOKENS" --workers 2 --optim adamw \
        --lr 1e-3 --batch 8 --max-steps 3 --progress none "${args[@]}" >"$WORK/gpt.log" 2>&1 ||
        die "gpt --zero $z unit $u failed: $(tail -n 1 "$WORK/gpt.log")"
      kb=$(tail -n 1 "$WORK/gpt.time")
      printf 'gpt\t%s\t%s\t%s\t%s\t\t\t\t\t\n' "$rep" "$z" "$u" "$((kb * 1024))" >>"$TSV"
      grss[$z $u]="${grss[$z $u]:-} $((kb * 1024))"
      note "gpt rep $rep zero $z unit $u: peak RSS $((kb * 1024))"
    done
  done
fi
gb() { awk -v b="$1" 'BEGIN { if (b == "NA") print "NA"; else printf "%.2f GB", b / 1e9 }'; }
{
  echo "# ZeRO with --zero-unit-mb, AdamW, 2 workers (parts: $PARTS)"
  echo
  echo "\`bash bench/zero_unit.sh\` (PARTS=\"$PARTS\" MODEL=$MODEL UNITS=\"$UNITS\" GPT=$GPT GPT_UNITS=\"$GPT_UNITS\"" \
       "REPS=$REPS BATCH=$BATCH STEPS=$STEPS), git $GIT_REV;"
  echo "CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1. Raw: \`$(basename "$TSV")\`."
  if has mem; then
    echo
    echo "$MODEL: the peak RSS of the process (medians of $REPS; GB of 10^9 bytes). Per worker: its model-state part"
    echo "(peak less the RSS before init and the data set, over 2); bound: formula + act + units in flight."
    echo
    echo "| stage | unit | peak RSS | against plain | per worker | formula | in flight | per worker / bound |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|"
    plain=$(median <<<"${rss[0 0]:-}")
    for z in 0 1 2 3; do
      for u in 0 $UNITS; do
        m=$(median <<<"${rss[$z $u]:-}")
        printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$z" "$([[ $u == 0 ]] && echo none || echo "$u MiB")" \
          "$(gb "$m")" "$(awk -v a="$m" -v b="$plain" 'BEGIN { printf "%.2f", a / b }')" \
          "$(gb "$(median <<<"${per[$z $u]:-}")")" "$(gb "${form[$z $u]:-NA}")" "$(gb "${infl[$z $u]:-NA}")" \
          "$(median <<<"${bound[$z $u]:-}")"
      done
    done
  fi
  if has speed; then
    echo
    echo "Samples/s, \`dptrain train --workers 2 --optim adamw --batch $BATCH --max-steps $STEPS\` (medians of $REPS):"
    echo
    echo "| stage | no unit | unit $UNIT1 MiB | ratio |"
    echo "|---|---:|---:|---:|"
    for z in 0 3; do
      a=$(median <<<"${sps[$z 0]:-}") b=$(median <<<"${sps[$z $UNIT1]:-}")
      printf '| %s | %s | %s | %s |\n' "$z" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { if (a > 0) printf "%.3f", b / a; else print "NA" }')"
    done
  fi
  if has gpt; then
    GU=${GPT_UNITS%% *}
    echo
    echo "$GPT, AdamW, 2 workers, batch 8, 3 steps: the process's peak RSS (medians of $REPS), and the plan's"
    echo "units in flight per worker at stage 3 (\`dptrain plan --model $GPT --workers 2 [--zero-unit-mb $GU]\`):"
    echo
    echo "| stage | unit | peak RSS | against plain | plan: units in flight per worker |"
    echo "|---|---|---:|---:|---:|"
    gp=$(median <<<"${grss[0 0]:-}")
    inf0=$("$BIN" plan --model "$GPT" --workers 2 | sed -n 's/^units in flight.*zero3 \([0-9.]* [kMG]B\).*/\1/p')
    inf1=$("$BIN" plan --model "$GPT" --workers 2 --zero-unit-mb "$GU" | sed -n 's/^units in flight.*zero3 \([0-9.]* [kMG]B\).*/\1/p')
    for cfg in "0 0" "3 0" "3 $GU"; do
      read -r z u <<<"$cfg"
      m=$(median <<<"${grss[$z $u]:-}")
      printf '| %s | %s | %s | %s | %s |\n' "$z" "$([[ $u == 0 ]] && echo none || echo "$u MiB")" "$(gb "$m")" \
        "$(awk -v a="$m" -v b="$gp" 'BEGIN { printf "%.2f", a / b }')" \
        "$([[ $z == 0 ]] && echo - || { [[ $u == 0 ]] && echo "$inf0" || echo "$inf1"; })"
    done
    echo
    echo "$("$BIN" train --model "$GPT" --data "$WORK/tokens.bin" --workers 2 --zero 3 --zero-unit-mb "$GU" --max-steps 1 \
      --progress none 2>&1 | grep '^zero unit:')"
  fi
} >"$OUTMD"
cat "$OUTMD"
echo "wrote $OUTMD and $TSV" >&2
