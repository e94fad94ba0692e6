# Your own data (sourced by tests/cli.sh: its helpers, BIN, T): NumPy arrays through --data
# X.npy --labels y.npy, with a test set, a held-out split or none; the same bits for any worker
# count, layout and dtype of the same values; exact resume; eval with the run's normalisation;
# regression with --loss mse; every malformed file or bad combination one clear line.
PY=/usr/bin/python3
ND="$T/own"
mkdir -p "$ND"
# Three Gaussian classes in 2 x 4 x 4 features (seeded), train 600 / test 150; the same
# values as float32 NCHW, uint8 NCHW, float32 NHWC and float64 (N, D); a linear regression
# target with two outputs; and the malformed files.
"$PY" - "$ND" <<'EOF'
import sys, numpy as np
d = sys.argv[1]
r = np.random.default_rng(7)
centers = r.normal(0, 1, (3, 2, 4, 4))
def make(n):
    y = r.integers(0, 3, n)
    x = np.clip(np.rint(60 * (centers[y] + 2.5 * r.normal(0, 1, (n, 2, 4, 4))) + 128), 0, 255)
    return x, y
x, y = make(600); xt, yt = make(150)
np.save(f"{d}/x.npy", x.astype(np.float32)); np.save(f"{d}/y.npy", y)
np.save(f"{d}/xt.npy", xt.astype(np.float32)); np.save(f"{d}/yt.npy", yt.astype(np.int32))
np.save(f"{d}/x_u8.npy", x.astype(np.uint8))
np.save(f"{d}/x_nhwc.npy", np.ascontiguousarray(x.transpose(0, 2, 3, 1)).astype(np.float32))
np.save(f"{d}/x_2d.npy", x.reshape(600, -1).astype(np.float64))
w = r.normal(0, 1, (32, 2))
np.save(f"{d}/t.npy", (x.reshape(600, -1) / 255) @ w + 3.0)
np.save(f"{d}/tt.npy", (xt.reshape(150, -1) / 255) @ w + 3.0)
np.save(f"{d}/y_float.npy", y.astype(np.float32))
np.save(f"{d}/y_short.npy", y[:500])
np.save(f"{d}/y_neg.npy", y - 1)
np.save(f"{d}/x_fortran.npy", np.asfortranarray(x.reshape(600, -1).astype(np.float32)))
np.save(f"{d}/x_big.npy", x.astype(">f4"))
np.save(f"{d}/x_obj.npy", np.array([{"a": 1}] * 600, dtype=object), allow_pickle=True)
open(f"{d}/x_cut.npy", "wb").write(open(f"{d}/x.npy", "rb").read()[:5000])
open(f"{d}/x_text.npy", "w").write("1,2,3\n")
np.savez(f"{d}/d.npz", x=x.astype(np.float32), y=y)
np.savez_compressed(f"{d}/dc.npz", x=x.astype(np.float32), y=y)
np.savez(f"{d}/keras.npz", x_train=x.astype(np.float32), y_train=y, x_test=xt.astype(np.float32), y_test=yt)
np.savez(f"{d}/odd.npz", feats=x.astype(np.float32), labs=y)
# the (N, D) table as CSV: a header, the label in the middle (column "cls", index 5)
t = x.reshape(600, -1).astype(np.int64)
with open(f"{d}/t.csv", "w") as f:
    f.write(",".join([f"f{i}" for i in range(5)] + ["cls"] + [f"f{i}" for i in range(5, 32)]) + "\n")
    for row, c in zip(t, y):
        f.write(",".join(map(str, list(row[:5]) + [c] + list(row[5:]))) + "\n")
