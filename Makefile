# dptrain build.  `make` builds the library, the CLI, the tests and examples
# into build/; `make test` runs the suite; `make SAN=asan test` builds into
# build-asan/ with AddressSanitizer + UndefinedBehaviorSanitizer; SAN=tsan
# builds with ThreadSanitizer.  CC=clang works the same way.
#
# Optional libraries are detected: oneDNN (libdnnl-dev) and OpenBLAS
# (libopenblas-dev) for GEMM; Open MPI (openmpi-bin libopenmpi-dev: found through
# its mpicc) for the communicator's mpi backend and build/dptest_mpi (MPI=0 builds
# without it).  zlib (zlib1g-dev) is required.

CC ?= cc
SAN ?=
BUILD ?= build$(if $(SAN),-$(SAN))$(if $(filter clang%,$(notdir $(CC))),-clang)

WARN := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
OPT ?= -O2 -march=native
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE $(OPT) -fno-math-errno -g -fopenmp $(WARN) -Iinclude -Isrc $(CFLAGS)
LDLIBS_ALL := -lz -lm -lpthread -fopenmp

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
CLI_SRC := $(sort $(wildcard tools/dptrain/*.c))
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(sort $(wildcard tests/*.c))
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)
EX_SRC := $(sort $(wildcard examples/*.c))
EX_BIN := $(EX_SRC:examples/%.c=$(BUILD)/examples/%)
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all test clean fuzz
all: $(BUILD)/dptrain $(BUILD)/dptest $(EX_BIN) $(BENCH_BIN) $(MPI_BIN)

V ?= 0
Q := $(if $(filter 1,$(V)),,@)

# Objects depend on the flags too (MPI found or not, OPT, CFLAGS): the stamp
# file changes only when they do, so a changed setting rebuilds everything.
FLAGS_STAMP := $(BUILD)/.cflags
$(shell mkdir -p $(BUILD) && echo '$(CC) $(CFLAGS_ALL)' | cmp -s - $(FLAGS_STAMP) || echo '$(CC) $(CFLAGS_ALL)' >$(FLAGS_STAMP))

# `dptrain --version`: the number (the VERSION file) and the commit built from (git describe,
# empty outside a git checkout) reach tools/dptrain/help.c alone, through a stamp of their own,
# so that a new commit rebuilds that one object and relinks, not everything.
DPTRAIN_VERSION := $(shell head -n 1 VERSION 2>/dev/null | tr -cd 'A-Za-z0-9._+-')
DPTRAIN_COMMIT := $(if $(wildcard .git),$(shell git describe --always --dirty 2>/dev/null | tr -cd 'A-Za-z0-9._+-'))
VERSION_STAMP := $(BUILD)/.version
$(shell echo '$(DPTRAIN_VERSION) $(DPTRAIN_COMMIT)' | cmp -s - $(VERSION_STAMP) || echo '$(DPTRAIN_VERSION) $(DPTRAIN_COMMIT)' >$(VERSION_STAMP))
$(BUILD)/tools/dptrain/help.o: $(VERSION_STAMP)
$(BUILD)/tools/dptrain/help.o: CFLAGS_ALL += -DDPTRAIN_VERSION='"$(DPTRAIN_VERSION)"' -DDPTRAIN_COMMIT='"$(DPTRAIN_COMMIT)"'

$(BUILD)/%.o: %.c $(FLAGS_STAMP) $(wildcard include/dp/*.h include/*.h src/*/*.h tests/*.h tools/*/*.h)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC $<",true)
	$(Q)$(CC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/libdptrain.a: $(LIB_OBJ)
	@rm -f $@
	$(Q)ar rcs $@ $^

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

test: all
	./$(BUILD)/dptest

clean:
	rm -rf build build-*
