# Set-up is two commands on a fresh machine: `make demo` and `make test`.
# The interpreter is Python 3.12: `python3.12` on PATH where it runs as 3.12 (a pyenv shim runs only where pyenv
# selects a 3.12), else pyenv's newest versions/3.12.* ($$PYENV_ROOT, default ~/.pyenv); `make PYTHON=...` overrides.
IS_312 := -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for p in python3.12 $$(ls -d "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/3.12*/bin/python3.12 \
	2>/dev/null | sort -rV); do "$$p" $(IS_312) 2>/dev/null && { command -v "$$p"; break; }; done)
endif
NO_PYTHON := no Python 3.12 (python3.12 on PATH or pyenv's versions/3.12.*): install it (pyenv install 3.12, \
	or apt-get install python3.12), or run make PYTHON=/path/to/python3.12
# $(call venv,DIR): DIR is a venv of Python 3.12 (made anew where it holds another interpreter, e.g. an old 3.11);
# without a Python 3.12 to make it, make stops with NO_PYTHON, one line.
define venv
$(if $(PYTHON),,$(if $(shell $(1)/bin/python $(IS_312) 2>/dev/null && echo ok),,$(error $(NO_PYTHON))))
@$(1)/bin/python $(IS_312) 2>/dev/null || { rm -rf $(1) && $(PYTHON) -m venv $(1); }
endef
VENV := .venv
ORACLE_VENV := .venv-oracle
PY := $(VENV)/bin/python
# Stamps named by the interpreter: a checkout whose venvs were made with another Python installs them anew.
STAMP := $(VENV)/.installed-py3.12
ORACLE_STAMP := $(ORACLE_VENV)/.installed-py3.12

.PHONY: demo test test-fast native lint docs install oracle jax-oracle bench clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py tpu_embed/sparsecore/native/_csr_native.c pipelines/native/_csv_native.c \
		pipelines/native/_token_index.c profiles/native/_step_counts.c
	@echo "installing tpu-embed into $(VENV) (a few minutes the first time; log: $(VENV)/install.log)"
	$(call venv,$(VENV))
	@# pip's own output (and this machine's index warnings) go to the log; its tail is shown on failure.
	@( $(PY) -m pip install -q --upgrade pip && \
	   PYTHONWARNINGS=ignore $(PY) -m pip install -q -e '.[test,report,lint,docs]' ) > $(VENV)/install.log 2>&1 \
	   || (tail -n 40 $(VENV)/install.log; exit 1)
	@touch $@

# TensorFlow's own SparseCore kernels, used only as the conformance oracle.
# tensorflow-tpu 2.20 conflicts with tensorflow 2.21, so it lives in its own venv.
oracle: $(ORACLE_STAMP)

$(ORACLE_STAMP): tests/conformance/oracle-requirements.txt
	@echo "installing the conformance oracle (tensorflow-tpu 2.20) into $(ORACLE_VENV) (log: $(ORACLE_VENV)/install.log)"
	$(call venv,$(ORACLE_VENV))
	@( $(ORACLE_VENV)/bin/python -m pip install -q --upgrade pip && \
	   $(ORACLE_VENV)/bin/python -m pip install -q -r tests/conformance/oracle-requirements.txt ) \
	   > $(ORACLE_VENV)/install.log 2>&1 || (tail -n 40 $(ORACLE_VENV)/install.log; exit 1)
	@touch $@

# jax-tpu-embedding (jax[cpu]), the JAX conformance oracle and the benchmarks' second baseline, in its own venv.
JAX_VENV := .venv-jax
JAX_STAMP := $(JAX_VENV)/.installed-py3.12
.PHONY: jax-oracle
jax-oracle: $(JAX_STAMP)

$(JAX_STAMP): tests/conformance/jax-requirements.txt
	@echo "installing jax-tpu-embedding 0.2.0 into $(JAX_VENV) (log: $(JAX_VENV)/install.log)"
	$(call venv,$(JAX_VENV))
	@( $(JAX_VENV)/bin/python -m pip install -q --upgrade pip && \
	   $(JAX_VENV)/bin/python -m pip install -q -r tests/conformance/jax-requirements.txt ) \
	   > $(JAX_VENV)/install.log 2>&1 || (tail -n 40 $(JAX_VENV)/install.log; exit 1)
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/tpu-embed demo --output build/demo

# ruff over everything, mypy over tpu_embed, profiles and pipelines, and the layering
# pipelines -> profiles -> tpu_embed.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The documentation site (build/site): a broken link, a missing page or a failing API page fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The native extensions are required (setup.py): without one the run stops here, unless TPU_EMBED_NATIVE=optional
# asks for the pure-Python fallbacks (then the tests that need an extension are skipped).
native: $(STAMP)
	@$(PY) -m pytest -q -p no:cacheprovider tests/test_native_extensions.py

# The whole suite with the oracles; the slowest tests listed at the end, where the time goes.
test: $(STAMP) $(ORACLE_STAMP) $(JAX_STAMP) lint docs native
	TPU_EMBED_ORACLE_PYTHON=$(abspath $(ORACLE_VENV))/bin/python \
	TPU_EMBED_JAX_PYTHON=$(abspath $(JAX_VENV))/bin/python $(PY) -m pytest -q --durations=15

# The edit loop: lint and the suite without the slow end-to-end and the conformance (oracle) tests.
test-fast: $(STAMP) lint native
	$(PY) -m pytest -q -m "not slow and not conformance"

bench: $(STAMP) $(ORACLE_STAMP) $(JAX_STAMP)
	TPU_EMBED_ORACLE_PYTHON=$(abspath $(ORACLE_VENV))/bin/python \
	TPU_EMBED_JAX_PYTHON=$(abspath $(JAX_VENV))/bin/python $(PY) benchmarks/csr.py

clean:
	rm -rf build .pytest_cache