open(f"{d}/bad_num.csv", "w").write("a,b,c\n1,2,0\n3,abc,1\n")
open(f"{d}/bad_missing.csv", "w").write("a,b,c\n1,2,0\n3,,1\n")
open(f"{d}/bad_count.csv", "w").write("a,b,c\n1,2,0\n3,4\n")
open(f"{d}/bad_label.csv", "w").write("a,b,c\n1,2,0\n3,4,1.5\n")
EOF
# the cache folder of the runs below (an .npz's arrays are extracted there)
export XDG_CACHE_HOME="$T/cache"
OWN=(--labels "$ND/y.npy" --model mlp:hidden=32 --batch 50 --lr 0.05 --momentum 0.9 --progress none)
# (the default normalisation of an array is auto: no option needed)

# learns: a test set of its own, the accuracy reported; eval of the checkpoint gives the same
rm -rf "$T/own1"
"$BIN" train --data "$ND/x.npy" --test-data "$ND/xt.npy" --test-labels "$ND/yt.npy" "${OWN[@]}" --epochs 4 \
  --workers 2 --out "$T/own1" >"$T/own1.log" 2>&1
# (the last epoch's "test loss L  test acc A%")
figs=$(sed -n 's/^epoch 4\/4 .*\(test loss [0-9.]*  test acc [0-9.]*%\).*/\1/p' "$T/own1.log")
acc=$(test_acc_of "$T/own1.log")
if awk -v a="${acc%,}" 'BEGIN {exit !(a + 0 >= 70 && a + 0 < 100)}'; then ok npy_trains_with_test_set
else bad npy_trains_with_test_set "test acc '$acc' (expected 70..99%: 3 noisy classes)" "$(tail -3 "$T/own1.log")"; fi
"$BIN" eval --ckpt "$T/own1/checkpoint.bin" --data "$ND/xt.npy" --labels "$ND/yt.npy" >"$T/own1e.log" 2>&1
# eval prints "test acc A%  test loss L": the same two figures
efigs=$(sed -n 's/.*\(test acc [0-9.]*%\)  \(test loss [0-9.]*\).*/\2  \1/p' "$T/own1e.log")
if [[ -n "$figs" && "$figs" == "$efigs" ]]
then ok npy_eval_uses_run_normalisation
else bad npy_eval_uses_run_normalisation "train: $figs" "eval: $(cat "$T/own1e.log")"; fi

# the same bits for 1, 2 and 3 workers (deterministic), with a held-out split
hs=()
for P in 1 2 3; do
  rm -rf "$T/ownp$P"
  "$BIN" train --data "$ND/x.npy" --val-split 0.2 "${OWN[@]}" --epochs 2 --deterministic --workers $P \
    --out "$T/ownp$P" >"$T/ownp$P.log" 2>&1
  hs+=("$(hash_of "$T/ownp$P/checkpoint.bin")")
done
if same_hash "${hs[0]}" "${hs[1]}" && same_hash "${hs[0]}" "${hs[2]}"; then ok npy_workers_same_bits
else bad npy_workers_same_bits "P=1 ${hs[0]}, P=2 ${hs[1]}, P=3 ${hs[2]}" "$(tail -2 "$T/ownp3.log")"; fi
# under mpirun, 2 processes x 1 worker: the same bits again
rm -rf "$T/ownmpi"
timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --data "$ND/x.npy" --val-split 0.2 "${OWN[@]}" --epochs 2 \
  --deterministic --workers 1 --out "$T/ownmpi" >"$T/ownmpi.log" 2>&1
hm=$(hash_of "$T/ownmpi/checkpoint.bin")
if same_hash "$hm" "${hs[0]}"; then ok npy_mpirun_same_bits
else bad npy_mpirun_same_bits "mpirun -np 2: $hm, 1 worker: ${hs[0]}" "$(tail -3 "$T/ownmpi.log")"; fi
if grep -q "test acc" "$T/ownp1.log" && grep -q '"test_acc"' "$T/ownp1/metrics.jsonl"; then ok npy_val_split_evaluates
else bad npy_val_split_evaluates "$(tail -2 "$T/ownp1.log")"; fi

