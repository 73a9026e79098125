# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each installs what it needs into .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    ?= out/demo

.PHONY: setup demo test test-slow clean bench bench-ranks bench-refmodel fuzz install-skills

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $(STAMP)

demo: $(STAMP)
	$(PY) rl-consistency-analysis/scripts/run_root_cause_analysis.py \
	    --train examples/hf_train_vs_vllm_rollout/train \
	    --rollout examples/hf_train_vs_vllm_rollout/rollout \
	    --out-dir $(OUT)

# `make test` leaves out the tests marked slow (fuzz and bench self-tests); `make test-slow` runs
# only those (pytest exits 5 when a selection is empty: not a failure here). .ci/run runs both.
test: $(STAMP)
	PYTHONDONTWRITEBYTECODE=1 $(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	PYTHONDONTWRITEBYTECODE=1 $(PY) -m pytest -m slow $(PYTEST_ARGS) || [ $$? -eq 5 ]

# BENCH_TORCH_PY: a python with torch and transformers; given, `make bench` also times the numpy
# reference forward against transformers' CPU forward (stage reftorch: a 2.2 GB checkpoint, both
# forwards under that python). The runtime needs no torch, so without it the stage is not run.
bench: $(STAMP)
	$(PY) tools/bench.py
	$(PY) tools/bench.py --stages refmodel
	$(if $(BENCH_TORCH_PY),$(PY) tools/bench.py --stages reftorch --python "$(BENCH_TORCH_PY)")

# Eight rank files per side at three sizes: time and memory as the input grows (default command,
# the ranks merged by the input plan).
bench-ranks: $(STAMP)
	$(PY) tools/bench.py --ranks 8 --sizes 100,200,400 --stages json,compare $(BENCH_ARGS)

# The numpy reference forward on a random ~300 MB Llama checkpoint: time, and peak memory against
# the largest layer (the weights stream one module at a time).
bench-refmodel: $(STAMP)
	$(PY) tools/bench.py --stages refmodel $(BENCH_ARGS)

fuzz: $(STAMP)
	PYTHONDONTWRITEBYTECODE=1 $(PY) tools/fuzz_dumps.py --cases 2000 $(FUZZ_ARGS)

# Link the three skill folders side by side into DEST (COPY=1 copies them); never overwrites.
install-skills:
	@test -n "$(DEST)" || { echo "usage: make install-skills DEST=<skills dir> [COPY=1]" >&2; exit 2; }
	$(PYTHON) tools/install_skills.py --dest "$(DEST)" $(if $(COPY),--copy)

clean:
	rm -rf $(VENV) out .pytest_cache
