# The text a person reads (issue 27, R5): --version, train's help in groups with every option
# main.c parses, each ckpt subcommand's own help, the backend list, the end summary (one
# throughput line, a phase table adding up to 100%) and the time left on the progress bar and
# lines.  Sourced by tests/cli.sh: it uses ok, bad, BIN, DATA, T and SMALL.  About 3 seconds.
TEXT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# --- --version and -V: the number of the VERSION file, then the build ---------------------------
ver=$("$BIN" --version 2>&1)
want=$(head -n 1 "$TEXT_ROOT/VERSION" 2>/dev/null)
if [[ -n $want && $(head -n 1 <<<"$ver") == "dptrain $want" ]] && [[ $("$BIN" -V 2>&1) == "$ver" ]] &&
   grep -Eq '^commit: +([0-9a-f]{7,}|[A-Za-z0-9._+-]+-g[0-9a-f]{7,})(-dirty)?$|^commit: +unknown' <<<"$ver" &&
   grep -Eq '^compiler: +(gcc|clang) [0-9]' <<<"$ver" && grep -Eq '^gemm: +.*ref.* \(default [a-z]+\)$' <<<"$ver" &&
   grep -Eq '^mpi: +(built in|not built in)' <<<"$ver"; then ok version
else bad version "expected 'dptrain ${want:-(no VERSION file)}' and commit/compiler/gemm/mpi lines, got:" "$ver"; fi

# --- train --help: the groups in the order a person meets them, every option main.c parses ------
th=$("$BIN" train --help 2>&1)
groups=$(grep -E '^[a-z][a-z ,()A-Z./]*:$' <<<"$th" | tr '\n' '|')
want_groups='basics:|data and model:|optimisation:|checkpoints and evaluation:|data parallelism:|'
want_groups+='slow workers (docs/ddp.md):|gradient compression (docs/ddp.md):|memory (ZeRO, docs/ddp.md):|'
want_groups+='splitting the model (docs/parallel.md):|'
want_groups+='diagnostics, simulation and tuning:|'
if [[ $groups == "$want_groups" ]]; then ok train_help_groups
else bad train_help_groups "groups: $groups" "expected: $want_groups"; fi
# the basics: the options of an everyday run, and nothing else
basics=$(awk '/^basics:$/ {on = 1; next} /^$/ {on = 0} on && /^  --/ {print $1}' <<<"$th" | tr '\n' ' ')
if [[ $basics == "--data --model --epochs --batch --lr --out --resume --workers --progress " ]]; then ok train_help_basics
else bad train_help_basics "basics: $basics"; fi
# every option cmd_train parses is in the help (and the ones being added to train now)
missing=""
if [[ -r $TEXT_ROOT/tools/dptrain/main.c ]]; then
  # the CLI's own options (main.c's cmd_train) and the library's table (src/train/option_table.c)
  opts=$( { awk '/^static int cmd_train\(/ {on = 1} /^static int cmd_eval\(/ {on = 0} on' "$TEXT_ROOT/tools/dptrain/main.c" |
    grep -o '"--[a-z][a-z0-9-]*"' | tr -d '"' | grep -vx -- --help
    grep -oE '\{OPT(_OPTIONAL)?\("[a-z][a-z0-9-]*"' "$TEXT_ROOT/src/train/option_table.c" | sed -E 's/.*"(.*)"/--\1/'; } | sort -u)
  [[ $(wc -l <<<"$opts") -lt 80 ]] && missing="(only $(wc -l <<<"$opts") options found in main.c's cmd_train and option_table.c)"
  for o in $opts --overwrite --ckpt-every-steps --eval-every; do
    grep -Eq -- "(^| )$o([ =,[]|$)" <<<"$th" || missing+=" $o"
  done
fi
if [[ -z $missing ]] && grep -q "SIGINT (Ctrl-C) or SIGTERM stops the run cleanly after the current step" <<<"$th" &&
   grep -q "exits 130 (SIGINT) or 143 (SIGTERM)" <<<"$th" && grep -q "a second signal aborts at once" <<<"$th"; then
  ok train_help_every_option
else bad train_help_every_option "missing from train --help:${missing:- none}; or the signals paragraph"; fi
# lines under 100 columns in every help text of help.c
long=""
for args in "--help" "train --help" "eval --help" "help ckpt" "ckpt info --help" "ckpt export --help" \
  "ckpt diff --help" "--version"; do
  # shellcheck disable=SC2086
  n=$("$BIN" $args 2>&1 | awk 'length >= 100' | wc -l)
  [[ $n -gt 0 ]] && long+=" '$args' ($n)"
done
if [[ -z $long ]]; then ok help_under_100_columns; else bad help_under_100_columns "lines of 100 columns or more:$long"; fi

# --- ckpt: an overview, and each subcommand's own help ------------------------------------------
ckh=$("$BIN" help ckpt 2>&1)
sub_ok=1 sub_msg=""
if ! grep -q "^usage: dptrain ckpt info FILE" <<<"$ckh" || ! grep -q "ckpt export" <<<"$ckh" ||
   ! grep -q "ckpt diff" <<<"$ckh" || ! grep -q "dptrain ckpt CMD --help" <<<"$ckh"; then
  sub_ok=0 sub_msg="help ckpt is not the overview"
