# Two commands do all setup: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the test files spread over the cores (pytest-xdist, at most 4 workers; a file's tests stay on one worker, so
# its module fixtures are built once); PARALLEL= runs them in this process, one after another
PARALLEL ?= -n auto --maxprocesses 4 --dist loadfile

.PHONY: demo test bench docs clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/icrl-interp demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(PARALLEL)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_targets.py
	for f in benchmarks/bench_*.py; do [ $$f = benchmarks/bench_targets.py ] || $(BIN)/python $$f || exit 1; done

docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) icrl-report .pytest_cache
