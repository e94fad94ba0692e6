#!/usr/bin/env bash
# The parameter hashes of a fixed list of short runs (issue 28's "no behaviour change" check for a
# refactor): mlp, cnn, resnet and gpt at 1 and 2 workers, ZeRO 3, --balance, --backup-workers,
# the parameter server's deterministic replay and compression.  Run it with the binaries built
# before and after a change and compare the two lists line by line (they must be equal):
#   bash bench/split_hashes.sh OLD/build/dptrain > before.txt
#   bash bench/split_hashes.sh build/dptrain > after.txt && diff before.txt after.txt
# A run the binary refuses prints "refused".  About 1 minute.
set -uo pipefail
B=${1:-build/dptrain}
D=${DP_DATA:-/usr/share/datasets/fashion-mnist}
W=$(mktemp -d /tmp/dptrain-hashes.XXXXXX)
trap 'rm -rf "$W"' EXIT
for i in $(seq 1 200); do echo "hello world, this is a small text for a tiny model, line $i."; done >"$W/t.txt"
"$B" prepare-text "$W/t.txt" --out "$W/t.bin" >/dev/null 2>&1 || { echo "prepare-text failed" >&2; exit 1; }
S=(--data "$D" --train-limit 640 --test-limit 100 --batch 64 --progress none --epochs 1 --lr 0.05)
G=(--data "$W/t.bin" --train-limit 64 --test-limit 16 --batch 16 --progress none --epochs 1 --optim adamw --lr 3e-3)
while IFS= read -r cfg; do
  if [[ $cfg == *gpt* ]]; then a=("${G[@]}"); else a=("${S[@]}"); fi
  # shellcheck disable=SC2086
  h=$("$B" train $cfg "${a[@]}" 2>&1 | sed -n 's/.*param hash \([0-9a-f]*\).*/\1/p')
  printf '%-18s %s\n' "${h:-refused}" "$cfg"
done <<'LIST'
--model mlp --workers 1 --deterministic
--model mlp --workers 2 --deterministic
--model cnn --workers 1 --deterministic
--model cnn --workers 2 --deterministic
--model resnet --workers 1
--model resnet --workers 2
--model resnet --workers 1 --deterministic
--model resnet --workers 2 --deterministic
--model gpt:layers=2,heads=2,dim=32,ctx=16 --workers 1 --deterministic
--model gpt:layers=2,heads=2,dim=32,ctx=16 --workers 2 --deterministic
--model mlp --workers 2 --deterministic --zero 3 --optim adamw
--model mlp --workers 2 --deterministic --balance=2
--model mlp --workers 3 --deterministic --backup-workers 0
--model mlp --workers 3 --mode async --deterministic
--model mlp --workers 2 --compress topk:0.1 --momentum 0.9
--model mlp --workers 2 --compress powersgd:2
LIST
