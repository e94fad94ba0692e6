# Model files, --model-file (sourced by tests/cli.sh: its helpers, BIN, DATA, T, SMALL): the
# shipped models/*.txt train to the spec strings' bits; a user's file trains on 2 workers to
# the 1-worker bits; the checkpoint carries the model (resume, eval, export need no option, a
# different architecture is refused with its first differing line); mistakes are one line.
MODELS=$(dirname "${BASH_SOURCE[0]}")/../../models

# the built-in models, from their files and from their specs: the same bits
for m in mlp cnn resnet; do
  hs=$("$BIN" train --model "$m" --epochs 1 "${SMALL[@]}" --train-limit 300 --workers 1 2>&1 | sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p')
  hf=$("$BIN" train --model-file "$MODELS/$m.txt" --epochs 1 "${SMALL[@]}" --train-limit 300 --workers 1 2>&1 |
       sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p')
  if same_hash "$hs" "$hf"; then ok "model_file_${m}_same_bits_as_spec"
  else bad "model_file_${m}_same_bits_as_spec" "spec $hs, file $hf"; fi
done

# a model of the user's own: two convolutions (32, 64) with BatchNorm, a residual block,
# dropout, global pooling; 2 workers give the 1-worker bits in deterministic mode (each fixed
# chunk normalised with its own statistics: docs/ddp.md "Deterministic mode")
cat >"$T/mine.txt" <<'EOF'
# my model
input 1 28 28
conv2d c1 out=32 kernel=3 pad=1
batchnorm bn1
relu r1
maxpool p1 kernel=2
conv2d c2 out=64 kernel=3 pad=1 stride=2   # 7x7
batchnorm bn2
relu r2
resblock res1 out=64
dropout d1 p=0.1
global_avgpool gap
linear head out=10
EOF
rm -rf "$T/mine1" "$T/mine2"
"$BIN" train --model-file "$T/mine.txt" --epochs 1 "${SMALL[@]}" --deterministic --workers 1 --out "$T/mine1" >"$T/mine1.log" 2>&1
"$BIN" train --model-file "$T/mine.txt" --epochs 1 "${SMALL[@]}" --deterministic --workers 2 --out "$T/mine2" >"$T/mine2.log" 2>&1
h1=$(hash_of "$T/mine1/checkpoint.bin") h2=$(hash_of "$T/mine2/checkpoint.bin")
if same_hash "$h1" "$h2" && grep -q "^dptrain: model file:mine.txt (" "$T/mine2.log"; then ok model_file_two_workers_same_bits
else bad model_file_two_workers_same_bits "1 worker $h1, 2 workers $h2" "$(tail -2 "$T/mine2.log")"; fi

# the same file under mpirun (2 processes x 1 worker), and with ZeRO-3 sharding the model
# state over 2 workers: the 1-worker bits
rm -rf "$T/minempi" "$T/minez3"
timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train --model-file "$T/mine.txt" --epochs 1 "${SMALL[@]}" --deterministic \
  --workers 1 --out "$T/minempi" >"$T/minempi.log" 2>&1
"$BIN" train --model-file "$T/mine.txt" --epochs 1 "${SMALL[@]}" --deterministic --workers 2 --zero 3 \
  --out "$T/minez3" >"$T/minez3.log" 2>&1
hm=$(hash_of "$T/minempi/checkpoint.bin") hz=$(hash_of "$T/minez3/checkpoint.bin")
if same_hash "$h1" "$hm" && same_hash "$h1" "$hz"; then ok model_file_mpi_and_zero3_same_bits
else bad model_file_mpi_and_zero3_same_bits "1 worker $h1, mpirun -np 2 $hm, --zero 3 $hz" "$(tail -2 "$T/minempi.log")" "$(tail -2 "$T/minez3.log")"; fi

# the checkpoint carries the model: a resume (no --model-file, the file gone) continues to an
# uninterrupted run's bits; eval and export need no option
cp "$T/mine.txt" "$T/mine-moved.txt"
rm -rf "$T/mine3" "$T/minestraight"
"$BIN" train --model-file "$T/mine-moved.txt" --epochs 2 "${SMALL[@]}" --deterministic --workers 2 --out "$T/minestraight" >/dev/null 2>&1
"$BIN" train --model-file "$T/mine-moved.txt" --epochs 1 "${SMALL[@]}" --deterministic --workers 2 --out "$T/mine3" >/dev/null 2>&1
rm -f "$T/mine-moved.txt"
"$BIN" train --resume "$T/mine3/checkpoint.bin" --out "$T/mine3" --epochs 2 >"$T/mine3r.log" 2>&1
if same_hash "$(hash_of "$T/minestraight/checkpoint.bin")" "$(hash_of "$T/mine3/checkpoint.bin")"; then ok model_file_resume_without_file
else bad model_file_resume_without_file "$(tail -2 "$T/mine3r.log")"; fi
"$BIN" eval --ckpt "$T/mine1/checkpoint.bin" --data "$DATA" --test-limit 500 >"$T/mine.eval" 2>&1
a=$(test_acc_of "$T/mine.eval") a1=$(test_acc_of "$T/mine1.log")
a1=${a1%,}
if [[ -n $a && $a == "$a1" ]] && grep -q "^model file:mine.txt" "$T/mine.eval"; then ok model_file_eval_from_checkpoint
else bad model_file_eval_from_checkpoint "eval '$a', training's last '$a1'" "$(tail -2 "$T/mine.eval")"; fi
if "$BIN" ckpt export "$T/mine1/checkpoint.bin" --safetensors "$T/mine.st" >/dev/null 2>&1 &&
   "$BIN" eval --safetensors "$T/mine.st" --model-file "$T/mine.txt" --data "$DATA" --test-limit 500 >"$T/mine.st.eval" 2>&1 &&
   [[ $(test_acc_of "$T/mine.st.eval") == "$a1" ]]; then ok model_file_export_and_eval
else bad model_file_export_and_eval "$(tail -2 "$T/mine.st.eval" 2>/dev/null)"; fi
# PyTorch rebuilds the model file's model from the export alone (tests/torch/eval_safetensors.py):
# the accuracy of dptrain eval on the same 500 images, to one image
if /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
  p=$(/usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/../torch/eval_safetensors.py" "$T/mine.st" "$DATA" 500 2>&1 |
      sed -n 's/^test acc \([0-9.]*\)%.*/\1/p')
  if [[ -n $p && -n $a1 ]] && awk -v a="$a1" -v p="$p" 'BEGIN { d = a - p; exit !(d <= 0.2 && d >= -0.2) }'; then
    ok "model_file_torch_same_accuracy (dptrain $a1%, PyTorch $p%)"
  else bad model_file_torch_same_accuracy "dptrain '$a1', PyTorch '$p'"; fi
else skip model_file_torch_same_accuracy "no python3-torch (scripts/install-deps.sh --torch)"; fi
# the export holds the model's text too: eval needs no option, and a C-API model's likewise
"$BIN" eval --safetensors "$T/mine.st" --data "$DATA" --test-limit 500 >"$T/mine.st.eval2" 2>&1
if [[ $(test_acc_of "$T/mine.st.eval2") == "$a1" ]] && grep -q "^model file:mine.txt" "$T/mine.st.eval2"; then
  ok model_file_safetensors_carries_model
else bad model_file_safetensors_carries_model "$(tail -2 "$T/mine.st.eval2")"; fi

# a language model of the user's own (embedding, a bare attention layer, a position-wise linear
# and GELU, a transformer block, the tied head): PyTorch rebuilds it from the export alone and
# gets dptrain eval's validation loss
for i in $(seq 1 60); do echo "the quick brown fox $i jumps over the lazy dog, line $i of a small text."; done >"$T/fox.txt"
cat >"$T/tok.txt" <<'EOF'
input tokens 16
embedding tok pos=pos vocab=256 dim=32
layernorm ln0
attention att heads=4
linear mix out=32
gelu g
transformer_block blocks.0 heads=2
layernorm ln_f
lm_head lm_head tied=tok.weight
loss cross_entropy
EOF
if "$BIN" prepare-text "$T/fox.txt" --out "$T/fox.bin" >"$T/fox.log" 2>&1 &&
   "$BIN" train --model-file "$T/tok.txt" --data "$T/fox.bin" --epochs 1 --batch 16 --lr 3e-3 --optim adamw \
     --progress none --out "$T/tokm" >>"$T/fox.log" 2>&1 &&
   "$BIN" ckpt export "$T/tokm/checkpoint.bin" --safetensors "$T/tokm.st" >>"$T/fox.log" 2>&1 &&
   "$BIN" eval --safetensors "$T/tokm.st" --data "$T/fox.bin" >"$T/tokm.eval" 2>&1; then
  dl=$(awk '{for (i = 2; i <= NF; i++) if ($(i-1) == "val" && $i == "loss") print $(i+1)}' "$T/tokm.eval")
  if /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
    tl=$(/usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/../torch/eval_safetensors.py" "$T/tokm.st" "$T/fox.bin" 2>&1 |
         sed -n 's/^val loss \([0-9.]*\)  token acc .*/\1/p')
    if [[ -n $dl && -n $tl ]] && awk -v a="$dl" -v b="$tl" 'BEGIN {exit !(a - b <= 0.002 && b - a <= 0.002)}'; then
      ok "model_file_token_model_torch_same_loss (dptrain $dl, PyTorch $tl)"
    else bad model_file_token_model_torch_same_loss "dptrain '$dl', PyTorch '$tl'"; fi
  else skip model_file_token_model_torch_same_loss "no python3-torch (scripts/install-deps.sh --torch)"; fi
else bad model_file_token_model_torch_same_loss "$(tail -3 "$T/fox.log" "$T/tokm.eval" 2>/dev/null)"; fi

# another architecture is refused on resume, with the first line that differs
sed 's/out=64/out=48/' "$T/mine.txt" >"$T/other.txt"
expect_error model_file_resume_other_architecture "checkpoint is for model 'file:mine.txt', this run builds 'file:other.txt' (the checkpoint has 'conv2d c2 out=64 kernel=3 stride=2 pad=1 bias=1' where this run has 'conv2d c2 out=48" \
  "$BIN" train --resume "$T/mine1/checkpoint.bin" --out "$T/mine1" --epochs 2 --model-file "$T/other.txt"

# mistakes: one line each, naming the file and the line
printf 'input 1 28 28\nflatten f\nlinear fc out=10 widht=3\n' >"$T/typo.txt"
expect_error model_file_typo_named "$T/typo.txt:3: linear: unknown key 'widht' (linear takes out, bias)" \
  "$BIN" train --model-file "$T/typo.txt" "${SMALL[@]}"
expect_error model_file_missing "model file $T/nope.txt: No such file" "$BIN" train --model-file "$T/nope.txt" "${SMALL[@]}"
expect_error model_file_and_spec "--model cnn and --model-file $T/mine.txt: give one" \
  "$BIN" train --model cnn --model-file "$T/mine.txt" "${SMALL[@]}"
printf 'input 3 32 32\nflatten f\nlinear fc out=10\n' >"$T/rgb.txt"
expect_error model_file_input_mismatch "model $T/rgb.txt declares input 3 32 32, the data's samples are 1 x 28 x 28" \
  "$BIN" train --model-file "$T/rgb.txt" "${SMALL[@]}"
