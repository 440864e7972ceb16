# Zettatron's front door. `make demo` and `make test` work on a fresh machine.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test demo bench clean

all: build

deps:
	@bash scripts/install_deps.sh

configure:
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > /dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: deps build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

demo: deps build
	@./$(BUILD_DIR)/bin/zettatron --help

bench: deps build
	@bash bench/run_ops.sh

clean:
	@rm -rf $(BUILD_DIR)
