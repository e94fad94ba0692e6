# Text beyond bytes (issue 29, N5; sourced by tests/cli.sh: its helpers, BIN, T): prepare-text
# --vocab V learns a BPE beside the token file; a gpt trains on it and reports its validation loss
# in bits per byte; the checkpoint keeps the tokenizer, so sample needs no option; a tokenizer that
# is not the token file's is refused; an llm.c shard is read as a token file.
BT="$T/bpe"
mkdir -p "$BT/txt"
cp "$(dirname "${BASH_SOURCE[0]}")"/../../docs/*.md "$BT/txt/"
"$BIN" prepare-text "$BT/txt" --vocab 400 --out "$BT/tok.bin" >"$BT/prep.log" 2>&1
bpt=$(sed -n 's/.*(vocab 400, \([0-9.]*\) bytes\/token).*/\1/p' "$BT/prep.log")
if [[ -s "$BT/tok.bin.bpe" ]] && awk -v b="$bpt" 'BEGIN {exit !(b > 1.5)}'; then ok bpe_prepare_text_vocab
else bad bpe_prepare_text_vocab "bytes/token '$bpt'" "$(cat "$BT/prep.log")"; fi
# the same twice: the same tokenizer and tokens (deterministic)
"$BIN" prepare-text "$BT/txt" --vocab 400 --out "$BT/tok2.bin" >/dev/null 2>&1
if cmp -s "$BT/tok.bin" "$BT/tok2.bin" && cmp -s "$BT/tok.bin.bpe" "$BT/tok2.bin.bpe"; then ok bpe_deterministic
else bad bpe_deterministic "two prepare-text --vocab 400 runs differ"; fi

# a gpt over the 400 tokens: bits per byte below the loss / ln 2 by the bytes each token covers
GB=(--model gpt:layers=1,heads=2,dim=32,ctx=16,vocab=400 --data "$BT/tok.bin" --batch 16 --optim adamw --lr 3e-3
    --max-steps 40 --test-limit 40 --progress none)
rm -rf "$BT/run"
"$BIN" train "${GB[@]}" --workers 2 --out "$BT/run" >"$BT/train.log" 2>&1
line=$(grep '^eval step 40' "$BT/train.log" | tail -1)
loss=$(sed -n 's/.*val loss \([0-9.]*\).*/\1/p' <<<"$line") bpb=$(sed -n 's/.*val bpb \([0-9.]*\).*/\1/p' <<<"$line")
if awk -v l="$loss" -v b="$bpb" -v t="$bpt" 'BEGIN {r = l / log(2) / b; exit !(l > 0 && b > 0 && r > 1.2 && r < 2 * t)}'
then ok bpe_train_bits_per_byte
else bad bpe_train_bits_per_byte "loss '$loss', bpb '$bpb', bytes/token $bpt" "$(tail -3 "$BT/train.log")"; fi
# sample from the checkpoint alone: the prompt, encoded and decoded by the checkpoint's tokenizer,
# comes back as the output's start
out=$("$BIN" sample --ckpt "$BT/run/checkpoint.bin" --prompt "The data-parallel trainer" --tokens 10 2>&1)
if [[ $out == "The data-parallel trainer"* ]]; then ok bpe_sample_uses_checkpoint_tokenizer
else bad bpe_sample_uses_checkpoint_tokenizer "$out"; fi
# a tokenizer beside the token file that is not its own: refused
"$BIN" prepare-text "$BT/txt" --vocab 300 --out "$BT/other.bin" >/dev/null 2>&1
cp "$BT/other.bin.bpe" "$BT/tok2.bin.bpe"
expect_error bpe_foreign_tokenizer_refused "tok2.bin.bpe has 300 tokens, its token file .*tok2.bin a vocabulary of 400" \
  "$BIN" train "${GB[@]}" --data "$BT/tok2.bin"

# an llm.c shard (256 int32 header: magic 20240520, version 1, the count; then uint16 tokens) is a
# token file: the same tokens as dptrain's own file train to the same bits
/usr/bin/python3 - "$BT" <<'EOF'
import struct, sys
d = sys.argv[1]
raw = open(f"{d}/tok.bin", "rb").read()[32:]  # dptrain's token file: a 32-byte header, then uint16 tokens
n = len(raw) // 2
open(f"{d}/shard.bin", "wb").write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + raw)
EOF
rm -rf "$BT/own" "$BT/llmc"
GL=(--model gpt:layers=1,heads=2,dim=32,ctx=16,vocab=400 --batch 16 --max-steps 10 --test-limit 10 --progress none
    --deterministic --workers 1)
"$BIN" train "${GL[@]}" --data "$BT/tok.bin" --out "$BT/own" >/dev/null 2>&1
"$BIN" train "${GL[@]}" --data "$BT/shard.bin" --out "$BT/llmc" >"$BT/llmc.log" 2>&1
ho=$(hash_of "$BT/own/checkpoint.bin") hl=$(hash_of "$BT/llmc/checkpoint.bin")
if same_hash "$ho" "$hl"; then ok llmc_shard_trains_same_bits
else bad llmc_shard_trains_same_bits "dptrain's file $ho, the shard $hl" "$(tail -2 "$BT/llmc.log")"; fi

# nanoGPT's train.bin (raw uint16 tokens, no header) with --data-format u16: the same tokens train
# to the same bits as dptrain's own file; without the option it is refused as not a token file
tail -c +33 "$BT/tok.bin" >"$BT/train.bin"
rm -rf "$BT/nano"
"$BIN" train "${GL[@]}" --data "$BT/train.bin" --data-format u16 --out "$BT/nano" >"$BT/nano.log" 2>&1
hn=$(hash_of "$BT/nano/checkpoint.bin")
if same_hash "$ho" "$hn"; then ok nanogpt_raw_u16_trains_same_bits
else bad nanogpt_raw_u16_trains_same_bits "dptrain's file $ho, raw u16 $hn" "$(tail -2 "$BT/nano.log")"; fi
expect_error nanogpt_raw_needs_format "train.bin is not a token file" "$BIN" train "${GL[@]}" --data "$BT/train.bin"
