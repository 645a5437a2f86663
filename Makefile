# The two commands (see README): `make demo` and `make test`. Everything else is plumbing.
# Torch is installed first and on its own: `torch==2.13.0` resolves to a local CPU wheel on the
# project's machines; set TORCH_SPEC / TORCH_INDEX for another build (e.g. a CUDA wheel index).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.gridtnp-installed

.PHONY: install demo test test-slow slurm browser lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

DEMO_RECIPE ?= recipes/era5_swin.yaml
DEMO_DIR ?= runs/demo

## The main job on the embedded default data (ERA5 + station sample): a short CPU training run, then the test set
## with the checkpoint of the best validation log-likelihood (recorded in last.ckpt; `--ckpt_path best`).
demo: install
	$(BIN)/gridtnp fit --config $(DEMO_RECIPE) \
		--trainer.default_root_dir $(DEMO_DIR) --checkpoint.dirpath $(DEMO_DIR)/checkpoints
	$(BIN)/gridtnp test --config $(DEMO_RECIPE) --trainer.default_root_dir $(DEMO_DIR) \
		--checkpoint.dirpath $(DEMO_DIR)/checkpoints --ckpt_path best

## The test suite, one pytest worker per core (each test file on one worker): unit and contract tests, the CLI
## verbs, and the scale-out cases that launch `gridtnp fit` in subprocesses (DDP with 2 CPU processes, killed /
## signalled and resumed runs, a SLURM requeue). Its time on 2 idle cores: README.
test: install browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n auto --dist loadfile --durations=10

## Heavy checks excluded from the timed suite, with a real one-node Slurm (tests/training/test_slurm.py) where it can run.
test-slow: install slurm
	$(BIN)/python -m pytest -q -m slow

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) runs lightning_logs .pytest_cache .ruff_cache *.egg-info

## Slurm and munge from Debian's packages, for the Slurm test (which is skipped, saying why, where they cannot run).
slurm:
	@command -v slurmctld >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge) \
		|| echo "make slurm: Slurm could not be installed; tests/training/test_slurm.py will be skipped"

## Chromium from Debian's packages, for the HTML report's browser test (skipped, saying why, where it cannot run).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) \
		|| echo "make browser: Chromium could not be installed; tests/cli/test_report.py will skip the browser check"
