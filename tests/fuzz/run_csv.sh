#!/usr/bin/env bash
# Fuzzes the CSV reader (dp_csv_parse, tokenised by libcsv) with libFuzzer + ASan + UBSan for $1
# seconds (default 10).  Exits non-zero if the fuzzer finds a crash or a violated contract; the
# input is saved as tests/fuzz/findings-csv/crash-*.  Seeds: files with and without a header,
# quoted fields (commas, doubled quotes, line breaks), CRLF and blank lines, a byte order mark,
# and the refusals (a missing value, a short row, a stray or unclosed quote, a bad class label).
# libcsv itself is the system's, not instrumented: the fuzzer checks what this project makes of it.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
out=$(mktemp -d /tmp/dptrain-fuzz-csv.XXXXXX)
trap 'rm -rf "$out"' EXIT
mkdir -p tests/fuzz/findings-csv
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc -fsanitize=address,undefined -fno-sanitize-recover=undefined)
clang "${flags[@]}" -fsanitize=fuzzer -o "$out/fuzz" tests/fuzz/fuzz_csv.c src/data/csv.c src/data/cache.c \
  src/data/npy.c src/core/error.c src/core/alloc.c src/core/file.c src/core/util.c -lcsv -lz -lm -lpthread
c="$out/corpus"
mkdir -p "$c"
printf 'a,b,label\n1,2,0\n3.5,-4e1,7\n'          >"$c/header.csv"
printf '1,2,0\n3,4,1\n5,6,2'                      >"$c/noheader.csv"
printf '\xef\xbb\xbf"x ""1""","b, c",y\r\n\r\n 1 , "2" ,3\r\n' >"$c/quotes-crlf.csv"
printf '"two\nlines",b\n1,2\n\n\n0x10,inf\n'     >"$c/multiline.csv"
printf ',a,b\n0,1,2\n1,,3\n'                      >"$c/missing.csv"
printf 'a,b,c\n1,2\n1,2,3,4\n'                    >"$c/short.csv"
printf 'a,b\n1,2"3\n"1"x,2\n'                     >"$c/stray-quote.csv"
printf 'a,b\n1,"2\n3\n'                           >"$c/unclosed.csv"
printf 'a,b\n1,3.5\n1,65536\n1,-1\n1,1e40\n'      >"$c/labels.csv"
printf 'label\n1\n'                               >"$c/one-column.csv"
"$out/fuzz" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 -artifact_prefix=tests/fuzz/findings-csv/ "$c"
