# The README's two commands:
#   make        install what is missing, build, and run flashstep
#   make test   install what is missing, build, and run every test (CTest)
# Both configure through CMakePresets.json; extra CMake flags go in CMAKE_ARGS.

BUILD_DIR := build
# Build and tests; the docs site (Doxygen, offline MathJax, Chromium for its
# browser check); the notebooks (executed headless by the tests).
DEBIAN_PACKAGES := cmake ninja-build g++ make libeigen3-dev doctest-dev \
	doxygen libjs-mathjax chromium \
	jupyter-nbconvert python3-ipykernel python3-matplotlib python3-numpy
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CMAKE_ARGS ?=
# The CUDA Toolkit's usual home, for machines where nvcc is not on PATH yet.
export PATH := $(PATH):/usr/local/cuda/bin

.PHONY: all run deps build test
all: run

deps:
	@missing=$$(for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

build: deps
	cmake --preset default $(CMAKE_ARGS)
	cmake --build --preset default

run: build
	$(BUILD_DIR)/stages/cli/flashstep

test: build
	ctest --preset default
