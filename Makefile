# dptrain build.  `make` builds the library, the CLI, the tests and examples
# into build/; `make test` runs the suite; `make SAN=asan test` builds into
# build-asan/ with AddressSanitizer + UndefinedBehaviorSanitizer; SAN=tsan
# builds with ThreadSanitizer.  CC=clang works the same way.
#
# `make install PREFIX=/usr/local` (DESTDIR honoured) installs the CLI, the public
# headers, libdptrain.a, libdptrain.so and dptrain.pc for pkg-config; `make uninstall`
# removes them (see the install section below).
#
# Optional libraries are detected: oneDNN (libdnnl-dev) and OpenBLAS
# (libopenblas-dev) for GEMM; Open MPI (openmpi-bin libopenmpi-dev: found through
# its mpicc) for the communicator's mpi backend and build/dptest_mpi (MPI=0 builds
# without it).  zlib (zlib1g-dev), libcsv (libcsv-dev: the CSV reader's tokeniser), libpng
# (libpng-dev) and libjpeg (libjpeg-dev: libjpeg-turbo; the image folders' decoders) are required.

CC ?= cc
SAN ?=
BUILD ?= build$(if $(SAN),-$(SAN))$(if $(filter clang%,$(notdir $(CC))),-clang)

WARN := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
# 512-bit vectors where the CPU has them (gcc and clang default to 256 with -march=native): our own
# loops (BatchNorm, pooling, GELU, LayerNorm) ran 1-3% faster end to end (docs/results.md).
OPT ?= -O2 -march=native -mprefer-vector-width=512
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE $(OPT) -fno-math-errno -g -fopenmp $(WARN) -Iinclude -Isrc $(CFLAGS)
LDLIBS_ALL := -lz -lzip -lcsv -lpng16 -ljpeg -lm -lpthread -fopenmp

HAVE_DNNL := $(if $(wildcard /usr/include/dnnl.h),1,)
HAVE_BLAS := $(if $(wildcard /usr/include/x86_64-linux-gnu/cblas.h /usr/include/cblas.h /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h),1,)
ifeq ($(HAVE_DNNL),1)
  CFLAGS_ALL += -DDP_WITH_DNNL
  LDLIBS_ALL += -ldnnl
endif
ifeq ($(HAVE_BLAS),1)
  CFLAGS_ALL += -DDP_WITH_BLAS
  LDLIBS_ALL += -lopenblas
endif