fi
for s in info export diff; do
  out=$("$BIN" ckpt $s --help 2>&1)
  others=$(grep -c "ckpt \(info\|export\|diff\)" <<<"$out")
  if ! grep -q "^usage: dptrain ckpt $s " <<<"$out" || [[ $others -ne 1 ]] ||
     [[ $("$BIN" help ckpt $s 2>&1) != "$out" ]]; then
    sub_ok=0 sub_msg+=" [ckpt $s --help, or help ckpt $s: '$(head -n 1 <<<"$out")']"
  fi
done
if grep -q -- "--tol F" <<<"$("$BIN" ckpt diff --help 2>&1)" &&
   grep -q -- "--safetensors OUT" <<<"$("$BIN" ckpt export --help 2>&1)" && [[ $sub_ok -eq 1 ]]; then
  ok ckpt_subcommand_help
else bad ckpt_subcommand_help "$sub_msg"; fi

# --- --help's backends: no GPU backend promised until one exists ---------------------------------
if "$BIN" --help | grep -q "^backends: thread (built in), mpi (" && ! "$BIN" --help | grep -qi nccl; then
  ok backends_no_nccl
else bad backends_no_nccl "$("$BIN" --help | grep -i backends)"; fi

# --- the end summary and the time left ----------------------------------------------------------
if [[ -r "$DATA/train-images-idx3-ubyte.gz" || -r "$DATA/train-images-idx3-ubyte" ]]; then
  # two workers, no compression, the bar on stderr (SMALL's --progress none overridden)
  "$BIN" train --model mlp --epochs 2 "${SMALL[@]}" --workers 2 --progress bar >"$T/sum.out" 2>"$T/sum.err"
  rc=$?
  sps=$(sed -n 's/^throughput: *\([0-9][0-9.eE+-]*\) *samples\/s.*/\1/p' "$T/sum.out")  # bench/lib.sh's parse
  hdr=$(grep -A1 "^time per phase " "$T/sum.out" | head -n 1)
  sum=$(grep -A1 "^time per phase " "$T/sum.out" | tail -n 1 | grep -o '[0-9.]*%' | tr -d % |
    awk '{s += $1; n++} END {if (n == 6) printf "%.1f", s}')
  if [[ $rc -eq 0 && $(grep -c "^throughput: " "$T/sum.out") -eq 1 && -n $sps ]] &&
     grep -Eq "^throughput: [0-9.]+ samples/s \(training steps after the 5th, [0-9]+ steps\)(, MFU .*)?$" "$T/sum.out" &&
     ! grep -q "per worker" "$T/sum.out"; then ok summary_one_throughput_line
  else bad summary_one_throughput_line "rc $rc" "$(grep -E '^(throughput|done)' "$T/sum.out")"; fi
  if [[ $hdr =~ ^time\ per\ phase\ +data\ +forward\ +backward\ +exposed\ communication\ +optimizer\ +other\ +total$ ]] &&
     awk -v s="${sum:-0}" 'BEGIN {exit !(s >= 99.7 && s <= 100.3)}' &&
     grep -Eq "^communication \(worker 0\): [0-9.]+s, [0-9]+% of it hidden behind backward$" "$T/sum.out"; then
    ok summary_phases_add_to_100
  else bad summary_phases_add_to_100 "shares add to '${sum:-?}'" "$(grep -A2 '^time per phase' "$T/sum.out")"; fi
  if ! grep -q "gradient traffic" "$T/sum.out"; then ok summary_no_traffic_without_compression
  else bad summary_no_traffic_without_compression "$(grep "gradient traffic" "$T/sum.out")"; fi
  eta_re='ETA [0-9]+(s|m[0-9][0-9]s|h[0-9][0-9]m)'
  if tr '\r' '\n' <"$T/sum.err" | grep -Eq "^epoch 2/2 \[#+\.*\] [0-9]+/20  loss [0-9.]+  lr [0-9.e-]+  $eta_re"; then
    ok progress_bar_eta
  else bad progress_bar_eta "$(tr '\r' '\n' <"$T/sum.err" | tail -n 3)"; fi
  "$BIN" train --model mlp --epochs 1 "${SMALL[@]}" --progress lines >"$T/lines.out" 2>&1
  if [[ $(grep -Ec "^  epoch 1 step [0-9]+/20  loss [0-9.]+  lr [0-9.e-]+  $eta_re$" "$T/lines.out") -eq 9 ]]; then
    ok progress_lines_eta
  else bad progress_lines_eta "$(grep '^  epoch' "$T/lines.out" | head -n 3)"; fi
else
  skip summary_one_throughput_line "$DATA missing"; skip summary_phases_add_to_100 "$DATA missing"
  skip summary_no_traffic_without_compression "$DATA missing"
  skip progress_bar_eta "$DATA missing"; skip progress_lines_eta "$DATA missing"
fi
