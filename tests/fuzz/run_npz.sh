#!/usr/bin/env bash
# Fuzzes the .npz glue (dp_npz_parse: libzip, then the .npy reader on the member) with
# libFuzzer + ASan + UBSan for $1 seconds (default 10).  Exits non-zero if the fuzzer finds a
# crash or a violated contract; the input is saved as tests/fuzz/findings-npz/crash-*.  Seeds:
# archives numpy writes (savez, savez_compressed), made here with Python's zipfile from .npy
# bytes, and a few broken ones.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
out=$(mktemp -d /tmp/dptrain-fuzz-npz.XXXXXX)
trap 'rm -rf "$out"' EXIT
mkdir -p tests/fuzz/findings-npz
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc -fsanitize=address,undefined -fno-sanitize-recover=undefined)
clang "${flags[@]}" -fsanitize=fuzzer -o "$out/fuzz" tests/fuzz/fuzz_npz.c src/data/npz.c src/data/npy.c \
  src/data/cache.c src/core/error.c src/core/alloc.c src/core/file.c src/core/util.c -lzip -lz -lm -lpthread
c="$out/corpus"
mkdir -p "$c"
# the seeds: an .npy member x stored and deflated, another member name, a member cut short
python3 - "$c" <<'PY'
import io, struct, sys, zipfile
d = sys.argv[1]
def npy(descr, shape, data):
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    pad = (10 + len(h) + 1 + 63) // 64 * 64 - 10
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", pad) + (h + " " * (pad - len(h) - 1) + "\n").encode() + data
x = npy("<f4", "(2, 3)", struct.pack("<6f", *range(6)))
for name, comp, members in (("stored", zipfile.ZIP_STORED, {"x.npy": x, "y.npy": npy("<i8", "(2,)", b"\0" * 16)}),
                            ("deflated", zipfile.ZIP_DEFLATED, {"x.npy": x}),
                            ("other", zipfile.ZIP_STORED, {"z.npy": x}),
                            ("cut", zipfile.ZIP_STORED, {"x.npy": x[:40]}),
                            # a member name with a newline: the fuzzer's find of 2026-12-06 (the
                            # list of arrays in the message broke its one line)
                            ("ctrl", zipfile.ZIP_STORED, {"a\nb.npy": x})):
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", comp) as z:
        for k, v in members.items():
            z.writestr(k, v)
    open(f"{d}/{name}.npz", "wb").write(b.getvalue())
open(f"{d}/truncated.npz", "wb").write(open(f"{d}/deflated.npz", "rb").read()[:60])
PY
"$out/fuzz" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 -artifact_prefix=tests/fuzz/findings-npz/ "$c"
