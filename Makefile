# Two commands on a fresh machine:  `make demo` (the main job) and `make test` (the suite).
# Both create .venv on first use. torch is pinned here (not in pyproject.toml, which takes a range) to
# the CPU wheel that pip finds locally, first alone, then again beside the package so nothing upgrades it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow test-lower bench mutate docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip<26.2"
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[dev,postgres,docs,workspace]" "torch==2.13.0"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/vapo-ablate --drop=value_pretraining --workers 2

# The suite (about 5 minutes on 2 cores); `test-slow` runs the end-to-end checks marked slow
# (about 12 minutes: real base-model build, wheel install, multi-process DDP/FSDP, SIGKILLed grids).
# CI (.ci/run) runs both.
test: $(STAMP)
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

bench: $(STAMP)
	$(BIN)/python benchmarks/gae.py

# Mutation testing of the wiring (not part of `make test` or CI: an hour or more on 2 cores).
# Narrow it with MUTATE_ARGS, e.g. make mutate MUTATE_ARGS="vapo_lit/passes.py --jobs 2"
mutate: $(STAMP)
	$(BIN)/python tools/mutate.py $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) $(LOWER) site
