# The front door. Every target sets up what it needs first (packages, Python, CMake).
#
#   make test              build every chapter, make the golden data, run all tests
#   make chapter N=02      build and test chapters 00..02 only (staged build)
#   make bench             run every bench_* program (needs a GPU)
#   make golden            (re)generate the golden .npy cases
#   make chat              the Bielik / SmolLM2 chat (arrives with chapter 08)
#   make docs              Doxygen HTML into build/docs
#
# Variables: BUILD=build  CUDA_ARCH=90 (default: the GPU here, else 89;90)  JOBS=N
#            CHAPTERS=regex  build only matching chapter folders, e.g. CHAPTERS='0[45]'
CHAPTERS  ?=
BUILD     ?= build
CUDA_ARCH ?=
JOBS      ?= $(shell nproc)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all test deps configure build golden chapter bench docs chat clean

all: build

deps:
	@bash scripts/install_deps.sh

# Configure: the Python used for golden data is resolved once per call (an existing one
# with numpy + ml_dtypes, or the project's .venv, created on first use).
define configure_into
	@python=$$(bash scripts/python_env.sh) && \
	cmake -S . -B $(1) $(GENERATOR) -DBIELIK_PYTHON=$$python -DBIELIK_CUDA_ARCH="$(CUDA_ARCH)" -DBIELIK_CHAPTER_FILTER="$(CHAPTERS)" $(2)
endef

configure: deps
	$(call configure_into,$(BUILD),-DBIELIK_LAST_CHAPTER=99)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j 2

golden: configure
	cmake --build $(BUILD) --target golden -j $(JOBS)

# Staged build: a separate build tree that does not even configure later chapters,
# which proves chapter N only depends on chapters 00..N.
chapter: deps
	@test -n "$(N)" || { echo "usage: make chapter N=02"; exit 2; }
	$(call configure_into,$(BUILD)-ch$(N),-DBIELIK_LAST_CHAPTER=$(N))
	cmake --build $(BUILD)-ch$(N) -j $(JOBS)
	ctest --test-dir $(BUILD)-ch$(N) --output-on-failure

bench: build
	@mkdir -p $(BUILD)/bench
	@for program in $$(find $(BUILD) -maxdepth 3 -type f -name 'bench_*' -perm -u+x | sort); do \
	  echo "== $$program"; BIELIK_BENCH_DIR=$(BUILD)/bench $$program || exit 1; \
	done

docs: configure
	@command -v doxygen >/dev/null || { echo "doxygen not found: apt-get install doxygen"; exit 1; }
	doxygen docs/Doxyfile
	@echo "docs: open build/docs/html/index.html"

chat:
	@echo "make chat arrives with chapter 08 (the Bielik assembly); see README.md for what exists now."

clean:
	rm -rf $(BUILD) $(BUILD)-ch*
