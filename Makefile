# The README's commands. Each target creates the virtual environment first if it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is installed on its own first: the pinned CPU build is fast to install where it is cached,
# and the project's `torch>=2.3` requirement is then already satisfied. Override with TORCH=...
TORCH ?= torch==2.13.0
EXPERIMENT ?= experiments/mpe/simple_spread.yaml
ARGS ?=

.PHONY: install run test test-slow reproduce bench bench-memory gpu-check lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[all,ray,test]"
	touch $(STAMP)

run: install
	$(BIN)/marl-ppo train $(EXPERIMENT) $(ARGS)

test: install
	$(BIN)/python -m pytest -q -m "not slow" --durations=20

test-slow: install
	$(BIN)/python -m pytest -q -m slow

# Every experiment file with an expected: block, its seeds trained and checked against its band (hours).
reproduce: install
	status=0; for file in $$(grep -l '^expected:' experiments/*/*.yaml); do \
		$(BIN)/marl-ppo reproduce $$file $(ARGS) || status=1; done; exit $$status

bench: install
	$(BIN)/python -m bench $(ARGS)

bench-memory: install
	$(BIN)/python -m bench.memory $(ARGS)

# On a machine with an NVIDIA GPU, with torch's CUDA build: `make clean && make gpu-check TORCH=torch`.
# The device tests run on the CPU and on the GPU; the benchmark's VMAS cases run on the GPU.
gpu-check: install
	$(BIN)/python -c "import sys, torch; torch.cuda.is_available() or sys.exit('gpu-check: torch sees no CUDA device; on a GPU machine run: make clean && make gpu-check TORCH=torch')"
	$(BIN)/python -m pytest -q -rs tests/integration/test_devices.py tests/envs/test_vmas.py tests/unit/test_optim.py tests/unit/test_precision.py
	$(BIN)/python -m bench --only vmas --device cuda $(ARGS)

lint: install
	$(BIN)/ruff check marl_ppo envs tests bench
	$(BIN)/ruff format --check marl_ppo envs tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache
