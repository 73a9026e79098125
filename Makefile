# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each installs what it needs into .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    ?= out/demo

.PHONY: setup demo test clean bench fuzz install-skills

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

test: $(STAMP)
	PYTHONDONTWRITEBYTECODE=1 $(PY) -m pytest

bench: $(STAMP)
	$(PY) tools/bench.py

fuzz: $(STAMP)
	PYTHONDONTWRITEBYTECODE=1 $(PY) tools/fuzz_dumps.py --cases 2000 $(FUZZ_ARGS)

# Link the three skill folders side by side into DEST (COPY=1 copies them); never overwrites.
install-skills:
	@test -n "$(DEST)" || { echo "usage: make install-skills DEST=<skills dir> [COPY=1]" >&2; exit 2; }
	$(PYTHON) tools/install_skills.py --dest "$(DEST)" $(if $(COPY),--copy)

clean:
	rm -rf $(VENV) out .pytest_cache
