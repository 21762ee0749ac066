# fusebox: `make demo` and `make test` work on a fresh machine (they run setup first).
BUILD ?= build
JOBS ?= $(shell nproc)
BUNDLE ?= .gpu
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: setup configure build test demo gpu-bundle bench docs clean format format-check

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

configure: setup $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

demo: build
	bash scripts/demo.sh $(BUILD)

# Copies binaries and data the GPU machine needs into .gpu/ (see docs/gpu.md).
gpu-bundle: build
	bash scripts/gpu_bundle.sh $(BUILD)

# On the GPU machine (docs/gpu.md, "Benchmarks"): PARTS=conv make bench, one part per call.
bench:
	bash scripts/bench.sh $(BUNDLE)

# Pictures of the example graphs (docs/images/*.svg) with Graphviz, which setup
# installs only here (FUSEBOX_GRAPHVIZ=1).
docs: build
	FUSEBOX_GRAPHVIZ=1 bash scripts/setup.sh
	bash scripts/render_graphs.sh $(BUILD)

# clang-format 14 (Debian's, which setup installs) over every tracked C, C++ and CUDA file;
# format-check is the check `make test` runs (ctest format_check).
format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' '*.c')

format-check:
	bash scripts/format_check.sh

clean:
	rm -rf $(BUILD)
