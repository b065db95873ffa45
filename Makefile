# The two commands a newcomer needs: `make demo` and `make test`.
# Both install what is missing, build, and then run.
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 300

.PHONY: all deps build test unit integration soak demo bench fuzz clean format images e2e

all: build

deps:
	@scripts/install-deps.sh

$(BUILD_DIR)/CMakeCache.txt: | deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DFREEFLOW_WERROR=ON $(CMAKE_FLAGS) >/dev/null

build: deps $(BUILD_DIR)/CMakeCache.txt
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# The unit tests JOBS at a time (those that measure the scheduler are marked to run alone), then
# the others one at a time: integration tests start routers and namespaces and measure. What
# each failed test said is printed again at the end (tests/failure_digest.py), where a long
# run's log is read first.
DIGEST = python3 $(CURDIR)/tests/failure_digest.py Testing/Temporary/LastTest.log
test: build
	@cd $(BUILD_DIR) && status=0; rm -f Testing/failed-*.txt; \
	  ctest --output-on-failure --timeout 900 -L '^unit$$' -j $(JOBS) || \
	    { status=1; $(DIGEST) > Testing/failed-unit.txt; }; \
	  ctest --output-on-failure --timeout 900 -LE '^unit$$' || \
	    { status=1; $(DIGEST) > Testing/failed-others.txt; }; \
	  if [ $$status -ne 0 ]; then echo "What the failed tests said:"; cat Testing/failed-*.txt; fi; \
	  exit $$status

unit: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L unit

integration: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L integration

# The full router soak (ctest runs 200 cycles of it): 1000 pods killed at random points.
soak: build
	@FF_BUILD=$(abspath $(BUILD_DIR)) FF_SOAK_CYCLES=1000 bash tests/integration/verbs/soak.sh

demo: build
	@scripts/demo.sh $(BUILD_DIR)

bench: build
	@bench/run.sh $(BUILD_DIR)
	@bench/multinode.sh $(BUILD_DIR)
	@bench/direct_floor.sh $(BUILD_DIR)
	@bench/direct.sh $(BUILD_DIR)
	@bench/qperf.sh $(BUILD_DIR)
	@bench/rdmacm.sh $(BUILD_DIR)
	@bench/tcp_mode.sh $(BUILD_DIR)
	@bench/scale.sh $(BUILD_DIR)

# OCI images of the router (with the library and the device plugin) and of a verbs app,
# from Debian packages and our binaries, with no registry (docs/containers.md). Root.
images: build
	@scripts/images.sh $(BUILD_DIR)

# freeflow on a real container runtime (a private containerd, runc, the CNI bridge): the
# router and device plugin containers as deploy/ says, Allocate as kubelet does, verbs
# programs and perftest between restricted app containers (docs/containers.md). Root.
e2e: images
	@tests/e2e/run.sh $(BUILD_DIR)

# Every fuzz target for FUZZ_SECONDS each, in its own clang build (fuzz/README.md).
fuzz: deps
	@fuzz/run.sh -b $(FUZZ_DIR) -t $(FUZZ_SECONDS) -j $(JOBS)

format:
	@clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	@rm -rf $(BUILD_DIR) $(FUZZ_DIR)
