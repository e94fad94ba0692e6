# Input a user gets wrong, refused with one clear line (issue 27, R4: data and plan).  Sourced by
# tests/cli.sh near its end (its helpers ok, bad, skip, expect_error; BIN, T).  Fast: no run here
# trains more than one step of a tiny model.

# --- --data: a missing path, a file where a folder or a token file belongs ---------------------
IN_GPT=gpt:layers=1,heads=2,dim=16,ctx=8
IN_RUN=(--model "$IN_GPT" --batch 8 --max-steps 1 --workers 1 --test-limit 8 --progress none)
printf 'It was a dark and stormy night; the rain fell in torrents.\n' >"$T/in_notes.txt"
expect_error input_data_missing_image "dataset: $T/in_nope: no such file or folder" \
  "$BIN" train --model mlp --data "$T/in_nope" --progress none
expect_error input_data_missing_gpt "--data $T/in_nope: no such file or folder" \
  "$BIN" train --model "$IN_GPT" --data "$T/in_nope" --progress none
expect_error input_data_text_file_gpt \
  "--data $T/in_notes.txt is not a token file (it starts with \"It was a dark an...\"): --data takes a token file written by 'dptrain prepare-text FILES --out tokens.bin', or a folder of text files\$" \
  "$BIN" train --model "$IN_GPT" --data "$T/in_notes.txt" --progress none
expect_error input_data_file_image \
  "dataset: $T/in_notes.txt is not a folder: an image model (mlp, cnn, resnet) reads a folder holding the IDX files train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (each plain or .gz)" \
  "$BIN" train --model cnn --data "$T/in_notes.txt" --progress none

# --- --data DIR for gpt: the token file goes to the cache, not into DIR --------------------------
# The first use writes $XDG_CACHE_HOME/dptrain/NAME-P-C.tokens (the bytes prepare-text writes) and
# says where; the next reuses it; DIR keeps only its own files.
mkdir -p "$T/in_txt"
for i in 1 2 3 4; do cat "$T/in_notes.txt"; done >"$T/in_txt/a.txt"
printf 'A second file, for the name order.\n' >"$T/in_txt/b.txt"
"$BIN" prepare-text "$T/in_txt" --out "$T/in_want.bin" >/dev/null 2>&1
in_tok="$T/in_cache/dptrain/in_txt-[0-9a-f]\{16\}-[0-9a-f]\{16\}\.tokens"
if XDG_CACHE_HOME="$T/in_cache" "$BIN" train "${IN_RUN[@]}" --data "$T/in_txt" >/dev/null 2>"$T/in1.err" &&
   grep -q "^dptrain: prepared $in_tok from 2 files of $T/in_txt ([0-9]* tokens): no token file of $T/in_txt in the cache yet\$" "$T/in1.err" &&
   [[ $(ls "$T/in_txt") == "a.txt"$'\n'"b.txt" ]] && cmp -s "$T"/in_cache/dptrain/in_txt-*.tokens "$T/in_want.bin" &&
   XDG_CACHE_HOME="$T/in_cache" "$BIN" train "${IN_RUN[@]}" --data "$T/in_txt" >/dev/null 2>"$T/in2.err" &&
   grep -q "^dptrain: reusing $in_tok ([0-9]* tokens, newer than its 2 source files)\$" "$T/in2.err" &&
   [[ $(ls "$T/in_cache/dptrain" | wc -l) -eq 1 ]]; then
  ok input_data_folder_prepared_into_cache
