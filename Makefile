# qtrain — `make` builds build/qtrain, `make test` builds and runs every test, `make bench` benchmarks.
#
# Sources are found by wildcard: src/*/*.c (the trainer in layer folders; src/train/main.c is the program), cuda/*.cu and cuda/*.c
# (kernels and launchers), comm/*.c and comm/*.cu (collectives), tests/test_*.c (one binary each),
# bench/*.c (one binary each). Everything but main.c goes into build/libqtrain.a and build/libqtrain.so
# (the embeddable API, include/qtrain.h; objects are position independent), and the Python extension
# build/python/qtrain/_qtrain*.so (src/python/qtrain/, linked with libqtrain.a) when python3's headers
# are there: `PYTHONPATH=build/python python3 -c "import qtrain"`.
#
# Two variants (the block below): the CUDA build where nvcc is, else the CPU-only build (`make CPU=1`).
# Before compiling, tools/prereqs.sh checks what the variant needs, installs what it can (PREREQS=install)
# and otherwise stops naming the commands to run.

# MUTANTS=1: the mutant build (the planted bugs of include/qt_mutant.h) in build-mutants/, see below.
ifeq ($(MUTANTS),1)
BUILD     ?= build-mutants
override EXTRA_CFLAGS += -DQT_MUTANTS
endif
BUILD     ?= build
CC        ?= gcc

