# Two commands do all set-up: `make demo` and `make test`. Each creates .venv when missing.
# The pinned torch is installed first so that nothing pulls a multi-GB CUDA build on a CPU machine;
# override with e.g. `make test TORCH_SPEC="torch==2.6.0"` (or TORCH_SPEC= to keep what is installed).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-all lint demo bench study study-quick clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install -q "$(TORCH_SPEC)"; fi
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check lit_rlft tests benchmarks scripts examples

demo: $(STAMP)
	$(BIN)/python -m lit_rlft.demo --out runs/demo

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[dev,bench]"
	$(BIN)/python benchmarks/step_time_vs_trl.py

study: $(STAMP)
	$(BIN)/lit-rlft bench --out runs/bench

study-quick: $(STAMP)
	$(BIN)/lit-rlft bench --quick

clean:
	rm -rf $(VENV) runs lightning_logs .pytest_cache
