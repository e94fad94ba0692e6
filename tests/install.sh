#!/usr/bin/env bash
# The installed library, used from outside the tree (`make install`, `make uninstall`):
#   bash tests/install.sh [MAKE-ARGS...]     e.g. CC=clang, or BUILD=DIR (default: make's build/)
# Installs the build that make has made into a temporary prefix (PKG_CONFIG_PATH pointed at it)
# and checks:
# - the files installed: the CLI, the public headers, libdptrain.a, libdptrain.so.VERSION with its
#   soname link libdptrain.so.MAJOR and libdptrain.so, lib/pkgconfig/dptrain.pc; the CLI runs;
# - the shared library's soname, and that it exports the dp_ API only (every dp_ symbol of
#   libdptrain.a, none of the dp__ internals but dp__abort, which DP_ASSERT calls);
# - dptrain.pc: its version, its plain flags, and --static naming a link flag for each library
#   that libdptrain.so needs (OpenMP, oneDNN, OpenBLAS, MPI, zlib: what was built in);
# - each public header compiles alone with its flags (-std=c11 -pedantic -Werror);
# - each examples/*.c, copied out of the tree, built with `pkg-config --cflags --libs dptrain`
#   against libdptrain.so (an rpath) and with `pkg-config --static` against libdptrain.a, runs and
#   prints what it should (its case below; an example without a case fails: add one);
# - DESTDIR: a staged install lands under DESTDIR, its dptrain.pc naming PREFIX, and a staged
#   uninstall empties it; make uninstall removes every file that make install wrote;
# - the Python package installed beside them imports and finds the installed library.
# Prints one line per check and closes with "install: N passed, N failed, N skipped"; a skip
# (pkg-config or the data missing) fails the run when CI is set (CI=true).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
MAKE_ARGS=("$@")
DATA=${DP_DATA:-/usr/share/datasets/fashion-mnist}
CC=cc
for a in "$@"; do [[ $a == CC=* ]] && CC=${a#CC=}; done
T=$(mktemp -d /tmp/dptrain-install.XXXXXX)
trap 'rm -rf "$T"' EXIT
P=$T/prefix
pass=0 fail=0 skipped=0
ok() { echo "ok   install $1"; pass=$((pass + 1)); }
bad() { echo "FAIL install $1"; shift; local l; for l in "$@"; do echo "    $l"; done; fail=$((fail + 1)); }
skip() { echo "skip install $1 ($2)"; skipped=$((skipped + 1)); }
ci_strict() { [[ -n ${CI:-} && $CI != 0 && ${CI,,} != false ]]; }
finish() {
  if [[ $skipped -gt 0 ]] && ci_strict; then echo "CI=$CI: $skipped skipped fail the run (scripts/install-deps.sh installs what they need)"; fi
  echo "install: $pass passed, $fail failed, $skipped skipped"
  [[ $fail -eq 0 ]] && ! { [[ $skipped -gt 0 ]] && ci_strict; }
  exit
}
# mk ARGS...: make in the tree with this run's make arguments; ldconfig left alone (a temporary prefix)
mk() { make -s -C "$ROOT" "${MAKE_ARGS[@]}" LDCONFIG=true "$@"; }

VERSION=$(head -n 1 VERSION)
MAJOR=${VERSION%%.*}
HEADERS=$(cd include/dp && ls ./*.h | sed 's|^\./||')
# the Python package's folder under PREFIX, where Debian's python3 looks (none without python3)
PYDIR=$(python3 -c 'import sys; print("lib/python%d.%d/dist-packages" % sys.version_info[:2])' 2>/dev/null)
PYFILES=$(cd python/dptrain && ls ./*.py | sed 's|^\./||')

# case_of NAME: what the example is run with (ARGS) and the lines its output must hold (EXPECT,
# extended regular expressions); false for an example without a case
case_of() {
  case $1 in
    custom_model) ARGS=("$DATA" 20 2)
      EXPECT=('^model: [0-9]+ layers, [0-9]+ parameters$' '^step +0  loss [0-9]+\.[0-9]+$'
              '^test accuracy after 20 steps: [0-9]+\.[0-9]+%$' '^workers: 2, param hash [0-9a-f]{16}$') ;;
    *) return 1 ;;
  esac
}

# --- make install into a temporary prefix ----------------------------------------
if ! mk install PREFIX="$P" >"$T/make.log" 2>&1; then
  bad make_install "$(tail -20 "$T/make.log")"; finish
fi
expected=$( { echo bin/dptrain; for h in $HEADERS; do echo "include/dp/$h"; done
  echo lib/libdptrain.a; echo lib/libdptrain.so; echo "lib/libdptrain.so.$MAJOR"; echo "lib/libdptrain.so.$VERSION"
  echo lib/pkgconfig/dptrain.pc
  if [[ -n $PYDIR ]]; then for f in $PYFILES _install.py; do echo "$PYDIR/dptrain/$f"; done; fi; } | sort)
got=$(cd "$P" && find . ! -type d | sed 's|^\./||' | sort)
if [[ $got == "$expected" ]]; then ok "make_install ($(wc -l <<<"$got") files under PREFIX)"
else bad make_install "installed files differ from those expected:" "$(diff <(echo "$expected") <(echo "$got") | grep '^[<>]')"; fi
SO=$P/lib/libdptrain.so.$VERSION
if [[ $(readlink "$P/lib/libdptrain.so") == "libdptrain.so.$MAJOR" && $(readlink "$P/lib/libdptrain.so.$MAJOR") == "libdptrain.so.$VERSION" ]] &&
   readelf -d "$SO" | grep -q "(SONAME) *Library soname: \[libdptrain.so.$MAJOR\]"; then
  ok "soname (libdptrain.so -> libdptrain.so.$MAJOR -> libdptrain.so.$VERSION, soname libdptrain.so.$MAJOR)"
else bad soname "$(ls -l "$P/lib")" "$(readelf -d "$SO" | grep SONAME)"; fi
out=$("$P/bin/dptrain" --version 2>&1)
if grep -q "$VERSION" <<<"$out"; then ok "cli_runs ($(head -1 <<<"$out"))"; else bad cli_runs "$out"; fi

# --- the shared library exports the dp_ API only --------------------------------------
nm -D --defined-only "$SO" | awk 'NF == 3 {print $3}' | sort -u >"$T/exported"
nm -g --defined-only "$P/lib/libdptrain.a" 2>/dev/null | awk 'NF == 3 {print $3}' | sort -u >"$T/archive"
others=$(grep -vE '^dp_[^_]' "$T/exported" | grep -vx dp__abort)
api=$(grep -E '^dp_[^_]' "$T/archive")
internals=$(grep -c '^dp__' "$T/archive")
missing=$(comm -23 <(echo "$api") "$T/exported")
if [[ -z $others && -z $missing && -n $api && $internals -gt 1 ]]; then
  ok "exports_dp_api_only ($(wc -l <"$T/exported") symbols: the $(wc -l <<<"$api") dp_ of libdptrain.a and dp__abort; its $((internals - 1)) other dp__ hidden)"
else bad exports_dp_api_only "exported beyond the dp_ API: $(head -20 <<<"$others" | tr '\n' ' ')" \
  "dp_ symbols of libdptrain.a not exported: $(head -20 <<<"$missing" | tr '\n' ' ')"; fi

# --- dptrain.pc ----------------------------------------------------------------------
if ! command -v pkg-config >/dev/null; then
  skip pkg_config "no pkg-config: apt-get install pkgconf (scripts/install-deps.sh)"; finish
fi
export PKG_CONFIG_PATH=$P/lib/pkgconfig
libs=$(echo $(pkg-config --libs dptrain 2>&1)); static=$(echo $(pkg-config --static --libs dptrain 2>&1))
v=$(pkg-config --modversion dptrain 2>&1); cflags=$(echo $(pkg-config --cflags dptrain 2>&1))
# a link flag of --static for each library that libdptrain.so needs (libgomp: -fopenmp; libc,
# libm and the loader come with any link)
needs=$(readelf -d "$SO" | sed -nE 's/.*\(NEEDED\).*\[lib([^.]+)\.so.*/\1/p')
unmatched=""
for n in $needs; do
  case $n in
    c|ld-linux-x86-64|ld-linux-aarch64) ;;
    gomp|omp) grep -qw -- -fopenmp <<<"$static" || unmatched+=" lib$n(-fopenmp)" ;;
    *) grep -qw -- "-l$n" <<<"$static" || unmatched+=" lib$n" ;;
  esac
