# Folders of images (issue 29, N3; sourced by tests/cli.sh: its helpers, BIN, T): DIR/<class>/*.png
# decoded once into the cache and trained on, the same bits as the same pixels in an .npy and for
# 1, 2 and 3 workers; --image-size resizes; the class names travel in the checkpoint and the
# export; a corrupt image is one line naming it, or skipped and counted with --skip-bad-images.
IM="$T/imgs"
mkdir -p "$IM"
# 3 classes x 60 grey 12x10 PNGs (a class is a brightness pattern plus noise), written with zlib
# alone; the same pixels, in the folder's order (class by class, names sorted), as an .npy pair
/usr/bin/python3 - "$IM" <<'EOF'
import os, struct, sys, zlib
import numpy as np
d = sys.argv[1]
r = np.random.default_rng(3)
def png(path, img):
    h, w = img.shape
    raw = b"".join(b"\0" + row.tobytes() for row in img)
    chunk = lambda t, b: struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xffffffff)
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) +
                           chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
X, Y = [], []
for c, name in enumerate(["cat", "dog", "emu"]):  # (already in name order)
    os.makedirs(f"{d}/train/{name}", exist_ok=True)
    base = r.integers(0, 256, (12, 10))
    for k in range(60):
        img = np.clip(base + r.normal(0, 60, (12, 10)), 0, 255).astype(np.uint8)
        png(f"{d}/train/{name}/{k:03d}.png", img)
        X.append(img), Y.append(c)
np.save(f"{d}/x.npy", np.array(X).reshape(-1, 1, 12, 10)), np.save(f"{d}/y.npy", np.array(Y, np.int64))
# a folder with one image cut short, and one with other classes
os.makedirs(f"{d}/bad", exist_ok=True)
for name in ["cat", "dog"]:
    os.makedirs(f"{d}/bad/{name}", exist_ok=True)
    for k in range(5):
        png(f"{d}/bad/{name}/{k}.png", X[k])
open(f"{d}/bad/dog/2.png", "r+b").truncate(40)
os.makedirs(f"{d}/other/ant", exist_ok=True), os.makedirs(f"{d}/other/bee", exist_ok=True)
for name in ["ant", "bee"]:
    png(f"{d}/other/{name}/0.png", X[0])
EOF
IMR=(--model mlp:hidden=16 --batch 30 --lr 0.05 --momentum 0.9 --epochs 2 --progress none --deterministic
     --val-split 0.2)
hi=()
for P in 1 2 3; do
  rm -rf "$T/imr$P"
  "$BIN" train --data "$IM/train" "${IMR[@]}" --workers $P --out "$T/imr$P" >"$T/imr$P.log" 2>&1
  hi+=("$(hash_of "$T/imr$P/checkpoint.bin")")
done
rm -rf "$T/imnpy"
"$BIN" train --data "$IM/x.npy" --labels "$IM/y.npy" "${IMR[@]}" --workers 1 --out "$T/imnpy" >/dev/null 2>&1
hn=$(hash_of "$T/imnpy/checkpoint.bin")
if same_hash "${hi[0]}" "${hi[1]}" && same_hash "${hi[0]}" "${hi[2]}" && same_hash "${hi[0]}" "$hn"; then
  ok images_workers_same_bits_as_npy
else bad images_workers_same_bits_as_npy "P=1 ${hi[0]}, P=2 ${hi[1]}, P=3 ${hi[2]}, .npy $hn" "$(tail -2 "$T/imr3.log")"; fi
if grep -q "^data: $IM/train: 180 images in 3 classes, 1 x 12 x 10 (decoded now into the cache folder)" "$T/imr1.log" &&
   grep -q "^data: $IM/train: 180 images in 3 classes, 1 x 12 x 10 (its arrays in the cache folder reused)" "$T/imr2.log"
then ok images_decoded_once; else bad images_decoded_once "$(grep '^data:' "$T/imr1.log" "$T/imr2.log")"; fi

# the class names travel: in the export's metadata; a resume on other classes is refused
"$BIN" ckpt export "$T/imr1/checkpoint.bin" --safetensors "$T/imr1.st" >/dev/null 2>&1
if grep -aq '"class_names":"cat,dog,emu"' "$T/imr1.st"; then ok images_class_names_exported
else bad images_class_names_exported "$(head -c 600 "$T/imr1.st" | tr -c '[:print:]' '.')"; fi
expect_error images_resume_other_classes "was trained on other classes than --data" \
  "$BIN" train --resume "$T/imr1/checkpoint.bin" --out "$T/imr1" --epochs 3 --data "$IM/other" --progress none

# eval of the checkpoint on the folder (its held-out part, the split keyed by the run's seed)
"$BIN" eval --ckpt "$T/imr1/checkpoint.bin" --data "$IM/train" --val-split 0.2 >"$T/imev.log" 2>&1
tf=$(sed -n 's/^epoch 2\/2 .*\(test loss [0-9.]*  test acc [0-9.]*%\).*/\1/p' "$T/imr1.log")
ef=$(sed -n 's/.*\(test acc [0-9.]*%\)  \(test loss [0-9.]*\).*/\2  \1/p' "$T/imev.log")
if [[ -n "$tf" && "$tf" == "$ef" ]]; then ok images_eval_held_out
else bad images_eval_held_out "train: $tf" "eval: $(cat "$T/imev.log")"; fi

# --image-size: resized and centre-cropped; a cnn takes the 3-channel 16x16 samples
"$BIN" train --data "$IM/train" --image-size 16,16 --image-channels 3 --model cnn --epochs 1 --batch 30 \
  --val-split 0.2 --progress none >"$T/imsz.log" 2>&1
if grep -q "^data: $IM/train: 180 images in 3 classes, 3 x 16 x 16" "$T/imsz.log" && grep -q "^done: .*test acc" "$T/imsz.log"
then ok images_resize_cnn; else bad images_resize_cnn "$(grep -E '^data|error|done' "$T/imsz.log")"; fi

# a corrupt image: one line naming it, or skipped and counted
expect_error images_corrupt_named "bad/dog/2.png: corrupt or truncated PNG" \
  "$BIN" train --data "$IM/bad" --model mlp --epochs 1 --progress none
"$BIN" train --data "$IM/bad" --skip-bad-images --model mlp:hidden=8 --epochs 1 --progress none >"$T/imskip.log" 2>&1
if grep -q "^data: $IM/bad: 9 images in 2 classes.*; skipped 1 bad image, the first .*dog/2.png" "$T/imskip.log"
then ok images_skip_bad_counted; else bad images_skip_bad_counted "$(grep -E '^data|error' "$T/imskip.log")"; fi
expect_error images_labels_refused "a folder of images holds its labels" \
  "$BIN" train --data "$IM/train" --labels "$IM/y.npy" --epochs 1 --progress none
expect_error images_size_bad "--image-size 16: expected H,W" \
  "$BIN" train --data "$IM/train" --image-size 16 --epochs 1 --progress none
