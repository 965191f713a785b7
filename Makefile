# nano-vllm in C++17 and CUDA: the one entry point of the build.
#
#   make                    build build/nanovllm (with CUDA kernels when nvcc is found)
#   make test               build and run every test suite
#   make chapter-03         build chapter 03, what it depends on, and its tests
#   make chapter-03 test    ... and run only chapter 03's suites (Ch03_*)
#   make help               list these targets and the rest (not the build/... file targets)
#
# Variables: CXX, NVCC (empty = CPU only), CUDA_ARCH (e.g. `make CUDA_ARCH=90`), BUILD, SANITIZE=1.
# Builds run in parallel on every core unless you give -jN yourself.

.DEFAULT_GOAL := all
SHELL := /bin/bash
BUILD ?= build
ifeq ($(filter -j%,$(MAKEFLAGS)),)
  MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif

# ---------------------------------------------------------------------------------------------------
# Compilers and flags

CXX      ?= g++
CXXFLAGS ?= -O2 -g
CXXFLAGS += -std=c++17 -Wall -Wextra -pthread -MMD -MP
CPPFLAGS += -I. -DNANOVLLM_SOURCE_DIR='"$(CURDIR)"'  # tests find tests/data through it
LDLIBS   += -pthread

ifeq ($(SANITIZE),1)
  CXXFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDFLAGS  += -fsanitize=address,undefined
  NVCC :=
endif

# CUDA is optional: without nvcc the CPU engine is built on its own.
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
# Compute capabilities to build machine code for: A100 (80), A10/3090 (86), L4/4090 (89), H100/H200 (90).
CUDA_ARCH ?= 80 86 89 90
# 9.0 is built as sm_90a, the architecture-specific target that has Hopper's warpgroup tensor-core
# instructions (wgmma, 06_tensor_parallel/linear_wgmma.cu); its code runs on compute capability 9.0 only.
arch_suffix = $(if $(filter 90,$(1)),a)
# Say why a build has no CUDA: `make NVCC=` asked for it, or nvcc is not installed.
NO_CUDA_REASON := $(if $(filter command line,$(origin NVCC)),NVCC= given,nvcc not found)
ifneq ($(strip $(NVCC)),)
  WITH_CUDA := 1
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  CPPFLAGS  += -DNANOVLLM_CUDA -isystem $(CUDA_HOME)/include
  LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart
  NVCCFLAGS ?= -O3 -lineinfo
  NVCCFLAGS += -std=c++17 -I. -DNANOVLLM_CUDA -MMD -MP -Xcompiler -Wall,-Wextra \
               $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a)$(call arch_suffix,$(a)),code=sm_$(a)$(call arch_suffix,$(a)))
endif

# ---------------------------------------------------------------------------------------------------
# Chapters. The reading order (01 -> 07) follows one request through the engine, top down; the build
# order is bottom up. deps_NN lists, in full, the chapters whose code chapter NN calls. Calls flow along
# the reading order: the entry (01) calls everything, the scheduler (02) the block manager (03), the
# model runner (04) attention (05), the linears (06) and the sampler (07), and the linears (06) the sampler
# (07): the LM head can sample in its own kernel.
#
# The folders say what is what:
#   01_sequence/base/      the floor every chapter builds on (errors, JSON, files, bf16, CUDA checks)
#   01_sequence/*.h        the shared data types (Sequence, SamplingParams, EngineConfig): headers only
#   01_sequence/*.cpp, tokenizer/, cli/   the entry, the tokenizer and the command line: chapter 01
#   01_sequence/cli/main.cpp              build/nanovllm's main(), linked into the binary only

CHAPTERS := 01 02 03 04 05 06 07
deps_01 := 02 03 04 05 06 07
deps_02 := 03
deps_03 :=
deps_04 := 05 06 07
deps_05 :=
deps_06 := 07
deps_07 :=

