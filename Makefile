# Lethe. `make test` installs everything into .venv and runs the suite; `make bench-engine` measures.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run demo lint test test-fast bench bench-forgetting bench-sequential bench-engine bench-service bench-audit bench-mcu bench-precision bench-gpu clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU wheel first, pinned, so nothing pulls a CUDA build of several GB.
	$(PY) -m pip install -q torch==2.13.0
	# transformers pinned here too (not for users of the package), as the version BENCHMARKS.md and the family list of
	# tests/engine/model/test_architectures.py were measured on: a new release may change what a run does.
	$(PY) -m pip install -q -e '.[all,test,bench]' transformers==5.24.0
	touch $(STAMP)

install: $(STAMP)

# The API on http://127.0.0.1:8000 with a real worker process, SQLite, a filesystem broker, a demo model.
run: $(STAMP)
	$(PY) -m lethe.embedded

# A scripted client of `make run` (in another terminal): submit, follow, download, compare.
demo: $(STAMP)
	$(PY) -m lethe.demo

# ruff (lint rules, import order) and mypy (lethe/), both configured in pyproject.toml;
# `make test` runs them first, so CI fails on them.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

test: $(STAMP) lint
	# The report test renders pages in Debian's headless Chromium.
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	$(PY) -m pytest -q

# The tests that train no model and start no service (about 30 s): lint first, as `make test`.
test-fast: $(STAMP) lint
	$(PY) -m pytest -q -m "not slow"

# MASC and every baseline side by side on mini-TOFU (builds and caches two fixtures first: minutes).
bench: $(STAMP)
	$(PY) -m bench.bench_methods

# The default job on customer-record models (three architectures built here, a pretrained SmolLM2-135M fine-tuned on
# the records: 79 min on two CPU cores for one seed of its default job alone; `--archs` picks) and on mini-TOFU.
bench-forgetting: $(STAMP)
	$(PY) -m bench.bench_forgetting

# Ten deletion requests in a row through the embedded service, each on the last one's version.
bench-sequential: $(STAMP)
	$(PY) -m bench.bench_sequential

bench-engine: $(STAMP)
	$(PY) -m bench.bench_engine
	$(PY) -m bench.bench_engine --pretrained-size

bench-audit: $(STAMP)
	$(PY) -m bench.bench_audit

# Mode connectivity: the cost of a curve against the unlearning's, and barriers along ten requests.
bench-mcu: $(STAMP)
	$(PY) -m bench.bench_mcu

# Every precision mode (float32/bfloat16 LoRA, gradient checkpointing, full mixed precision) on mini-TOFU: peak
# tensor memory, step time, the memory plan's estimate and the forgetting figures (issue 15).
bench-precision: $(STAMP)
	$(PY) -m bench.bench_precision

# On a GPU: a 113 M-parameter model memorising all of TOFU, MASC against GradDiff, NPO+KL and SimNPO (about 8 min
# on an H200). `$(PY) -m bench.bench_gpu --reduced` runs the same script on CPU in a minute (the suite does).
bench-gpu: $(STAMP)
	$(PY) -m bench.bench_gpu

bench-service: $(STAMP)
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(PY) -m bench.bench_service

clean:
	rm -rf $(VENV) .pytest_cache bench/.fixtures
