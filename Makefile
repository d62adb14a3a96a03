# The README's two commands:
#   make        install what is missing, build, and run flashstep
#   make test   install what is missing, build, and run every test (CTest)
# Both configure through CMakePresets.json; extra CMake flags go in CMAKE_ARGS.

BUILD_DIR := build
# Build and tests (the CLI's CLI11 and nlohmann-json among them); the docs site
# (Doxygen, offline MathJax, Chromium for its browser check); the notebooks
# (executed headless by the tests).
DEBIAN_PACKAGES := cmake ninja-build g++ make libeigen3-dev doctest-dev \
	libcli11-dev nlohmann-json3-dev \
	doxygen libjs-mathjax chromium \
	jupyter-nbconvert python3-ipykernel python3-matplotlib python3-numpy \
	python3-venv
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CMAKE_ARGS ?=
# The CUDA Toolkit's usual home, for machines where nvcc is not on PATH yet.
export PATH := $(PATH):/usr/local/cuda/bin
# The PyTorch + Triton course track (notebooks/flashstep_course) needs torch,
# triton and pytest: python3's own where it has them (the GPU machines), else a
# project-local venv from PyPI (torch 2.11 brings Triton 3.6 and CUDA's
# libraries: about 4.7 GB, a minute on a fast link). numpy < 2.4: Triton
# 3.6's interpreter, which runs the kernels on the CPU, fails with newer NumPy.
COURSE_VENV := .venv-course
COURSE_PIP := torch==2.11.0 "numpy<2.4" pytest
COURSE_HAS := import torch, triton, pytest
COURSE_PYTHON = $(shell python3 -c '$(COURSE_HAS)' 2>/dev/null && command -v python3 || echo $(CURDIR)/$(COURSE_VENV)/bin/python)

.PHONY: all run deps pydeps build test
all: run

deps:
	@missing=$$(for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

pydeps:
	@if python3 -c '$(COURSE_HAS)' 2>/dev/null || $(COURSE_VENV)/bin/python -c '$(COURSE_HAS)' 2>/dev/null; then :; else \
	  echo "installing torch, triton, numpy and pytest from PyPI into $(COURSE_VENV) (about 4.7 GB)"; \
	  python3 -m venv $(COURSE_VENV) && $(COURSE_VENV)/bin/pip install -q --no-cache-dir $(COURSE_PIP); \
	fi

build: deps
	cmake --preset default -DFLASHSTEP_COURSE_PYTHON=$(COURSE_PYTHON) $(CMAKE_ARGS)
	cmake --build --preset default

run: build
	$(BUILD_DIR)/stages/cli/flashstep

test: build pydeps
	ctest --preset default
