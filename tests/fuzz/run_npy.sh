#!/usr/bin/env bash
# Fuzzes the .npy reader (dp_npy_parse) with libFuzzer + ASan + UBSan for $1 seconds (default
# 10).  Exits non-zero if the fuzzer finds a crash or a violated contract; the input is saved
# as tests/fuzz/findings-npy/crash-*.  Seeds: a file of each dtype and shape form numpy writes
# (version 1.0 and 2.0), and the layouts it refuses (Fortran order, big-endian, object,
# structured).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
out=$(mktemp -d /tmp/dptrain-fuzz-npy.XXXXXX)
trap 'rm -rf "$out"' EXIT
mkdir -p tests/fuzz/findings-npy
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc -fsanitize=address,undefined -fno-sanitize-recover=undefined)
clang "${flags[@]}" -fsanitize=fuzzer -o "$out/fuzz" tests/fuzz/fuzz_npy.c src/data/npy.c src/core/error.c src/core/file.c \
  src/core/alloc.c -lm -lpthread
c="$out/corpus"
mkdir -p "$c"
# seed NAME MAJOR DICT DATA-BYTES: magic, version, header length, the dict padded to 64 with '\n'
seed() {
  local dict=$3 pre=10; [[ $2 == 1 ]] || pre=12
  local hl=$(( ((pre + ${#dict} + 1 + 63) / 64) * 64 - pre ))
  { printf '\x93NUMPY'; printf "\\x$(printf %02x "$2")\\x00"
    printf "\\x$(printf %02x $((hl & 255)))\\x$(printf %02x $((hl >> 8 & 255)))"
    [[ $pre == 12 ]] && printf '\x00\x00'
    printf '%s' "$dict"; printf '%*s' $((hl - ${#dict} - 1)) ''; printf '\n'
    head -c "$4" /dev/zero; } >"$c/$1"
}
seed f4.npy 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }" 48
seed f8.npy 1 "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }" 16
seed u1.npy 1 "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 2), }" 8
seed i8.npy 2 "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 1), }" 8
seed b1.npy 1 "{'descr': '|b1', 'fortran_order': False, 'shape': (), }" 1
seed i2.npy 1 "{\"descr\": \"<i2\", \"shape\": (0, 3), \"fortran_order\": False}" 0
seed fortran.npy 1 "{'descr': '<f8', 'fortran_order': True, 'shape': (3, 2), }" 48
seed big.npy 1 "{'descr': '>i4', 'fortran_order': False, 'shape': (5,), }" 20
seed object.npy 1 "{'descr': '|O', 'fortran_order': False, 'shape': (3,), }" 24
seed struct.npy 1 "{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (3,), }" 24
"$out/fuzz" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 -artifact_prefix=tests/fuzz/findings-npy/ "$c"