# ---- the variant: CUDA or CPU-only ----
# CUDA_HOME: the toolkit of the nvcc on PATH, else /usr/local/cuda. Without nvcc there (or with
# `make CPU=1`) the build is CPU-only: gcc, libyaml and zstd; the sources of CPU_ONLY_OUT are left out
# and src/engine/engine_none.c answers their entry points ("built without CUDA"); the tests of GPU_TESTS
# are not built (tests/run.sh counts them as skipped). `make CPU=0` insists on CUDA.
ifeq ($(origin CUDA_HOME),undefined)
CUDA_HOME := $(or $(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null)),/usr/local/cuda)
endif
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CPU       ?= $(if $(wildcard $(NVCC)),0,1)
ifeq ($(origin CPU)$(CPU)$(MAKELEVEL),file10)
$(info make: no nvcc ($(NVCC), none on PATH): the CPU-only build (make CPU=0 insists on CUDA))
endif
CPU_ONLY_OUT := $(filter-out comm/rendezvous.c,$(wildcard cuda/*.c comm/*.c src/gpu/*.c)) \
                $(addprefix src/engine/,engine_gpu.c engine_gpu_lora.c engine_dp.c dp_sync.c dp_grads.c dp_fill.c dp_nodes.c dp_nodes_none.c plan_auto.c \
                  plan_choose.c) src/plan/plan_axes.c src/plan/plan_choice.c src/plan/plan_cost.c src/plan/plan_lora.c
GPU_TESTS := test_comm_cpu test_comm_gpu test_determinism test_error test_fp8_model test_internode test_nodes_mutants test_kernels test_lora_fp8 test_offload test_ops_gpu test_plan test_plan_lora \
             test_quant test_recompute test_sft test_stores test_weight_slots test_zero tool_lora_dump_gpu
# NCCL (comm/internode.c, the collectives between nodes; CUDA builds only): where nccl.h and libnccl are
# in the toolkit or the system's paths. Without it comm/internode.c, what tests it and bench/nodes_bench are left out.
NCCL_FOUND := $(if $(filter 0,$(CPU)),$(and $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h),\
                $(wildcard $(CUDA_HOME)/lib64/libnccl.so* /usr/lib/x86_64-linux-gnu/libnccl.so*)))
NO_NCCL_OUT := $(if $(NCCL_FOUND),src/engine/dp_nodes_none.c,comm/internode.c tests/test_internode.c tests/test_nodes_mutants.c \
                src/engine/dp_nodes.c bench/nodes_bench.c)
NCCL_LDLIBS := -Wl,--push-state,--as-needed -lnccl -Wl,--pop-state # only what calls NCCL needs it
# CUDA_ARCH, the GPU targets: those of the machine's GPUs (nvidia-smi's compute capability; 9.0 builds
# sm_90a), else every architecture the project supports (a build for other machines). `make CUDA_ARCH=90a`
# names them; CI builds all four.
CUDA_ARCHS_ALL := 80 89 90a 120
ifeq ($(origin CUDA_ARCH)$(CPU),undefined0)
CUDA_ARCH := $(or $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | \
                         tr -d '. ' | sed 's/^90$$/90a/' | grep -x '[0-9]*a\?' | sort -nu),$(CUDA_ARCHS_ALL))
endif
# Parallel by default: one job per core unless -j was given.
ifeq ($(filter -j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif
PREREQS   ?= install
# Python packages (numpy; matplotlib, tokenizers, safetensors) are checked for the goals that run the
# tools: quickstart, test, test-asan, prereqs (not for `make python`, which pip install runs).
PREREQ_ENV = CC="$(CC)" CUDA_HOME="$(CUDA_HOME)" NVCC="$(NVCC)" CUDNN_LIB="$(CUDNN_LIB)" CPU=$(CPU) PYTHON="$(PYTHON)" \
             PY_PACKAGES=$(if $(filter quickstart test test-asan prereqs,$(MAKECMDGOALS)),1,0)
# ---- end of the variant block ----

# cuDNN: the libcudnn.so.MAJOR whose cudnnGetVersion() matches the cudnn_version.h we compile against,
# found by tools/prereqs.sh (python3's nvidia-cudnn wheel, next to the headers, the toolkit, ldconfig's
# cache); `make CUDNN_LIB=dir` names it. Linked with a RUNPATH, so LD_LIBRARY_PATH still wins at run time.
# --version prints GIT_COMMIT, baked into $(BUILD)/gen/qt_build_info.h (rewritten only when it changes).
ifeq ($(filter clean,$(MAKECMDGOALS)),)
CUDNN_FOUND := $(if $(filter 0,$(CPU)),$(shell CC="$(CC)" CUDA_HOME="$(CUDA_HOME)" CUDNN_LIB="$(CUDNN_LIB)" bash tools/prereqs.sh cudnn))
GIT_COMMIT  ?= $(shell git describe --always --dirty --abbrev=12 2>/dev/null)
$(shell mkdir -p $(BUILD)/gen && printf '#define QT_GIT_COMMIT "%s"\n' '$(GIT_COMMIT)' > $(BUILD)/gen/info.tmp && \
        { cmp -s $(BUILD)/gen/info.tmp $(BUILD)/gen/qt_build_info.h || cp $(BUILD)/gen/info.tmp $(BUILD)/gen/qt_build_info.h; })
endif
CUDNN_DIR := $(word 2,$(CUDNN_FOUND))

OPT       ?= -O2
CFLAGS    := -std=c11 $(OPT) -g -fPIC -Wall -Wextra -Wpointer-arith -Werror -Wno-format-truncation -fopenmp -D_GNU_SOURCE -Iinclude \
             -I$(BUILD)/gen $(if $(filter 0,$(CPU)),-I$(CUDA_HOME)/include) -MMD -MP $(EXTRA_CFLAGS)
NVFLAGS   := -O3 -g -std=c++17 -Iinclude -lineinfo --expt-relaxed-constexpr \
             $(foreach a,$(CUDA_ARCH),-gencode=arch=compute_$(a),code=sm_$(a)) \
             -Xcompiler -Wall,-Werror,-fPIC -Wno-deprecated-gpu-targets -MMD -MP $(EXTRA_NVFLAGS)
# C objects depend on $(BUILD)/gen/cflags, CUDA objects on $(BUILD)/gen/nvflags, each rewritten only
# when its flags change, so a change of flags (as -fPIC's arrival) rebuilds the objects instead of
# linking stale ones.
ifeq ($(filter clean,$(MAKECMDGOALS)),)
$(shell mkdir -p $(BUILD)/gen && printf '%s\n' '$(CC) $(CFLAGS)' > $(BUILD)/gen/cflags.tmp && \
        { cmp -s $(BUILD)/gen/cflags.tmp $(BUILD)/gen/cflags || cp $(BUILD)/gen/cflags.tmp $(BUILD)/gen/cflags; } && \
        printf '%s\n' '$(NVCC) $(NVFLAGS)' > $(BUILD)/gen/nvflags.tmp && \
        { cmp -s $(BUILD)/gen/nvflags.tmp $(BUILD)/gen/nvflags || cp $(BUILD)/gen/nvflags.tmp $(BUILD)/gen/nvflags; } && \
        printf '%s\n' $(if $(filter 1,$(CPU)),$(GPU_TESTS)) > $(BUILD)/gen/gpu_tests)
endif
# libyaml and zstd link statically when their archives exist, so binaries run on GPU machines
# that lack the shared libraries.
STATIC_LIBS := $(foreach l,yaml zstd,$(if $(wildcard /usr/lib/x86_64-linux-gnu/lib$(l).a),-l:lib$(l).a,-l$(l)))
CUDA_LIBS := $(if $(CUDNN_DIR),-L$(CUDNN_DIR) -Xlinker -rpath -Xlinker $(CUDNN_DIR)) -Wl,--enable-new-dtags \
             -L$(CUDA_HOME)/lib64 -l:libcudnn.so.$(or $(word 1,$(CUDNN_FOUND)),9) -lcublasLt -lcudart -lstdc++ \
             $(if $(NCCL_FOUND),$(NCCL_LDLIBS))
LDLIBS    := $(if $(filter 0,$(CPU)),$(CUDA_LIBS)) $(STATIC_LIBS) -lpthread -ldl -lm -fopenmp

# Shared objects (libqtrain.so, the Python extension) take zstd's shared library: Debian's libzstd.a
# is not position independent (libyaml.a is).
SO_LDLIBS := $(subst -l:libzstd.a,-l:libzstd.so.1,$(LDLIBS))

ALL_C   := $(filter-out src/train/main.c,$(wildcard src/*/*.c)) $(wildcard cuda/*.c comm/*.c)
ifeq ($(CPU),0)
LIB_C   := $(filter-out src/engine/engine_none.c $(NO_NCCL_OUT),$(ALL_C))
LIB_CU  := $(wildcard cuda/*.cu comm/*.cu)
TESTS   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(filter-out $(NO_NCCL_OUT),$(wildcard tests/test_*.c tests/tool_*.c)))
BENCHES := $(patsubst bench/%.c,$(BUILD)/bench/%,$(filter-out $(NO_NCCL_OUT),$(wildcard bench/*.c)))
else
LIB_C   := $(filter-out $(CPU_ONLY_OUT),$(ALL_C))
LIB_CU  :=
TESTS   := $(filter-out $(GPU_TESTS:%=$(BUILD)/tests/%),$(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c tests/tool_*.c)))
BENCHES :=
endif
LIB_OBJ := $(LIB_C:%.c=$(BUILD)/%.o) $(LIB_CU:%.cu=$(BUILD)/%.cu.o)

# The Python extension: built when python3 has its headers (Debian: python3-dev).
PYTHON    ?= python3
# The prerequisites, checked (and installed where PREREQS=install can) while the Makefile is read: before
# anything compiles, and before the lines below look for python3's headers. Not for clean or make -n.
ifeq ($(filter clean prereqs,$(MAKECMDGOALS))$(findstring n,$(firstword -$(MAKEFLAGS))),)
ifneq ($(shell $(PREREQ_ENV) bash tools/prereqs.sh $(PREREQS) >&2; echo $$?),0)
$(error stopped before compiling: tools/prereqs.sh names what is missing above)
endif
endif
PY_INC    := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PY_SUFFIX := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
PY_PKG    := $(BUILD)/python/qtrain
PY_EXT    := $(if $(and $(PY_SUFFIX),$(wildcard $(PY_INC)/Python.h)),$(PY_PKG)/_qtrain$(PY_SUFFIX))
PY_FILES  := $(patsubst src/python/qtrain/%,$(PY_PKG)/%,$(wildcard src/python/qtrain/*.py src/python/qtrain/*.pyi src/python/qtrain/py.typed))

.PHONY: all prereqs test bench quickstart clean python
.SECONDARY:
all: $(BUILD)/qtrain $(BUILD)/libqtrain.so $(TESTS) $(BENCHES) $(if $(PY_EXT),python)
python: $(PY_EXT) $(PY_FILES)

# PREREQS=install installs what is missing when it can (apt-get as root, pip into a python3 of its own:
# a venv, pyenv or conda); PREREQS=check only checks; PREREQS=dry-run prints the install commands it
# would run. Each stops with the commands to run when something is still missing.
prereqs:
	@$(PREREQ_ENV) bash tools/prereqs.sh $(PREREQS)

$(BUILD)/%.o: %.c $(BUILD)/gen/cflags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(BUILD)/gen/nvflags
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/libqtrain.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libqtrain.so: $(LIB_OBJ)
	$(CC) -shared $^ -o $@ $(SO_LDLIBS)

$(BUILD)/src/python/%.o: src/python/%.c $(BUILD)/gen/cflags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(PY_INC) -c $< -o $@

$(PY_PKG)/_qtrain$(PY_SUFFIX): $(BUILD)/src/python/qtrain/_qtrain.o $(BUILD)/libqtrain.a
	@mkdir -p $(dir $@)
	$(CC) -shared $^ -o $@ $(SO_LDLIBS)

$(PY_PKG)/%: src/python/qtrain/%
	@mkdir -p $(dir $@)
	cp $< $@

$(BUILD)/qtrain: $(BUILD)/src/train/main.o $(BUILD)/libqtrain.a
	$(CC) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libqtrain.a
	$(CC) $^ -o $@ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libqtrain.a
	$(CC) $^ -o $@ $(LDLIBS)

# The runner prints one line per test and ends with "N passed, N failed[, N skipped]".
test: $(BUILD)/qtrain $(TESTS) $(if $(PY_EXT),python)
	@BUILD=$(BUILD) bash tests/run.sh

bench: $(BUILD)/qtrain $(BENCHES)
	@BUILD=$(BUILD) bash bench/run.sh

quickstart: $(BUILD)/qtrain
	@BUILD=$(BUILD) bash tools/quickstart.sh

clean:
	rm -rf $(BUILD)

# ---- fuzzing (libFuzzer, clang) and the sanitizer build of the tests ----
# `make fuzz` builds the harnesses of tests/fuzz/ (host readers only, no CUDA) and runs each from its
# seed corpus tests/fuzz/corpus/<name> for FUZZ_RUNS executions; new inputs go to
# $(BUILD)/fuzz/corpus/<name>, a finding to $(BUILD)/fuzz/crash-* and a non-zero exit. The long pass
# (README, "Inputs and fuzzing"): `make fuzz FUZZ_RUNS=1000000`.
FUZZ_CC    ?= clang
FUZZ_RUNS  ?= 20000
FUZZERS    := config json safetensors shard ckpt
FUZZ_FLAGS := -std=c11 -g -O1 -D_GNU_SOURCE -Wall -Wno-unknown-pragmas -Iinclude -Itests/fuzz \
              -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
FUZZ_LIB   := src/core/file.c src/train/ckpt_state.c src/plan/plan_rules.c src/config/config.c src/config/config_keys.c src/core/layout.c src/core/rope.c src/io/hf.c src/io/hf_rope.c src/io/hf_gemma.c src/io/hf_fields.c src/core/json.c src/io/tokens.c src/io/ckpt.c src/core/rng.c \
              src/core/crc32.c src/core/error.c
FUZZ_ENV   := ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1

.PHONY: fuzz fuzz-build fuzz-seeds test-asan
fuzz-build: $(FUZZERS:%=$(BUILD)/fuzz/fuzz_%)

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIB) $(wildcard tests/fuzz/*.h include/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $< $(FUZZ_LIB) -o $@ $(STATIC_LIBS) -lm

fuzz: fuzz-build
	@for f in $(FUZZERS); do \
	  mkdir -p $(BUILD)/fuzz/corpus/$$f; \
	  $(FUZZ_ENV) $(BUILD)/fuzz/fuzz_$$f -runs=$(FUZZ_RUNS) -seed=1 -timeout=10 -rss_limit_mb=2048 \
	    -artifact_prefix=$(BUILD)/fuzz/ -print_final_stats=1 $(BUILD)/fuzz/corpus/$$f tests/fuzz/corpus/$$f \
	    > $(BUILD)/fuzz/$$f.log 2>&1 || { tail -40 $(BUILD)/fuzz/$$f.log; echo "fuzz_$$f: FINDING (see above)"; exit 1; }; \
	  echo "fuzz_$$f: $$(grep -o 'stat::number_of_executed_units: [0-9]*' $(BUILD)/fuzz/$$f.log | grep -o '[0-9]*$$') executions, no finding"; \
	done

# Rewrites the binary seeds (safetensors, shard, ckpt) with qtrain's own writers.
fuzz-seeds:
	@mkdir -p $(BUILD)/fuzz/seedtmp tests/fuzz/corpus/safetensors tests/fuzz/corpus/shard tests/fuzz/corpus/ckpt
	$(FUZZ_CC) -std=c11 -g -D_GNU_SOURCE -Iinclude -Itests/fuzz tests/fuzz/seeds.c $(FUZZ_LIB) -o $(BUILD)/fuzz/seeds $(STATIC_LIBS) -lm
	$(BUILD)/fuzz/seeds

# `make test` with every C object (library, tests, tools) built with ASan + UBSan in ASAN_BUILD; the
# CUDA objects are the ones of $(BUILD), copied (nvcc code is not instrumented).
ASAN_BUILD ?= build-asan
ASAN_CC    := $(CC) -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
ASAN_ENV   := ASAN_OPTIONS=detect_leaks=1:protect_shadow_gap=0 UBSAN_OPTIONS=print_stacktrace=1
test-asan: $(LIB_CU:%.cu=$(BUILD)/%.cu.o)
	@for o in $(LIB_CU:%.cu=%.cu.o); do mkdir -p $(ASAN_BUILD)/$$(dirname $$o); cp -p $(BUILD)/$$o $(ASAN_BUILD)/$$o; done
	@mkdir -p $(ASAN_BUILD)/gen && cp -p $(BUILD)/gen/nvflags $(ASAN_BUILD)/gen/nvflags
	@$(MAKE) --no-print-directory BUILD=$(ASAN_BUILD) CC="$(ASAN_CC)" $(ASAN_BUILD)/qtrain \
	  $(patsubst $(BUILD)/%,$(ASAN_BUILD)/%,$(TESTS))
	@$(ASAN_ENV) BUILD=$(ASAN_BUILD) bash tests/run.sh

# ---- the mutant build: the planted bugs of include/qt_mutant.h compiled in ----
# `make MUTANTS=1 [targets]` builds into build-mutants/ with -DQT_MUTANTS. Its CUDA objects are REL_BUILD's
# (no kernel holds a planted bug), copied when they were built with the same flags. `make test-mutants`
# builds the mutant tests and runs them (each must catch its mutants; the GPU ones skip without a GPU),
# then checks that the release library holds none of them (tools/mutants.sh).
REL_BUILD ?= build
MUT_BUILD ?= build-mutants
MUT_TESTS := test_determinism test_docs test_dpo test_dpo_ref test_kernels test_lora test_lora_fp8 test_nf4 test_nodes_mutants test_offload test_qlora \
             test_recompute test_reliability test_train test_zero
MUT_TESTS := $(filter-out $(patsubst tests/%.c,%,$(filter tests/%,$(NO_NCCL_OUT))),$(MUT_TESTS))
ifeq ($(MUTANTS),1)
ifeq ($(filter clean,$(MAKECMDGOALS)),)
$(shell if [ -f $(REL_BUILD)/gen/nvflags ] && cmp -s $(REL_BUILD)/gen/nvflags $(BUILD)/gen/nvflags; then \
          for o in $(LIB_CU:%.cu=%.cu.o); do \
            if [ -f $(REL_BUILD)/$$o ] && { [ ! -f $(BUILD)/$$o ] || [ $(REL_BUILD)/$$o -nt $(BUILD)/$$o ]; }; then \
              mkdir -p $(BUILD)/$$(dirname $$o) && cp -p $(REL_BUILD)/$$o $(BUILD)/$$o; fi; \
          done; cp -p $(REL_BUILD)/gen/nvflags $(BUILD)/gen/nvflags; fi)
endif
endif
.PHONY: test-mutants
test-mutants: $(BUILD)/libqtrain.a
	@$(MAKE) --no-print-directory MUTANTS=1 BUILD=$(MUT_BUILD) REL_BUILD=$(BUILD) $(MUT_BUILD)/qtrain \
	  $(MUT_TESTS:%=$(MUT_BUILD)/tests/%)
	@bash tools/mutants.sh $(BUILD) $(MUT_BUILD) $(MUT_TESTS)

# ---- layers: no #include and no call from a lower floor to a higher one (tools/check_layers.py), no
# struct of more than 30 members (tools/struct_fields.py), no planted bug outside #ifdef QT_MUTANTS
# (tools/mutant_guard.py), at most 40 lines reading a memory-mode flag outside the plan and the placements
# (tools/mode_flags.py) ----
.PHONY: check-layers
check-layers: $(LIB_OBJ)
	@$(PYTHON) tools/check_layers.py $(BUILD)
	@$(PYTHON) tools/struct_fields.py
	@$(PYTHON) tools/mutant_guard.py
	@$(PYTHON) tools/mode_flags.py --max 40 >/dev/null || { $(PYTHON) tools/mode_flags.py; exit 1; }

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
