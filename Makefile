# qtrain — `make` builds build/qtrain, `make test` builds and runs every test, `make bench` benchmarks.
#
# Sources are found by wildcard: src/*.c (trainer; src/main.c is the program), cuda/*.cu and cuda/*.c
# (kernels and launchers), comm/*.c and comm/*.cu (collectives), tests/test_*.c (one binary each),
# bench/*.c (one binary each). Everything but main.c goes into build/libqtrain.a.
#
# CUDA_ARCH picks the GPU targets: `make CUDA_ARCH=90a` for a fast Hopper-only build.

BUILD     ?= build
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CC        ?= gcc
CUDA_ARCH ?= 80 89 90a 120
# Where the device machine keeps the cuDNN that matches our 9.19 headers (searched before the system 9.14).
CUDNN_RPATH ?= /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib

OPT       ?= -O2
CFLAGS    := -std=c11 $(OPT) -g -Wall -Wextra -Werror -Wno-format-truncation -fopenmp -D_GNU_SOURCE -Iinclude \
             -I$(CUDA_HOME)/include -MMD -MP $(EXTRA_CFLAGS)
NVFLAGS   := -O3 -g -std=c++17 -Iinclude -lineinfo --expt-relaxed-constexpr \
             $(foreach a,$(CUDA_ARCH),-gencode=arch=compute_$(a),code=sm_$(a)) \
             -Xcompiler -Wall,-Werror -Wno-deprecated-gpu-targets -MMD -MP $(EXTRA_NVFLAGS)
# libyaml and zstd link statically when their archives exist, so binaries run on GPU machines
# that lack the shared libraries.
STATIC_LIBS := $(foreach l,yaml zstd,$(if $(wildcard /usr/lib/x86_64-linux-gnu/lib$(l).a),-l:lib$(l).a,-l$(l)))
LDLIBS    := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDNN_RPATH) -lcudnn -lcublasLt -lcudart \
             $(STATIC_LIBS) -lstdc++ -lpthread -ldl -lm -fopenmp

LIB_C   := $(filter-out src/main.c,$(wildcard src/*.c)) $(wildcard cuda/*.c comm/*.c)
LIB_CU  := $(wildcard cuda/*.cu comm/*.cu)
LIB_OBJ := $(LIB_C:%.c=$(BUILD)/%.o) $(LIB_CU:%.cu=$(BUILD)/%.cu.o)
TESTS   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c tests/tool_*.c))
BENCHES := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))

.PHONY: all test bench quickstart clean
.SECONDARY:
all: $(BUILD)/qtrain $(TESTS) $(BENCHES)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/libqtrain.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/qtrain: $(BUILD)/src/main.o $(BUILD)/libqtrain.a
	$(CC) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libqtrain.a
	$(CC) $^ -o $@ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libqtrain.a
	$(CC) $^ -o $@ $(LDLIBS)

# The runner prints one line per test and ends with "N passed, N failed[, N skipped]".
test: $(BUILD)/qtrain $(TESTS)
	@BUILD=$(BUILD) bash tests/run.sh

bench: $(BUILD)/qtrain $(BENCHES)
	@BUILD=$(BUILD) bash bench/run.sh

quickstart: $(BUILD)/qtrain
	@BUILD=$(BUILD) bash tools/quickstart.sh

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