# MPI: CC stays the compiler (gcc, clang, sanitizers); mpicc only tells the
# flags.  Its include directories become -isystem so that warnings in the MPI
# headers do not fail -Werror.
# Only Open MPI is supported: its mpicc answers --showme.  Another MPI's mpicc
# (MPICH's answers -show instead) builds without the mpi backend, with a warning.
MPI ?= 1
MPICC := $(if $(filter 1,$(MPI)),$(shell command -v mpicc 2>/dev/null),)
ifneq ($(MPICC),)
  ifeq ($(shell $(MPICC) --showme:version >/dev/null 2>&1 && echo ok),)
    $(warning $(MPICC) is not Open MPI's mpicc (no --showme); building without the mpi backend)
    MPICC :=
  endif
endif
ifneq ($(MPICC),)
  HAVE_MPI := 1
  MPI_CFLAGS := $(patsubst -I%,-isystem %,$(shell $(MPICC) --showme:compile))
  MPI_LDLIBS := $(shell $(MPICC) --showme:link)
  CFLAGS_ALL += -DDP_WITH_MPI $(MPI_CFLAGS)
  LDLIBS_ALL += $(MPI_LDLIBS)
  MPI_BIN := $(BUILD)/dptest_mpi
endif

ifeq ($(SAN),asan)
  CFLAGS_ALL += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDLIBS_ALL += -fsanitize=address,undefined
endif
ifeq ($(SAN),tsan)
  CFLAGS_ALL += -fsanitize=thread -fno-omit-frame-pointer
  LDLIBS_ALL += -fsanitize=thread
endif

LIB_SRC := $(sort $(wildcard src/*/*.c))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
# The library's objects are position-independent, so that libdptrain.a and libdptrain.so are
# made of the same objects (one compile).  -fno-semantic-interposition lets the compiler inline
# and call directly within the library as in an executable (no dp_ function is meant to be
# replaced by another definition at run time); the CLI is no slower (docs/results.md).
PIC := -fPIC -fno-semantic-interposition
CLI_SRC := $(sort $(wildcard tools/dptrain/*.c))
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(sort $(wildcard tests/*.c))
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)
EX_SRC := $(sort $(wildcard examples/*.c))
EX_BIN := $(EX_SRC:examples/%.c=$(BUILD)/examples/%)
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all test clean fuzz install uninstall FORCE
all: $(BUILD)/dptrain $(BUILD)/dptest $(EX_BIN) $(BENCH_BIN) $(MPI_BIN)

V ?= 0
Q := $(if $(filter 1,$(V)),,@)

# Objects depend on the flags too (MPI found or not, OPT, CFLAGS): the stamp
# file changes only when they do, so a changed setting rebuilds everything.
FLAGS_STAMP := $(BUILD)/.cflags
$(shell mkdir -p $(BUILD) && echo '$(CC) $(CFLAGS_ALL) $(PIC)' | cmp -s - $(FLAGS_STAMP) || echo '$(CC) $(CFLAGS_ALL) $(PIC)' >$(FLAGS_STAMP))

# `dptrain --version`: the number (the VERSION file) and the commit built from (git describe,
# empty outside a git checkout) reach tools/dptrain/help.c alone, through a stamp of their own,
# so that a new commit rebuilds that one object and relinks, not everything.
DPTRAIN_VERSION := $(shell head -n 1 VERSION 2>/dev/null | tr -cd 'A-Za-z0-9._+-')
DPTRAIN_COMMIT := $(if $(wildcard .git),$(shell git describe --always --dirty 2>/dev/null | tr -cd 'A-Za-z0-9._+-'))
VERSION_STAMP := $(BUILD)/.version
$(shell echo '$(DPTRAIN_VERSION) $(DPTRAIN_COMMIT)' | cmp -s - $(VERSION_STAMP) || echo '$(DPTRAIN_VERSION) $(DPTRAIN_COMMIT)' >$(VERSION_STAMP))
$(BUILD)/tools/dptrain/help.o: $(VERSION_STAMP)
$(BUILD)/tools/dptrain/help.o: CFLAGS_ALL += -DDPTRAIN_VERSION='"$(DPTRAIN_VERSION)"' -DDPTRAIN_COMMIT='"$(DPTRAIN_COMMIT)"'

# The shared library's names, from the VERSION file: libdptrain.so.0.1.0, soname libdptrain.so.0.
# `make` builds it too (not under SAN: a sanitized shared library needs the runtime preloaded).
SONAME := libdptrain.so.$(firstword $(subst ., ,$(DPTRAIN_VERSION)))
SHLIB := $(BUILD)/libdptrain.so.$(DPTRAIN_VERSION)
all: $(if $(SAN),,$(SHLIB))

$(BUILD)/%.o: %.c $(FLAGS_STAMP) $(wildcard include/dp/*.h include/*.h src/*/*.h tests/*.h tools/*/*.h)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC $<",true)
	$(Q)$(CC) $(CFLAGS_ALL) -c $< -o $@

$(LIB_OBJ): CFLAGS_ALL += $(PIC)

$(BUILD)/libdptrain.a: $(LIB_OBJ)
	@rm -f $@
	$(Q)ar rcs $@ $^

# The shared library: soname libdptrain.so.MAJOR, file libdptrain.so.VERSION (the VERSION file),
# and the two links beside it.  src/libdptrain.map exports the dp_ API and keeps the dp__
# internals local; --no-undefined makes it carry its own dependencies (OpenMP, oneDNN,
# OpenBLAS, MPI, zlib, libcsv, libpng, libjpeg), so that a program links it with -ldptrain alone.
$(SHLIB): $(LIB_OBJ) src/libdptrain.map
	@$(if $(Q),echo "  LD $@",true)
	$(Q)$(CC) $(CFLAGS_ALL) -shared -Wl,-soname,$(SONAME) -Wl,--version-script=src/libdptrain.map \
	    -Wl,--no-undefined -o $@ $(LIB_OBJ) $(LDLIBS_ALL)
	$(Q)ln -sf $(notdir $@) $(BUILD)/$(SONAME) && ln -sf $(SONAME) $(BUILD)/libdptrain.so

$(BUILD)/dptrain: $(CLI_OBJ) $(BUILD)/libdptrain.a
	@$(if $(Q),echo "  LD $@",true)
	$(Q)$(CC) $(CFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/dptest: $(TEST_OBJ) $(BUILD)/libdptrain.a
	@$(if $(Q),echo "  LD $@",true)
	$(Q)$(CC) $(CFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

# The MPI tests: a program of their own, run under mpirun by tests/mpi/run.sh.
$(BUILD)/dptest_mpi: $(BUILD)/tests/mpi/test_mpi.o $(BUILD)/libdptrain.a
	@$(if $(Q),echo "  LD $@",true)
	$(Q)$(CC) $(CFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/examples/%: examples/%.c $(BUILD)/libdptrain.a
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD $@",true)
	$(Q)$(CC) $(CFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/bench/%: bench/%.c $(BUILD)/libdptrain.a
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD $@",true)
	$(Q)$(CC) $(CFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

# ---- install ------------------------------------------------------------------------------
# make install PREFIX=/usr/local [DESTDIR=/stage]: the CLI into $(BINDIR), the public headers into
# $(INCLUDEDIR)/dp/, libdptrain.a and libdptrain.so.VERSION with its links libdptrain.so.MAJOR (the
# soname) and libdptrain.so into $(LIBDIR), and dptrain.pc into $(PKGCONFIGDIR), $(LIBDIR)/pkgconfig
# (pkg-config searches /usr/local/lib/pkgconfig by default; for another PREFIX, point
# PKG_CONFIG_PATH at it).  Without DESTDIR, run as root, ldconfig
# refreshes the loader's cache.  make uninstall PREFIX=... [DESTDIR=...] removes exactly those files.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
INSTALL ?= install
LDCONFIG ?= ldconfig
PUBLIC_HEADERS := $(sort $(wildcard include/dp/*.h))

# dptrain.pc describes the library as this build made it: Libs.private holds the link flags that
# the CLI was linked with (OpenMP's -fopenmp, oneDNN and OpenBLAS when found, mpicc's link flags
# when MPI is built in, libcsv (it ships no .pc), libpng, libjpeg, libm, pthread), zlib comes through
# Requires.private (its own zlib.pc).
# Rewritten only when its text changes (PREFIX, what was found).
pc_dir = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
$(BUILD)/dptrain.pc: FORCE
	@{ echo 'prefix=$(PREFIX)'; echo 'exec_prefix=$${prefix}'; \
	   echo 'libdir=$(call pc_dir,$(LIBDIR))'; echo 'includedir=$(call pc_dir,$(INCLUDEDIR))'; echo; \
	   echo 'Name: dptrain'; echo 'Description: Data-parallel neural-network training in C'; \
	   echo 'Version: $(DPTRAIN_VERSION)'; \
	   echo 'Cflags: -I$${includedir}'; echo 'Libs: -L$${libdir} -ldptrain'; \
	   echo 'Libs.private: $(strip $(filter-out -lz -fsanitize=%,$(LDLIBS_ALL)))'; \
	   echo 'Requires.private: zlib'; } >$@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi

# The Python package (python/dptrain, docs/python.md) goes into PYTHONDIR, where Debian's python3
# looks for PREFIX's packages (PREFIX/lib/python3.X/dist-packages, X python3's own; empty when
# there is no python3, or given empty: the package is left out), with dptrain/_install.py naming
# LIBDIR, so that `import dptrain` finds this library with no LD_LIBRARY_PATH.
PYTHON_SRC := $(sort $(wildcard python/dptrain/*.py))
PYTHONDIR ?= $(shell python3 -c 'import sys; print("$(PREFIX)/lib/python%d.%d/dist-packages" % sys.version_info[:2])' 2>/dev/null)

install: $(BUILD)/dptrain $(BUILD)/libdptrain.a $(SHLIB) $(BUILD)/dptrain.pc
	@if [ -n "$(SAN)" ]; then echo "make install: SAN=$(SAN) builds are not for installing" >&2; exit 1; fi
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(INCLUDEDIR)/dp $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR)
	$(INSTALL) -m 755 $(BUILD)/dptrain $(DESTDIR)$(BINDIR)/dptrain
	$(INSTALL) -m 644 $(PUBLIC_HEADERS) $(DESTDIR)$(INCLUDEDIR)/dp/
	$(INSTALL) -m 644 $(BUILD)/libdptrain.a $(DESTDIR)$(LIBDIR)/libdptrain.a
	$(INSTALL) -m 755 $(SHLIB) $(DESTDIR)$(LIBDIR)/$(notdir $(SHLIB))
	ln -sf $(notdir $(SHLIB)) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libdptrain.so
	$(INSTALL) -m 644 $(BUILD)/dptrain.pc $(DESTDIR)$(PKGCONFIGDIR)/dptrain.pc
	$(if $(PYTHONDIR),$(INSTALL) -d $(DESTDIR)$(PYTHONDIR)/dptrain)
	$(if $(PYTHONDIR),$(INSTALL) -m 644 $(PYTHON_SRC) $(DESTDIR)$(PYTHONDIR)/dptrain/)
	$(if $(PYTHONDIR),printf 'LIBDIR = "%s"  # written by make install\n' '$(LIBDIR)' >$(DESTDIR)$(PYTHONDIR)/dptrain/_install.py)
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v $(LDCONFIG) >/dev/null; then $(LDCONFIG); fi

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/dptrain $(addprefix $(DESTDIR)$(INCLUDEDIR)/dp/,$(notdir $(PUBLIC_HEADERS)))
	rm -f $(addprefix $(DESTDIR)$(LIBDIR)/,libdptrain.a $(notdir $(SHLIB)) $(SONAME) libdptrain.so)
	rm -f $(DESTDIR)$(PKGCONFIGDIR)/dptrain.pc
	$(if $(PYTHONDIR),rm -rf $(addprefix $(DESTDIR)$(PYTHONDIR)/dptrain/,$(notdir $(PYTHON_SRC)) _install.py __pycache__))
	@rmdir $(DESTDIR)$(INCLUDEDIR)/dp $(if $(PYTHONDIR),$(DESTDIR)$(PYTHONDIR)/dptrain) 2>/dev/null || true
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v $(LDCONFIG) >/dev/null; then $(LDCONFIG); fi

test: all
	./$(BUILD)/dptest

clean:
	rm -rf build build-*