# the same values in another dtype or layout: the same bits
for v in u8:"$ND/x_u8.npy" nhwc:"$ND/x_nhwc.npy --layout nhwc"; do
  name=${v%%:*}
  rm -rf "$T/own_$name"
  # shellcheck disable=SC2086
  "$BIN" train --data ${v#*:} --val-split 0.2 "${OWN[@]}" --epochs 2 --deterministic --workers 1 \
    --out "$T/own_$name" >"$T/own_$name.log" 2>&1
  h=$(hash_of "$T/own_$name/checkpoint.bin")
  if same_hash "$h" "${hs[0]}"; then ok "npy_${name}_same_bits"
  else bad "npy_${name}_same_bits" "$h vs float32 NCHW ${hs[0]}" "$(tail -2 "$T/own_$name.log")"; fi
done
# the same arrays in an .npz, stored or compressed, or under other names (--npz-keys)
for v in d:"$ND/d.npz" dc:"$ND/dc.npz" keys:"$ND/odd.npz --npz-keys feats,labs"; do
  name=${v%%:*}
  rm -rf "$T/own_$name"
  # shellcheck disable=SC2086
  "$BIN" train --data ${v#*:} --val-split 0.2 "${OWN[@]:2}" --epochs 2 --deterministic --workers 1 \
    --out "$T/own_$name" >"$T/own_$name.log" 2>&1
  h=$(hash_of "$T/own_$name/checkpoint.bin")
  if same_hash "$h" "${hs[0]}"; then ok "npz_${name}_same_bits"
  else bad "npz_${name}_same_bits" "$h vs the .npy pair's ${hs[0]}" "$(tail -2 "$T/own_$name.log")"; fi
done
# Keras's layout (x_train, y_train, x_test, y_test): its test arrays are the test set
"$BIN" train --data "$ND/keras.npz" "${OWN[@]:2}" --epochs 4 --workers 2 >"$T/keras.log" 2>&1
kf=$(sed -n 's/^epoch 4\/4 .*\(test loss [0-9.]*  test acc [0-9.]*%\).*/\1/p' "$T/keras.log")
if [[ -n "$kf" && "$kf" == "$figs" ]]; then ok npz_keras_layout_test_set
else bad npz_keras_layout_test_set "$(tail -2 "$T/keras.log")" "expected $figs"; fi

# (N, D) float64: 32 features, the mlp takes them whole
"$BIN" train --data "$ND/x_2d.npy" "${OWN[@]}" --epochs 1 --workers 1 >"$T/own2d.log" 2>&1
if grep -q "(no test set)" "$T/own2d.log" && grep -q "^dptrain: model mlp:hidden=32 (1155 parameters" "$T/own2d.log"
then ok npy_2d_no_test_set
else bad npy_2d_no_test_set "$(head -1 "$T/own2d.log")" "$(tail -2 "$T/own2d.log")"; fi

# the same table from CSV, the label column by name or by index: the same bits as from .npy;
# parsed once into the cache and reused while the CSV (and the options that shape its arrays)
# are unchanged: the cache then holds one version of its arrays
# (the .npy on 1 worker, the CSV on 3 and 2 workers)
CSV1=(--val-split 0.2 --model mlp:hidden=32 --batch 50 --lr 0.05 --momentum 0.9 --progress none --epochs 2
      --deterministic)
rm -rf "$T/own_npy2d" "$T/own_csv" "$T/own_csvi"
"$BIN" train --data "$ND/x_2d.npy" --labels "$ND/y.npy" "${CSV1[@]}" --workers 1 --out "$T/own_npy2d" >/dev/null 2>&1
"$BIN" train --data "$ND/t.csv" --label-column 5 "${CSV1[@]}" --workers 3 --out "$T/own_csvi" >/dev/null 2>&1
"$BIN" train --data "$ND/t.csv" --label-column cls "${CSV1[@]}" --workers 2 --out "$T/own_csv" >"$T/own_csv.log" 2>&1
h2=$(hash_of "$T/own_npy2d/checkpoint.bin") hc=$(hash_of "$T/own_csv/checkpoint.bin") hi=$(hash_of "$T/own_csvi/checkpoint.bin")
if same_hash "$h2" "$hc" && same_hash "$h2" "$hi"; then ok csv_same_bits_as_npy
else bad csv_same_bits_as_npy ".npy $h2, csv by name $hc, by index $hi" "$(tail -2 "$T/own_csv.log")"; fi
# eval of the CSV run replays its --label-column (the stored configuration): the run's figures
"$BIN" eval --ckpt "$T/own_csv/checkpoint.bin" --data "$ND/t.csv" --val-split 0.2 >"$T/own_csve.log" 2>&1
cf=$(sed -n 's/^epoch 2\/2 .*\(test loss [0-9.]*  test acc [0-9.]*%\).*/\1/p' "$T/own_csv.log")
cef=$(sed -n 's/.*\(test acc [0-9.]*%\)  \(test loss [0-9.]*\).*/\2  \1/p' "$T/own_csve.log")
if [[ -n "$cf" && "$cf" == "$cef" ]]; then ok csv_eval_replays_label_column
else bad csv_eval_replays_label_column "train: $cf" "eval: $(cat "$T/own_csve.log")"; fi
cx=$(ls "$XDG_CACHE_HOME"/dptrain/t.csv-*.x.npy 2>/dev/null)
m1=$(stat -c %Y.%y "$cx" 2>/dev/null)
"$BIN" train --data "$ND/t.csv" --label-column cls "${CSV1[@]}" --epochs 1 >/dev/null 2>&1
m2=$(stat -c %Y.%y "$cx" 2>/dev/null)
sleep 1.1; touch "$ND/t.csv"
"$BIN" train --data "$ND/t.csv" --label-column cls "${CSV1[@]}" --epochs 1 >/dev/null 2>&1
cx2=$(ls "$XDG_CACHE_HOME"/dptrain/t.csv-*.x.npy 2>/dev/null)
if [[ -n "$m1" && "$m1" == "$m2" && $(wc -w <<<"$cx2") -eq 1 && "$cx2" != "$cx" ]]; then ok csv_cache_reused_then_rebuilt
else bad csv_cache_reused_then_rebuilt "first $cx ($m1), second ($m2), after touch: $cx2"; fi

# exact resume: 1 epoch, then on to 3, is the 3-epoch run
rm -rf "$T/ownr" "$T/ownr3"
"$BIN" train --data "$ND/x.npy" --val-split 0.2 "${OWN[@]}" --epochs 3 --workers 2 --out "$T/ownr3" >/dev/null 2>&1
"$BIN" train --data "$ND/x.npy" --val-split 0.2 "${OWN[@]}" --epochs 1 --workers 2 --out "$T/ownr" >/dev/null 2>&1
"$BIN" train --resume "$T/ownr/checkpoint.bin" --out "$T/ownr" --epochs 3 --progress none >"$T/ownr.log" 2>&1
h3=$(hash_of "$T/ownr3/checkpoint.bin") hr=$(hash_of "$T/ownr/checkpoint.bin")
if same_hash "$h3" "$hr"; then ok npy_resume_same_bits
else bad npy_resume_same_bits "straight $h3, resumed $hr" "$(tail -2 "$T/ownr.log")"; fi

# a regression: two float targets per sample, --loss mse; RMSE and MAE reported, 1 and 2 workers
# give the same bits, eval of the checkpoint gives the run's RMSE
REG=(--data "$ND/x.npy" --labels "$ND/t.npy" --test-data "$ND/xt.npy" --test-labels "$ND/tt.npy" --loss mse
     --model mlp:hidden=32 --optim adamw --lr 0.003 --batch 50 --epochs 6 --progress none --deterministic)
rm -rf "$T/reg1" "$T/reg2"
"$BIN" train "${REG[@]}" --workers 1 --out "$T/reg1" >"$T/reg1.log" 2>&1
"$BIN" train "${REG[@]}" --workers 2 --out "$T/reg2" >"$T/reg2.log" 2>&1
r1=$(hash_of "$T/reg1/checkpoint.bin") r2=$(hash_of "$T/reg2/checkpoint.bin")
rmse=$(sed -n 's/^epoch 6\/6 .*test rmse \([0-9.e+-]*\) .*/\1/p' "$T/reg1.log")
rmse1=$(sed -n 's/^epoch 1\/6 .*test rmse \([0-9.e+-]*\) .*/\1/p' "$T/reg1.log")
if same_hash "$r1" "$r2" && grep -q "test mae" "$T/reg1.log" && awk -v a="$rmse" -v b="$rmse1" 'BEGIN {exit !(a + 0 < 0.5 * b)}'
then ok regression_mse_learns_same_bits
else bad regression_mse_learns_same_bits "1 worker $r1, 2 workers $r2, rmse $rmse1 -> $rmse" "$(tail -3 "$T/reg1.log")"; fi
mrmse=$(grep '"kind": "epoch"' "$T/reg1/metrics.jsonl" | tail -1 | sed -n 's/.*"test_rmse": \([0-9.e+-]*\).*/\1/p')
# (the epoch line rounds to 4 digits, the record to 6)
if awk -v a="$mrmse" -v b="$rmse" 'BEGIN {d = a - b; exit !(a != "" && b != "" && d * d < 1e-6 * b * b)}' 
then ok regression_metrics_rmse; else bad regression_metrics_rmse "rmse $rmse" "$(tail -1 "$T/reg1/metrics.jsonl" | head -c 300)"; fi
"$BIN" eval --ckpt "$T/reg1/checkpoint.bin" --data "$ND/xt.npy" --labels "$ND/tt.npy" >"$T/rege.log" 2>&1
if grep -q "test rmse $rmse " "$T/rege.log"; then ok regression_eval_same_rmse
else bad regression_eval_same_rmse "train: $rmse" "$(cat "$T/rege.log")"; fi

# mistakes: one line each, naming the file and what is wrong
B=("$BIN" train --model mlp --epochs 1 --progress none)
expect_error npy_needs_labels "needs its labels: --labels y.npy" "${B[@]}" --data "$ND/x.npy"
expect_error npy_float_labels_are_regression "float targets are a regression (--loss mse)" \
  "${B[@]}" --data "$ND/x.npy" --labels "$ND/y_float.npy"
expect_error npy_label_count "holds 600 samples, .*y_short.npy 500 labels" "${B[@]}" --data "$ND/x.npy" --labels "$ND/y_short.npy"
expect_error npy_negative_label "label [0-9]* is -1: classes are 0 .. 65535" "${B[@]}" --data "$ND/x.npy" --labels "$ND/y_neg.npy"
expect_error npy_fortran_refused "x_fortran.npy: Fortran order" "${B[@]}" --data "$ND/x_fortran.npy" --labels "$ND/y.npy"
expect_error npy_big_endian_refused "x_big.npy: .*big-endian" "${B[@]}" --data "$ND/x_big.npy" --labels "$ND/y.npy"
expect_error npy_object_refused "x_obj.npy: .*object" "${B[@]}" --data "$ND/x_obj.npy" --labels "$ND/y.npy"
expect_error npy_truncated "x_cut.npy: the shape needs .* (cut short?)" "${B[@]}" --data "$ND/x_cut.npy" --labels "$ND/y.npy"
expect_error npy_not_npy "x_text.npy: not a .npy file" "${B[@]}" --data "$ND/x_text.npy" --labels "$ND/y.npy"
expect_error npz_missing_key "odd.npz: no array 'x' (it holds: feats, labs)" "${B[@]}" --data "$ND/odd.npz"
cp "$ND/x.npy" "$ND/x.npz"
expect_error npz_not_zip "x.npz: not an .npz (zip) archive" "${B[@]}" --data "$ND/x.npz"
expect_error npz_with_labels "an .npz holds its labels" "${B[@]}" --data "$ND/d.npz" --labels "$ND/y.npy"
expect_error csv_not_a_number "bad_num.csv:3:2: 'abc' is not a number" "${B[@]}" --data "$ND/bad_num.csv"
expect_error csv_missing_value "bad_missing.csv:3:2: a missing value" "${B[@]}" --data "$ND/bad_missing.csv"
expect_error csv_field_count "bad_count.csv:3: 2 fields, the header has 3" "${B[@]}" --data "$ND/bad_count.csv"
expect_error csv_label_not_class "bad_label.csv:3:3: label '1.5' is not a class" "${B[@]}" --data "$ND/bad_label.csv"
expect_error csv_unknown_column "no column named 'label' in the header (f0, f1" \
  "${B[@]}" --data "$ND/t.csv" --label-column label
expect_error csv_with_labels "a CSV holds its labels" "${B[@]}" --data "$ND/t.csv" --labels "$ND/y.npy"
expect_error npy_missing "nope.npy: no such file" "${B[@]}" --data "$ND/nope.npy" --labels "$ND/y.npy"
expect_error npy_nhwc_needs_4d "--layout nhwc needs a 4-dimensional array" \
  "${B[@]}" --data "$ND/x_2d.npy" --labels "$ND/y.npy" --layout nhwc
expect_error npy_test_and_val_split "--test-data and --val-split: give one" \
  "${B[@]}" --data "$ND/x.npy" --labels "$ND/y.npy" --test-data "$ND/xt.npy" --test-labels "$ND/yt.npy" --val-split 0.1
expect_error npy_val_split_range "--val-split" "${B[@]}" --data "$ND/x.npy" --labels "$ND/y.npy" --val-split 1.5
expect_error labels_with_idx_folder "--labels does not apply to --data .*, a folder of IDX files" \
  "${B[@]}" --data /usr/share/datasets/fashion-mnist --labels "$ND/y.npy"
expect_error regression_on_idx "a regression (--loss mse) needs float targets" \
  "${B[@]}" --data /usr/share/datasets/fashion-mnist --loss mse
expect_error regression_outputs "the data has 2 targets per sample, model 'mlp:32,8,1' outputs 1" \
  "${B[@]}" --model mlp:32,8,1 --data "$ND/x_2d.npy" --labels "$ND/t.npy" --loss mse
expect_error regression_test_targets_differ "the test set has 1 target per sample, --data .*x.npy has 2" \
  "${B[@]}" --model mlp:hidden=8 --data "$ND/x.npy" --labels "$ND/t.npy" --test-data "$ND/xt.npy" \
  --test-labels "$ND/yt.npy" --loss mse
expect_error normalize_bad "--normalize 1: expected auto, none or MEAN,STD" \
  "${B[@]}" --data "$ND/x.npy" --labels "$ND/y.npy" --normalize 1
# a refused file leaves an --out folder untouched (nothing is created)
rm -rf "$T/ownbad"
"${B[@]}" --data "$ND/x_big.npy" --labels "$ND/y.npy" --out "$T/ownbad" >/dev/null 2>"$T/ownbad.err"
brc=$?
if [[ $brc -eq 1 ]] && grep -q "big-endian" "$T/ownbad.err" && [[ ! -e "$T/ownbad/checkpoint.bin" && ! -s "$T/ownbad/metrics.jsonl" ]]
then ok npy_bad_file_writes_no_run
else bad npy_bad_file_writes_no_run "exit $brc" "$(cat "$T/ownbad.err")" "$(ls -la "$T/ownbad" 2>&1)"; fi

# --normalize none is recorded as such: eval applies no other; a wide table (2,000 features, its
# normalisation longer than any fixed buffer) round-trips through the export and eval --safetensors
/usr/bin/python3 -c "
import numpy as np; r = np.random.default_rng(5); x = r.normal(0, 3, (300, 2000)).astype(np.float32)
y = (x[:, :10].sum(1) > 0).astype(np.int64); np.save('$ND/w.npy', x[:240]); np.save('$ND/wy.npy', y[:240])
np.save('$ND/wt.npy', x[240:]); np.save('$ND/wty.npy', y[240:])"
for nm in none auto; do
  rm -rf "$T/wide_$nm"
  "$BIN" train --data "$ND/w.npy" --labels "$ND/wy.npy" --test-data "$ND/wt.npy" --test-labels "$ND/wty.npy" \
    --model mlp:hidden=16 --normalize $nm --epochs 3 --batch 40 --lr 0.01 --progress none --out "$T/wide_$nm" \
    >"$T/wide_$nm.log" 2>&1
  wf=$(sed -n 's/^epoch 3\/3 .*\(test loss [0-9.]*  test acc [0-9.]*%\).*/\1/p' "$T/wide_$nm.log")
  "$BIN" eval --ckpt "$T/wide_$nm/checkpoint.bin" --data "$ND/wt.npy" --labels "$ND/wty.npy" >"$T/wide_e.log" 2>&1
  "$BIN" ckpt export "$T/wide_$nm/checkpoint.bin" --safetensors "$T/wide_$nm.st" >/dev/null 2>&1
  "$BIN" eval --safetensors "$T/wide_$nm.st" --data "$ND/wt.npy" --labels "$ND/wty.npy" >"$T/wide_s.log" 2>&1
  ef=$(sed -n 's/.*\(test acc [0-9.]*%\)  \(test loss [0-9.]*\).*/\2  \1/p' "$T/wide_e.log")
  sf=$(sed -n 's/.*\(test acc [0-9.]*%\)  \(test loss [0-9.]*\).*/\2  \1/p' "$T/wide_s.log")
  if [[ -n "$wf" && "$wf" == "$ef" && "$wf" == "$sf" ]]; then ok "wide_table_normalize_${nm}_eval_and_export"
  else bad "wide_table_normalize_${nm}_eval_and_export" "train: $wf" "eval --ckpt: $(cat "$T/wide_e.log")" \
    "eval --safetensors: $(cat "$T/wide_s.log")"; fi
done

# PyTorch evaluates the export of an array run (classes and a regression) from its metadata
# alone (tests/torch/eval_safetensors.py: the per-feature normalisation, the model text) at
# dptrain eval's figures
"$BIN" ckpt export "$T/own1/checkpoint.bin" --safetensors "$T/own1.st" >/dev/null 2>&1
"$BIN" ckpt export "$T/reg1/checkpoint.bin" --safetensors "$T/reg1.st" >/dev/null 2>&1
pa=$(/usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/../torch/eval_safetensors.py" "$T/own1.st" "$ND/xt.npy" \
     "$ND/yt.npy" 2>&1 | sed -n 's/^test acc \([0-9.]*\)%.*/\1/p')
if [[ -n "$pa" && "test acc $pa%" == "${figs#*  }" ]]; then ok npy_export_torch_same_accuracy
else bad npy_export_torch_same_accuracy "PyTorch '$pa', dptrain '${figs#*  }'"; fi
pr=$(/usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/../torch/eval_safetensors.py" "$T/reg1.st" "$ND/xt.npy" \
     "$ND/tt.npy" 2>&1 | sed -n 's/^test rmse \([0-9.e+-]*\) .*/\1/p')
if [[ -n "$pr" && "$pr" == "$rmse" ]]; then ok regression_export_torch_same_rmse
else bad regression_export_torch_same_rmse "PyTorch '$pr', dptrain '$rmse'"; fi
# and dptrain itself from the export alone: the metadata's normalisation, not one of the data's
"$BIN" eval --safetensors "$T/reg1.st" --data "$ND/xt.npy" --labels "$ND/tt.npy" >"$T/regst.log" 2>&1
if grep -q "test rmse $rmse " "$T/regst.log"; then ok regression_eval_safetensors_same_rmse
else bad regression_eval_safetensors_same_rmse "train: $rmse" "$(cat "$T/regst.log")"; fi
