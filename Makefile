# dflash-pipe — the only build entry (design.md §1, style.md "Makefile habits").
#
#   make              build every binary into $(BUILD)/bin (CUDA code too when nvcc is found)
#   make test         build and run every CPU Check suite (what CI runs)
#   make run          the main job: trains, exports and evaluates a drafter on the embedded tiny model
#                     (pipelines/demo.sh; runs/demo/summary.txt at the end)
#   make bench        build the benchmarks into $(BUILD)/bench and run the CPU ones
#   make gpu-test     build GPU tests, stages and benchmarks and pack them for the GPU machine
#                     (scripts/gpu-run.sh; gpu-machine.md)
#   make clean        remove $(BUILD) only
#
# Files are discovered by path, so adding a module needs no Makefile edit:
#   shm/*.c                      -> libdflash_shm.a
#   kernels/*.c, kernels/*.cu    -> libdflash_kernels.a   (.cu only with CUDA)
#   stages/<zone>/*.c, stages/<zone>/*.cu -> libdflash_core.a  (core, model, and one folder per stage)
#   stages/dflash-*.c            -> $(BUILD)/bin/dflash-*
#   tests/test_*.c               -> $(BUILD)/tests/test_*      (run by make test)
#   tests/gpu/test_*.c|.cu       -> $(BUILD)/gpu-tests/test_*  (run on the GPU machine)
#   kernels/bench/*_bench.c|.cu  -> $(BUILD)/bench/*_bench   (one kernel op each)
#   bench/*_bench.c              -> $(BUILD)/bench/*_bench   (whole stages, rings, the target forward)
# Every binary links all three archives (core, kernels, shm) plus the libraries below.

BUILD     ?= build
CC        ?= cc
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
CUDA      ?= $(if $(NVCC),1,0)
CUDA_ARCH ?= 90a
DEBUG     ?= 0
SAN       ?=

ifeq ($(origin CC),default)
CC := cc
endif