BASE_DIR := 01_sequence/base
MAIN_SRC := 01_sequence/cli/main.cpp
# Every source under a folder, at any depth.
sources_in = $(shell find $(1) -name '*.cpp' $(if $(WITH_CUDA),-o -name '*.cu') 2>/dev/null | sort)
chapter_dir  = $(wildcard $(1)_*)
chapter_srcs = $(filter-out %_test.cpp %_test.cu $(MAIN_SRC) $(BASE_DIR)/%,$(call sources_in,$(call chapter_dir,$(1))))
chapter_objs = $(patsubst %,$(BUILD)/obj/%.o,$(call chapter_srcs,$(1)))
# A chapter's tests: *_test.cpp anywhere in its folder (and *_test.cu, kernels only the tests launch, in a
# CUDA build), and tests/chNN_*_test.cpp (golden and model tests).
chapter_test_srcs = $(filter %_test.cpp %_test.cu,$(call sources_in,$(call chapter_dir,$(1)))) $(wildcard tests/ch$(1)_*_test.cpp)
BASE_OBJS  := $(patsubst %,$(BUILD)/obj/%.o,$(filter-out %_test.cpp,$(call sources_in,$(BASE_DIR))))
chapter_link_objs = $(foreach c,$(1) $(deps_$(1)),$(call chapter_objs,$(c))) $(BASE_OBJS)

ALL_OBJS   := $(foreach c,$(CHAPTERS),$(call chapter_objs,$(c))) $(BASE_OBJS)
MAIN_OBJ   := $(BUILD)/obj/$(MAIN_SRC).o
E2E_SRCS   := $(wildcard tests/e2e_*_test.cpp)
BOOK_SRCS  := $(wildcard tests/book_*_test.cpp)
TEST_BINS  := $(foreach c,$(CHAPTERS),$(BUILD)/test_ch$(c)) $(if $(E2E_SRCS),$(BUILD)/test_e2e) \
              $(if $(BOOK_SRCS),$(BUILD)/test_book)

# Test data built from shipped files: the Qwen3 tokenizer is shipped gzip'd (2 MB instead of 11 MB).
TOKENIZER_DIR := $(BUILD)/data/qwen3-tokenizer
DATA := $(TOKENIZER_DIR)/tokenizer.json $(TOKENIZER_DIR)/tokenizer_config.json

# Every object depends on a record of the flags it was built with: switching between `make` and `make
# NVCC=` (or changing CUDA_ARCH, CXXFLAGS, ...) in one tree rebuilds everything instead of linking
# objects built for the other configuration.
# `make help` and `make clean` build nothing and leave the record as it is, and `make sanitize` builds in
# build-sanitize/ through a make of its own (which keeps its own record there): none of them creates $(BUILD).
FLAGS_RECORD := $(BUILD)/flags
ifneq ($(if $(MAKECMDGOALS),$(filter-out help clean sanitize,$(MAKECMDGOALS)),all),)
$(shell mkdir -p $(BUILD))
$(file >$(FLAGS_RECORD).new,$(CXX) $(CPPFLAGS) $(CXXFLAGS) | $(NVCC) $(NVCCFLAGS) | $(LDFLAGS) $(LDLIBS))
$(shell cmp -s $(FLAGS_RECORD).new $(FLAGS_RECORD) && rm -f $(FLAGS_RECORD).new || mv $(FLAGS_RECORD).new $(FLAGS_RECORD))
endif

# ---------------------------------------------------------------------------------------------------
# Targets

## all: build build/nanovllm and unpack its default tokenizer (Qwen3's) into build/data/; say whether CUDA is in it
all: $(BUILD)/nanovllm $(DATA)
	@if [ -n "$(WITH_CUDA)" ]; then echo "built $(BUILD)/nanovllm with CUDA ($(NVCC), sm $(CUDA_ARCH))"; \
	 else echo "built $(BUILD)/nanovllm for the CPU only ($(NO_CUDA_REASON))"; fi

$(BUILD)/nanovllm: $(MAIN_OBJ) $(ALL_OBJS)
	$(CXX) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# `make chapter-03 test` runs only chapter 03; `make test` runs everything.
