#!/usr/bin/env bash
# Fuzzes the image decoders (dp_image_decode: libpng and libjpeg behind this project's error
# handling, conversion and resize) with libFuzzer + ASan + UBSan for $1 seconds (default 10).
# Exits non-zero if the fuzzer finds a crash, a violated contract or output on stderr from a
# library (library code never prints); the input is saved as tests/fuzz/findings-image/crash-*.
# Seeds: PNGs of every colour type (grey, grey + alpha, RGB, RGBA, palette with tRNS, 16-bit,
# 1-bit, interlaced), written here with python3's zlib and struct, and JPEGs (grey, RGB with
# and without chroma subsampling, progressive, CMYK) written by a small C program through
# libjpeg.  libpng and libjpeg themselves are the system's, not instrumented: the fuzzer checks
# what this project makes of them.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
out=$(mktemp -d /tmp/dptrain-fuzz-image.XXXXXX)
trap 'rm -rf "$out"' EXIT
mkdir -p tests/fuzz/findings-image
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc -fsanitize=address,undefined -fno-sanitize-recover=undefined)
clang "${flags[@]}" -fsanitize=fuzzer -o "$out/fuzz" tests/fuzz/fuzz_image.c src/data/image.c src/core/error.c \
  src/core/alloc.c -lpng -ljpeg -lm -lpthread
c="$out/corpus"
mkdir -p "$c"

# PNG seeds: png(name, width, height, bit depth, colour type, the raw rows, each a filter byte first)
/usr/bin/python3 - "$c" <<'PY'
import struct, sys, zlib
def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
def png(name, w, h, depth, ct, rows, interlace=0, extra=b""):
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ct, 0, 0, interlace)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    open(f"{sys.argv[1]}/{name}", "wb").write(data)
png("grey.png", 2, 2, 8, 0, b"\x00\x10\x20\x01\x30\x40")
png("grey-alpha.png", 2, 1, 8, 4, b"\x00\x10\xff\x20\x00")
png("rgb.png", 2, 2, 8, 2, b"\x00" + bytes(range(6)) + b"\x02" + bytes(range(6, 12)))
png("rgba.png", 1, 2, 8, 6, b"\x00\x01\x02\x03\x04\x00\x05\x06\x07\x08")
png("palette.png", 3, 1, 4, 3, b"\x00\x12\x00",
    extra=chunk(b"PLTE", bytes([10, 20, 30, 40, 50, 60, 255, 255, 255])) + chunk(b"tRNS", b"\x00"))
png("grey16.png", 2, 1, 16, 0, b"\x00\x12\x34\xff\xff")
png("bits.png", 9, 1, 1, 0, b"\x00\xa5\x80")
# 3x3 interlaced: the Adam7 passes that hold pixels, 1, 4, 5, 6 (two rows), 7, each row a filter byte first
png("adam7.png", 3, 3, 8, 0, b"\x00\x01" b"\x00\x02" b"\x00\x03\x04" b"\x00\x05\x00\x06" b"\x00\x07\x08\x09",
    interlace=1)
PY

# JPEG seeds, through libjpeg's encoder
cat >"$out/mkjpeg.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <jpeglib.h>
static void put(const char *path, int w, int h, int comps, int sub, int prog) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    FILE *f = fopen(path, "wb");
    if (!f) exit(1);
    jpeg_stdio_dest(&c, f);
    c.image_width = w, c.image_height = h, c.input_components = comps;
    c.in_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 75, TRUE);
    if (!sub) for (int i = 0; i < c.num_components; i++) c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
    if (prog) jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    unsigned char row[64 * 4];
    while (c.next_scanline < c.image_height) {
        for (int i = 0; i < w * comps; i++) row[i] = (unsigned char)(i * 9 + c.next_scanline * 31);
        JSAMPROW r = row;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(f);
}
int main(int argc, char **argv) {
    char p[4096];
    (void)argc;
    snprintf(p, sizeof p, "%s/grey.jpg", argv[1]), put(p, 8, 8, 1, 0, 0);
    snprintf(p, sizeof p, "%s/rgb.jpg", argv[1]), put(p, 9, 5, 3, 0, 0);
    snprintf(p, sizeof p, "%s/rgb-420.jpg", argv[1]), put(p, 17, 16, 3, 1, 0);
    snprintf(p, sizeof p, "%s/progressive.jpg", argv[1]), put(p, 16, 8, 3, 1, 1);
    snprintf(p, sizeof p, "%s/cmyk.jpg", argv[1]), put(p, 8, 8, 4, 0, 0);
    return 0;
}
C
cc -O1 -o "$out/mkjpeg" "$out/mkjpeg.c" -ljpeg
"$out/mkjpeg" "$c"

# the decoders must stay silent: a line on stderr that is not libFuzzer's or a sanitizer's fails the run.
# A small input may declare an image up to DP_IMAGE_MAX_PIXELS (8192 x 8192), which libjpeg then
# decodes in full (corrupt data is grey): about 2 s natively, over 20 s under ASan and UBSan, so
# libFuzzer's report of slow units (10 s by default) starts at 60 s here: bounded work, not a finding.
"$out/fuzz" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2560 -print_final_stats=1 -report_slow_units=60 \
  -artifact_prefix=tests/fuzz/findings-image/ "$c" 2>"$out/stderr" || { cat "$out/stderr" >&2; exit 1; }
cat "$out/stderr" >&2
if grep -v -E '^(INFO:|#[0-9]+|MS:|stat::|Done |Loaded |Running|Executed|==[0-9]+==|\s+NEW_FUNC|\s*$|######|".*" # Uses: [0-9]+$)' \
   "$out/stderr" >"$out/other"; then
  echo "run_image.sh: something printed to stderr:" >&2
  head -5 "$out/other" >&2
  exit 1
fi