CPPFLAGS := -I. -Istages -D_GNU_SOURCE
CFLAGS   := -std=c11 -Wall -Wextra -Werror -MMD -MP -pthread -fno-strict-aliasing
NVFLAGS  := -std=c++17 -MMD -MP -gencode arch=compute_$(CUDA_ARCH),code=sm_$(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror,-fno-strict-aliasing \
            -Wno-deprecated-gpu-targets --expt-relaxed-constexpr
LDFLAGS  := -pthread
ifeq ($(DEBUG),1)
CPPFLAGS += -DDFLASH_DEBUG=1
CFLAGS  += -O0 -g3
NVFLAGS += -O0 -g -lineinfo
else
CFLAGS  += -O2 -g -march=x86-64-v3
NVFLAGS += -O3 -lineinfo
endif
ifneq ($(SAN),)
CFLAGS  += -fsanitize=$(SAN) -fno-omit-frame-pointer
LDFLAGS += -fsanitize=$(SAN)
endif

# msgpack-c, jansson, protobuf-c and Check link statically so the binaries run on the GPU machine, which
# has none of them; nanomsg stays dynamic (scripts/gpu-run.sh ships libnanomsg.so.5 beside them).
# OpenBLAS (the CPU trainer's GEMMs, stages/train/cpu_ops.c) links dynamically against Debian's pthread build
# (libopenblas-pthread-dev), found first through the binaries' RUNPATH whatever build the libopenblas.so.0
# alternative names (the serial build is not safe to call from several threads at once); scripts/gpu-run.sh ships
# it with its libgfortran and libquadmath. Linked statically it was 24 MB in each of ~50 binaries: a 620 MB GPU
# package against the device tool's 64 MiB (compressed) limit.
OPENBLAS_DIR ?= /usr/lib/x86_64-linux-gnu/openblas-pthread
OPENBLAS_INC ?= /usr/include/x86_64-linux-gnu/openblas-pthread
CPPFLAGS  += -isystem $(OPENBLAS_INC)
LIBS      := -Wl,-Bstatic -lmsgpackc -ljansson -lprotobuf-c -Wl,-Bdynamic -L$(OPENBLAS_DIR) -Wl,-rpath,$(OPENBLAS_DIR) -lopenblas -lnanomsg -lrt -lm
TEST_LIBS := -Wl,-Bstatic -lcheck_pic -lsubunit -Wl,-Bdynamic

# The Qwen3.5/3.6 target's gated delta rule on the GPU: 0 the one-kernel form, 1 the split form (stages/model/target.c)
GDN_SPLIT ?= 0
CPPFLAGS  += -DDFLASH_GDN_SPLIT=$(GDN_SPLIT)

ifeq ($(CUDA),1)
CPPFLAGS  += -DDFLASH_CUDA -I$(CUDA_HOME)/include
LIBS      += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -ldl -lstdc++
endif

# Open MPI (issue 29; stages/train/dp.h): dflash-train's data-parallel ranks. On by default when pkg-config
# knows ompi-c (scripts/install-deps.sh installs it), in CPU and CUDA builds alike, so `make test` tests the ranks
# whatever the build; the GPU machine has no Open MPI, so scripts/gpu-run.sh pack ships its shared libraries
# beside libnanomsg (dflash-train calls MPI_Init only when launched as several ranks). MPI=1 / MPI=0 force it.
# Only dp.c and dflash-train see it.
MPI ?= $(shell pkg-config --exists ompi-c 2>/dev/null && echo 1 || echo 0)
ifeq ($(MPI),1)
MPI_CPPFLAGS := -DDFLASH_MPI $(shell pkg-config --cflags ompi-c)
MPI_LIBS     := $(shell pkg-config --libs ompi-c)
endif

SHM_C    := $(wildcard shm/*.c)
KERN_C   := $(wildcard kernels/*.c)
CORE_C   := $(wildcard stages/*/*.c)
MAINS    := $(wildcard stages/dflash-*.c)
TESTS_C  := $(wildcard tests/test_*.c)
BENCH_C  := $(wildcard kernels/bench/*_bench.c)
SBENCH_C := $(wildcard bench/*_bench.c)
ifeq ($(CUDA),1)
KERN_CU  := $(wildcard kernels/*.cu)
CORE_CU  := $(wildcard stages/*/*.cu)
GTESTS   := $(wildcard tests/gpu/test_*.c tests/gpu/test_*.cu)
BENCH_CU := $(wildcard kernels/bench/*_bench.cu)
endif

obj = $(patsubst %,$(BUILD)/obj/%.o,$(1))

SHM_LIB  := $(BUILD)/lib/libdflash_shm.a
KERN_LIB := $(BUILD)/lib/libdflash_kernels.a
CORE_LIB := $(BUILD)/lib/libdflash_core.a
ALL_LIBS := $(CORE_LIB) $(KERN_LIB) $(SHM_LIB)

BINS     := $(patsubst stages/%.c,$(BUILD)/bin/%,$(MAINS))
TESTS    := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TESTS_C))
GTEST_BINS := $(patsubst tests/gpu/%,$(BUILD)/gpu-tests/%,$(basename $(GTESTS)))
BENCHES  := $(patsubst kernels/bench/%,$(BUILD)/bench/%,$(basename $(BENCH_C) $(BENCH_CU))) \
            $(patsubst bench/%.c,$(BUILD)/bench/%,$(SBENCH_C))

DEPS_OK  := $(BUILD)/.deps-ok

.PHONY: all test run bench gpu-test gpu-build clean deps config campaign tfevents-proto
.DEFAULT_GOAL := all

all: $(BINS)

config:
	@echo "dflash-pipe build: CC=$(CC) CUDA=$(CUDA) NVCC=$(NVCC) CUDA_ARCH=$(CUDA_ARCH) DEBUG=$(DEBUG) SAN=$(SAN) BUILD=$(BUILD)"

# Missing Debian packages are installed once (scripts/install-deps.sh); the stamp keeps it cheap.
$(DEPS_OK): scripts/install-deps.sh
	@mkdir -p $(@D)
	@scripts/install-deps.sh --check >/dev/null 2>&1 || scripts/install-deps.sh
	@$(MAKE) --no-print-directory config
	@touch $@
deps: $(DEPS_OK)

$(BUILD)/obj/%.c.o: %.c | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu | $(DEPS_OK)
	@mkdir -p $(@D)
	$(NVCC) $(CPPFLAGS) $(NVFLAGS) -c $< -o $@

# dflash_py.c links stages/export/dflash.py in with .incbin (issue 26): rebuild it when the .py changes.
$(BUILD)/obj/stages/export/dflash_py.c.o: stages/export/dflash.py

$(SHM_LIB): $(call obj,$(SHM_C))
$(KERN_LIB): $(call obj,$(KERN_C) $(KERN_CU))
$(CORE_LIB): $(call obj,$(CORE_C) $(CORE_CU))
$(ALL_LIBS):
	@mkdir -p $(@D)
	@rm -f $@
	ar rcs $@ $^ $(if $^,,$(BUILD)/obj/empty.o)

# An archive must contain something even before a directory has its first module.
$(BUILD)/obj/empty.o: | $(DEPS_OK)
	@mkdir -p $(@D)
	echo 'typedef int dflash_empty_unit;' | $(CC) -x c -c - -o $@
$(ALL_LIBS): | $(BUILD)/obj/empty.o

# dp.c is compiled with or without MPI; the stamp names the choice, so changing MPI rebuilds it
$(BUILD)/obj/mpi-$(MPI).stamp:
	@mkdir -p $(@D)
	@rm -f $(BUILD)/obj/mpi-*.stamp
	@touch $@
$(BUILD)/obj/stages/train/dp.c.o: $(BUILD)/obj/mpi-$(MPI).stamp
$(BUILD)/obj/stages/train/dp.c.o: CPPFLAGS += $(MPI_CPPFLAGS)
$(BUILD)/bin/dflash-train: LIBS += $(MPI_LIBS)

$(BUILD)/bin/%: $(BUILD)/obj/stages/%.c.o $(ALL_LIBS)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $< $(ALL_LIBS) $(LIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.c.o $(ALL_LIBS)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $< $(ALL_LIBS) $(TEST_LIBS) $(LIBS) -o $@

$(BUILD)/gpu-tests/%: $(BUILD)/obj/tests/gpu/%.c.o $(ALL_LIBS)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $< $(ALL_LIBS) $(TEST_LIBS) $(LIBS) -o $@
$(BUILD)/gpu-tests/%: $(BUILD)/obj/tests/gpu/%.cu.o $(ALL_LIBS)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $< $(ALL_LIBS) $(TEST_LIBS) $(LIBS) -o $@

$(BUILD)/bench/%: $(BUILD)/obj/kernels/bench/%.c.o $(ALL_LIBS)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $< $(ALL_LIBS) $(LIBS) -o $@
$(BUILD)/bench/%: $(BUILD)/obj/kernels/bench/%.cu.o $(ALL_LIBS)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $< $(ALL_LIBS) $(LIBS) -o $@
$(BUILD)/bench/%: $(BUILD)/obj/bench/%.c.o $(ALL_LIBS)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $< $(ALL_LIBS) $(LIBS) -o $@

# Test binaries find the stage binaries through DFLASH_BIN; scripts/run-tests.sh runs every suite,
# keeps Check's summary lines and fails if any suite failed.
test: $(BINS) $(TESTS)
	@DFLASH_BIN=$(abspath $(BUILD)/bin) scripts/run-tests.sh $(TESTS)

run: $(BINS)
	@BUILD=$(BUILD) pipelines/demo.sh

# The long kill campaign (issue 24): CAMPAIGN_TRIALS seeded trials of tests/test_kill_campaign (CI runs 8 in `make
# test`); a failure names its seed, and CAMPAIGN_SEED=that reruns it. About 10-20 s a trial on 2 cores.
CAMPAIGN_TRIALS ?= 60
CAMPAIGN_SEED ?= $(shell date +%s)
campaign: $(BINS) $(BUILD)/tests/test_kill_campaign
	@DFLASH_BIN=$(abspath $(BUILD)/bin) DFLASH_KILL_TRIALS=$(CAMPAIGN_TRIALS) DFLASH_KILL_SEED=$(CAMPAIGN_SEED) \
	  $(BUILD)/tests/test_kill_campaign

bench: $(BINS) $(BENCHES)
	@BUILD=$(BUILD) scripts/bench.sh --cpu-only

gpu-build: $(BINS) $(GTEST_BINS) $(BENCHES)

gpu-test: gpu-build
	@BUILD=$(BUILD) scripts/gpu-run.sh pack

# The TensorBoard Event messages: the generated C is committed (a build needs libprotobuf-c only);
# regenerate after editing the .proto (protoc-c from protobuf-c-compiler, scripts/install-deps.sh).
tfevents-proto:
	cd stages && protoc-c --c_out=. metrics/tfevents.proto

clean:
	rm -rf $(BUILD)

.SECONDARY:
-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