SELECTED := $(patsubst chapter-%,%,$(filter chapter-%,$(MAKECMDGOALS)))
RUN_BINS := $(if $(SELECTED),$(foreach c,$(SELECTED),$(BUILD)/test_ch$(c)),$(TEST_BINS))

## chapter-NN: build chapter NN, the chapters it depends on, and its test binary
chapter-%: $(BUILD)/test_ch% $(DATA)
	@echo "chapter $*: built (depends on: $(or $(deps_$*),only the base utilities))"
	@if [ -e $(BUILD)/nanovllm ]; then for o in $(MAIN_OBJ) $(ALL_OBJS); do \
	  if [ $$o -nt $(BUILD)/nanovllm ]; then \
	    echo "note: $(BUILD)/nanovllm is older than what was just built; run make to bring your change into it"; break; \
	  fi; done; fi

## test: run the tests (after chapter-NN: only that chapter's suites)
test: $(RUN_BINS) $(if $(SELECTED),,$(BUILD)/nanovllm) $(DATA)
	@set -e; for t in $(RUN_BINS); do \
	  case $${t##*/} in test_ch*) filter="Ch$${t##*/test_ch}_*";; test_e2e) filter='E2E_*';; *) filter='Book_*';; esac; \
	  brief=--gtest_brief=1; [ "$${t##*/}" = test_e2e ] && brief=; \
	  echo "== $$t --gtest_filter=$$filter"; $$t --gtest_filter="$$filter" $$brief; done

## sanitize: build everything with AddressSanitizer + UBSan (CPU only) in build-sanitize/ and run the tests
# An allocation that cannot be had returns null under the sanitizer, as it does without it, so that the engine's
# "out of host memory" error (Ch04_Tensor.HostMemoryThatCannotBeHadIsAnError) is what runs, not ASan's abort.
sanitize:
	ASAN_OPTIONS=allocator_may_return_null=1 $(MAKE) BUILD=build-sanitize SANITIZE=1 test

## help: list the targets
help:
	@grep -hE '^## ' $(firstword $(MAKEFILE_LIST)) | sed 's/^## /  make /'

## clean: remove build outputs
clean:
	rm -rf $(BUILD) build-sanitize

.PHONY: all test sanitize help clean

# ---------------------------------------------------------------------------------------------------
# Rules

define chapter_test_rule
$(BUILD)/test_ch$(1): $(patsubst %,$(BUILD)/obj/%.o,$(call chapter_test_srcs,$(1))) $(call chapter_link_objs,$(1))
	$$(CXX) $$(LDFLAGS) -o $$@ $$^ -lgtest_main -lgtest $$(LDLIBS)
endef
$(foreach c,$(CHAPTERS),$(eval $(call chapter_test_rule,$(c))))

$(BUILD)/test_e2e: $(patsubst %,$(BUILD)/obj/%.o,$(E2E_SRCS)) $(ALL_OBJS)
	$(CXX) $(LDFLAGS) -o $@ $^ -lgtest_main -lgtest $(LDLIBS)

$(BUILD)/test_book: $(patsubst %,$(BUILD)/obj/%.o,$(BOOK_SRCS)) $(BASE_OBJS)
	$(CXX) $(LDFLAGS) -o $@ $^ -lgtest_main -lgtest $(LDLIBS)

$(BUILD)/obj/%.cpp.o: %.cpp $(FLAGS_RECORD)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c -o $@ $<

$(BUILD)/obj/%.cu.o: %.cu $(FLAGS_RECORD)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

$(TOKENIZER_DIR)/tokenizer.json: tests/data/qwen3-tokenizer/tokenizer.json.gz
	@mkdir -p $(@D)
	gzip -dc $< > $@

$(TOKENIZER_DIR)/tokenizer_config.json: tests/data/qwen3-tokenizer/tokenizer_config.json
	@mkdir -p $(@D)
	cp $< $@

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
