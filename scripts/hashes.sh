#!/usr/bin/env bash
# The parameter hashes of a fixed set of short runs, one "name hash" line each: a change that
# must not change behaviour (a refactor) leaves every line as it was on the same machine.
#   bash scripts/hashes.sh [BIN] > /tmp/before.txt   ... change, make ...
#   bash scripts/hashes.sh [BIN] > /tmp/after.txt && diff /tmp/before.txt /tmp/after.txt
# Deterministic runs at P = 1 and P = 2 (the same hash: bit-identical for any worker count;
# not the parameter server's, whose updates depend on the worker count), resnet (BatchNorm:
# no --deterministic) and the modes that are reproducible at a fixed worker count only (compression; backup
# workers with one rank slowed 20x so that it is the one dropped).  About 1 minute.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/dptrain}
DATA=${DP_DATA:-/usr/share/datasets/fashion-mnist}
W=$(mktemp -d /tmp/dptrain-hashes.XXXXXX); trap 'rm -rf "$W"' EXIT
"$BIN" prepare-text --out "$W/fortunes.bin" >/dev/null 2>&1 || { echo "prepare-text failed" >&2; exit 1; }
IMG0=(--data "$DATA" --train-limit 600 --test-limit 200 --batch 50 --progress none --epochs 2)
IMG=("${IMG0[@]}" --lr 0.05 --momentum 0.9)
ADAM=("${IMG0[@]}" --optim adamw --lr 0.001)
GPT=(--model gpt:layers=2,heads=2,dim=32,ctx=16 --data "$W/fortunes.bin" --train-limit 256 --test-limit 64 --batch 16
     --progress none --epochs 1 --optim adamw --lr 3e-3)
one() { # one NAME ARGS...: the run's "param hash" as NAME HASH (or NAME ERROR and the reason)
  local name=$1; shift
  local h; h=$("$BIN" train "$@" 2>&1 | sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p' | tail -1)
  if [[ -n $h ]]; then echo "$name $h"; else echo "$name ERROR: $("$BIN" train "$@" 2>&1 | tail -1)"; fi
}
for p in 1 2; do
  one "mlp.P$p" --model mlp "${IMG[@]}" --deterministic --workers $p
  one "cnn.P$p" --model cnn "${IMG[@]}" --deterministic --workers $p
  one "resnet.P$p" --model resnet "${IMG[@]}" --train-limit 100 --epochs 1 --workers $p # (BatchNorm: not --deterministic)
  one "gpt.P$p" "${GPT[@]}" --deterministic --workers $p
  one "mlp.zero3.P$p" --model mlp "${ADAM[@]}" --deterministic --workers $p --zero 3
  one "mlp.balance.P$p" --model mlp "${IMG[@]}" --deterministic --workers $p --balance=3
  one "mlp.async.P$p" --model mlp "${IMG[@]}" --deterministic --workers $p --mode async
  one "mlp.ssp0.P$p" --model mlp "${IMG[@]}" --deterministic --workers $p --staleness 0
done
one "cnn.zero3.P2" --model cnn "${ADAM[@]}" --deterministic --workers 2 --zero 3
one "mlp.powersgd.P2" --model mlp "${IMG[@]}" --workers 2 --compress powersgd:2
one "mlp.bf16.P2" --model mlp "${IMG[@]}" --workers 2 --compress bf16
one "mlp.topk.P2" --model mlp "${IMG[@]}" --workers 2 --compress topk:0.1
one "mlp.backup.P3" --model mlp "${IMG[@]}" --workers 3 --backup-workers 1 --simulate-slow 2:20
