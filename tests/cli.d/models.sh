# The spec strings' variants (sourced by tests/cli.sh: its helpers, BIN, DATA, T, SMALL):
# cnn:C1,C2[,F], resnet:DEPTH[,WIDTH] and mlp's dropout train, and their exports load in
# PyTorch (tests/torch/eval_safetensors.py rebuilds each from the file's shapes) at dptrain
# eval's accuracy on the same 500 test images, to one image.
for m in cnn:16,32,64 resnet:14,16 mlp:784,128,10,dropout=0.2; do
  n=${m%%:*}
  rm -rf "$T/var_$n"
  if ! "$BIN" train --model "$m" --epochs 1 "${SMALL[@]}" --out "$T/var_$n" >"$T/var_$n.log" 2>&1; then
    bad "model_variant_$n" "$(tail -2 "$T/var_$n.log")"; continue
  fi
  "$BIN" eval --ckpt "$T/var_$n/checkpoint.bin" --data "$DATA" --test-limit 500 >"$T/var_$n.eval" 2>&1
  a=$(test_acc_of "$T/var_$n.eval")
  if ! /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
    skip "model_variant_$n" "no python3-torch (scripts/install-deps.sh --torch)"; continue
  fi
  "$BIN" ckpt export "$T/var_$n/checkpoint.bin" --safetensors "$T/var_$n.st" >/dev/null 2>&1
  p=$(/usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/../torch/eval_safetensors.py" "$T/var_$n.st" "$DATA" 500 2>&1 | sed -n 's/^test acc \([0-9.]*\)%.*/\1/p')
  if [[ -n $a && -n $p ]] && awk -v a="$a" -v p="$p" 'BEGIN { d = a - p; exit !(d <= 0.2 && d >= -0.2) }'; then
    ok "model_variant_$n ($m: dptrain $a%, PyTorch $p%)"
  else bad "model_variant_$n" "$m: dptrain eval '$a', PyTorch '$p'" "$(tail -2 "$T/var_$n.eval")"; fi
done
expect_error model_resnet_depth_named "depth 18 is not 6n" "$BIN" train --model resnet:18 "${SMALL[@]}"