else bad input_data_folder_prepared_into_cache "$(cat "$T/in1.err" "$T/in2.err" 2>&1)" "$(ls -R "$T/in_txt" "$T/in_cache" 2>&1)"; fi
# DIR/tokens.bin of an older dptrain: reused while valid, and read only (the cache gets nothing)
mkdir -p "$T/in_old"
cp "$T/in_txt/a.txt" "$T/in_old/"
"$BIN" prepare-text "$T/in_old" --out "$T/in_old/tokens.bin" >/dev/null 2>&1
if XDG_CACHE_HOME="$T/in_cache_old" "$BIN" train "${IN_RUN[@]}" --data "$T/in_old" >/dev/null 2>"$T/in3.err" &&
   grep -q "^dptrain: reusing $T/in_old/tokens.bin ([0-9]* tokens, newer than its 1 source file)\$" "$T/in3.err" &&
   [[ ! -e $T/in_cache_old ]]; then
  ok input_data_folder_old_tokens_bin_reused
else bad input_data_folder_old_tokens_bin_reused "$(cat "$T/in3.err")"; fi
# no cache (XDG_CACHE_HOME under a file): into DIR/tokens.bin, saying why; where DIR cannot take
# it either (tokens.bin a folder: refused even to root, unlike a read-only mode), one error naming
# both places
mkdir -p "$T/in_fb" "$T/in_ro/tokens.bin/x"
cp "$T/in_txt/a.txt" "$T/in_fb/"
cp "$T/in_txt/a.txt" "$T/in_ro/"
if XDG_CACHE_HOME="$T/in_notes.txt/c" "$BIN" train "${IN_RUN[@]}" --data "$T/in_fb" >/dev/null 2>"$T/in4.err" &&
   grep -q "^dptrain: prepared $T/in_fb/tokens.bin from 1 file of $T/in_fb ([0-9]* tokens): .*; in the folder, as the cache failed: cannot create $T/in_notes.txt/c/dptrain: Not a directory\$" "$T/in4.err"; then
  ok input_data_folder_without_cache
else bad input_data_folder_without_cache "$(cat "$T/in4.err")"; fi
expect_error input_data_folder_nowhere_to_write \
  "cannot write the token file of $T/in_ro, neither in the cache (cannot create $T/in_notes.txt/c/dptrain: Not a directory) nor in the folder (.*$T/in_ro/tokens.bin.*): set XDG_CACHE_HOME to a writable folder" \
  env XDG_CACHE_HOME="$T/in_notes.txt/c" "$BIN" train "${IN_RUN[@]}" --data "$T/in_ro"

# --- plan --profile without the model's compute ---------------------------------------------------
# A profile of the link only (calibrate without --model) would price cnn's compute from FLOPs at
# 1e12: refused with the command that measures it; --sample-ms states it on purpose; without a
# profile the default rate is said beside the figure, a rate given with --flops is not.
printf '{"kind": "profile", "version": 2, "workers": 2, "alpha_s": 1e-6, "beta_s": 1e-10}\n' >"$T/in_link.json"
expect_error input_plan_profile_without_compute \
  "in_link.json has no measured compute for --model cnn (calibrated without --model): the plan would price it from FLOPs at 1e+12 FLOP/s, an estimate; run 'dptrain calibrate --model cnn --out $T/in_link.json'" \
  "$BIN" plan --model cnn --workers 2 --batch 128 --profile "$T/in_link.json"
in_p1=$("$BIN" plan --model cnn --workers 2 --batch 128 --profile "$T/in_link.json" --sample-ms 0.3 2>&1)
in_p2=$("$BIN" plan --model cnn --workers 2 --batch 128 2>&1)
in_p3=$("$BIN" plan --model cnn --workers 2 --batch 128 --flops 5e10 2>&1)
if grep -q "^step 19.2[0-9]* ms = forward 6.4 + backward 12.8 " <<<"$in_p1" && ! grep -q "FLOP estimate" <<<"$in_p1" &&
   grep -q "^communication .* samples/s (compute: a FLOP estimate at the default 1e+12 FLOP/s, not measured)\$" <<<"$in_p2" &&
   grep -q "^communication .* samples/s\$" <<<"$in_p3"; then
  ok input_plan_compute_said
else bad input_plan_compute_said "$in_p1" "$in_p2" "$in_p3"; fi