done
if [[ $v == "$VERSION" && $cflags == "-I$P/include" && $libs == "-L$P/lib -ldptrain" && -z $unmatched ]]; then
  ok "pkg_config (version $v; --static: $static)"
else bad pkg_config "version '$v' (VERSION $VERSION), --cflags '$cflags', --libs '$libs'" \
  "--static '$static' lacks a flag for:$unmatched"; fi

# --- each public header compiles alone, with the installed flags only -----------------
mkdir -p "$T/src"
hfail=""
for h in $HEADERS; do
  printf '#include <dp/%s>\nint main(void) { return 0; }\n' "$h" >"$T/src/h.c"
  $CC -std=c11 -pedantic -Wall -Wextra -Werror $cflags -c "$T/src/h.c" -o "$T/src/h.o" >"$T/h.log" 2>&1 ||
    hfail+="$h: $(head -3 "$T/h.log")"$'\n'
done
if [[ -z $hfail ]]; then ok "headers_alone ($(wc -w <<<"$HEADERS") headers, $CC -std=c11 -pedantic -Werror)"
else bad headers_alone "$hfail"; fi

# --- the examples, out of the tree ---------------------------------------------------
# check_run NAME BIN: runs it with its case's ARGS and checks its EXPECT lines
check_run() {
  local name=$1 bin=$2 re
  (cd "$T/src" && timeout 300 "$bin" "${ARGS[@]}") >"$T/run.out" 2>&1
  local rc=$?
  if [[ $rc -ne 0 ]]; then bad "$name" "exit $rc" "$(tail -5 "$T/run.out")"; return; fi
  for re in "${EXPECT[@]}"; do
    grep -qE "$re" "$T/run.out" || { bad "$name" "no line matching '$re' in:" "$(tail -8 "$T/run.out")"; return; }
  done
  ok "$name ($(tail -1 "$T/run.out"))"
}
for src in examples/*.c; do
  name=$(basename "$src" .c)
  if ! case_of "$name"; then bad "example_$name" "no case for $src in tests/install.sh (case_of): add its arguments and expected lines"; continue; fi
  if [[ ${ARGS[0]} == "$DATA" && ! -d $DATA ]]; then
    skip "example_$name" "$DATA missing: Debian package dataset-fashion-mnist"; continue
  fi
  cp "$src" "$T/src/"
  # against libdptrain.so, found through an rpath
  if (cd "$T/src" && $CC -O2 -Wall -Wextra -Werror "$name.c" $(pkg-config --cflags --libs dptrain) \
        -Wl,-rpath,"$P/lib" -o "$name.shared") >"$T/cc.log" 2>&1; then
    if readelf -d "$T/src/$name.shared" | grep -q "(NEEDED).*\[libdptrain.so.$MAJOR\]" &&
       ldd "$T/src/$name.shared" | grep -q "libdptrain.so.$MAJOR => $P/lib/"; then
      check_run "example_${name}_shared" "$T/src/$name.shared"
    else bad "example_${name}_shared" "not linked to $P/lib/libdptrain.so.$MAJOR:" "$(ldd "$T/src/$name.shared" | grep dptrain)"; fi
  else bad "example_${name}_shared" "build failed:" "$(head -20 "$T/cc.log")"; fi
  # against libdptrain.a: pkg-config --static adds the private dependencies; -l:libdptrain.a
  # picks the archive where the linker would take the shared library beside it
  if (cd "$T/src" && $CC -O2 -Wall -Wextra -Werror "$name.c" \
        $(pkg-config --static --cflags --libs dptrain | sed 's/-ldptrain\b/-l:libdptrain.a/') \
        -o "$name.static") >"$T/cc.log" 2>&1; then
    if ! readelf -d "$T/src/$name.static" | grep -q 'NEEDED.*libdptrain'; then
      check_run "example_${name}_static" "$T/src/$name.static"
    else bad "example_${name}_static" "linked to libdptrain.so, not libdptrain.a"; fi
  else bad "example_${name}_static" "build failed:" "$(head -20 "$T/cc.log")"; fi
done

# --- a model of the program's own, trained data-parallel by the installed library: 2 workers
# give the 1-worker bits (examples/custom_model.c runs deterministic)
if [[ -x $T/src/custom_model.shared && -d $DATA ]]; then
  h2=$(cd "$T/src" && ./custom_model.shared "$DATA" 20 2 | sed -n 's/^workers: 2, param hash //p')
  h1=$(cd "$T/src" && ./custom_model.shared "$DATA" 20 1 | sed -n 's/^workers: 1, param hash //p')
  if [[ -n $h1 && $h1 == "$h2" ]]; then ok "custom_model_two_workers_same_bits ($h1)"
  else bad custom_model_two_workers_same_bits "1 worker '$h1', 2 workers '$h2'"; fi
fi

# --- the Python package: imported from PREFIX's dist-packages, it finds PREFIX's library (its
# _install.py names LIBDIR) with no LD_LIBRARY_PATH or DPTRAIN_LIB --------------------------
PY=${PYTHON:-/usr/bin/python3}
if [[ -n $PYDIR ]] && "$PY" -c 'import numpy' 2>/dev/null; then
  out=$(cd "$T" && env -u DPTRAIN_LIB -u LD_LIBRARY_PATH PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$P/$PYDIR" \
        "$PY" -c 'import dptrain; print(dptrain.library_path)' 2>&1)
  if [[ $out == "$P/lib/libdptrain.so.$MAJOR" ]]; then ok "python_package (import dptrain: $out)"
  else bad python_package "$out"; fi
else skip python_package "no python3 with numpy (scripts/install-deps.sh --torch)"; fi

# --- DESTDIR: staged under it, the .pc naming PREFIX; a staged uninstall empties it ------
S=$T/stage
if mk install DESTDIR="$S" PREFIX=/usr/local >"$T/make.log" 2>&1; then
  staged=$(cd "$S/usr/local" 2>/dev/null && find . ! -type d | sed 's|^\./||' | sort)
  outside=$(cd "$S" && find . ! -type d ! -path './usr/local/*')
  if [[ $staged == "$expected" && -z $outside ]] && grep -qx 'prefix=/usr/local' "$S/usr/local/lib/pkgconfig/dptrain.pc" &&
     mk uninstall DESTDIR="$S" PREFIX=/usr/local >"$T/make.log" 2>&1 && [[ -z $(find "$S" ! -type d) ]]; then
    ok "destdir (staged under DESTDIR/usr/local, prefix=/usr/local in dptrain.pc, uninstalled)"
  else bad destdir "staged: $(tr '\n' ' ' <<<"$staged")" "outside DESTDIR/usr/local: $outside" "$(tail -5 "$T/make.log")"
    grep prefix= "$S/usr/local/lib/pkgconfig/dptrain.pc" 2>/dev/null; fi
else bad destdir "$(tail -20 "$T/make.log")"; fi

# --- make uninstall removes every file make install wrote -----------------------------
if mk uninstall PREFIX="$P" >"$T/make.log" 2>&1; then
  left=$(cd "$P" && find . ! -type d)
  if [[ -z $left && ! -d $P/include/dp ]]; then ok "make_uninstall (no file left under PREFIX)"
  else bad make_uninstall "left: $(tr '\n' ' ' <<<"$left")"; fi
else bad make_uninstall "$(tail -20 "$T/make.log")"; fi

finish
