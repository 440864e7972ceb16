# Zettatron's front door. `make demo` and `make test` work on a fresh machine.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build cli test sanitize demo demo-data bench clean

all: build

deps:
	@bash scripts/install_deps.sh

configure:
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > /dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# The command-line binary alone (what the demo runs): the full build less the
# tests' and benchmarks' objects (75 of its 202 with the CUDA backend).
cli: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target zettatron

test: deps build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

# The suite under AddressSanitizer and UBSan in $(SANITIZE_DIR) (the host
# compiler's objects: nvcc's are not instrumented; a report fails its test).
# About 2.5x make test's time (27 min against 10 on a 2-core machine); not
# part of it or of CI. tests/sanitizer: the preloaded library keeps
# run-time-loaded libraries mapped for LeakSanitizer, lsan.supp leaves out
# what OpenMPI holds at exit (found through whole stacks:
# fast_unwind_on_malloc=0, as MPI's libraries keep no frame pointers).
# allocator_may_return_null: an allocation too large returns null, as in a
# normal build, so the out-of-memory tests see our error.
SANITIZE_DIR ?= build-asan
sanitize: deps
	@cmake -S . -B $(SANITIZE_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZT_SANITIZE=ON -DZT_BENCH=OFF > /dev/null
	@cmake --build $(SANITIZE_DIR) -j $(JOBS)
	@cd $(SANITIZE_DIR) && LD_PRELOAD=$$PWD/lib/libzt_keep_modules_loaded.so \
	  ASAN_OPTIONS=allocator_may_return_null=1:verify_asan_link_order=0:fast_unwind_on_malloc=0 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizer/lsan.supp:print_suppressions=0 \
	  ctest --output-on-failure -j $(JOBS) --timeout 1800

# The demo corpus (fortunes, GPT-2 tokens) in data/fortunes-gpt2; prepared once.
demo-data: cli
	@test -f data/fortunes-gpt2/index.json || ./$(BUILD_DIR)/bin/zettatron prepare --config configs/data/fortunes-gpt2.toml

# The main job: train configs/demo.toml on the fortunes corpus, then show samples.
demo: deps cli demo-data
	@./$(BUILD_DIR)/bin/zettatron train configs/demo.toml

bench: deps build
	@bash bench/run_ops.sh

clean:
	@rm -rf $(BUILD_DIR)
