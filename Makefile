# Zettatron's front door. `make demo` and `make test` work on a fresh machine.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build cli test demo demo-data bench clean

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
