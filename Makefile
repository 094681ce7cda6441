# Every set-up step lives here, so a fresh clone needs only `make test` or `./run`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

MATRIX_VENV := .venv-matrix
MATRIX_STAMP := $(MATRIX_VENV)/.installed

.PHONY: venv run test lint typecheck check pytest matrix bench wheel clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[rabbitmq,embedded,example,dev]'
	touch $(STAMP)

venv: $(STAMP)

# A convenience: ./run is the README's command. Under make, Ctrl-C still drains the system in
# order, but make itself then reports exit 130 (it re-raises SIGINT).
run: venv
	./run

lint: venv
	$(VENV)/bin/ruff check .

typecheck: venv
	$(VENV)/bin/mypy

check: venv
	$(PY) manage.py check --fail-level WARNING
	$(PY) manage.py makemigrations --check --dry-run

pytest: venv
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The suite again on the newest Python with the newest Django (6.x needs Python >= 3.12), less
# the soak tests (they test our code, not the versions, and take a minute each); skipped, saying
# so, where no Python 3.13 is installed.
matrix: pyproject.toml
	@py=""; for candidate in "$$(pyenv prefix 3.13 2>/dev/null)/bin/python" python3.13; do \
	  if "$$candidate" -c "import sys; assert sys.version_info[:2] == (3, 13)" 2>/dev/null; then py=$$candidate; break; fi; \
	done; \
	if [ -z "$$py" ]; then echo "matrix: no Python 3.13 on this machine, skipped"; exit 0; fi; \
	if [ ! -f $(MATRIX_STAMP) ] || [ pyproject.toml -nt $(MATRIX_STAMP) ]; then \
	  test -x $(MATRIX_VENV)/bin/python || $$py -m venv $(MATRIX_VENV); \
	  $(MATRIX_VENV)/bin/python -m pip install -q --upgrade pip && \
	  $(MATRIX_VENV)/bin/python -m pip install -q -e '.[rabbitmq,embedded,example,dev]' && touch $(MATRIX_STAMP) || exit 1; \
	fi; \
	$(MATRIX_VENV)/bin/python -c "import django, sys; print('matrix: Python', sys.version.split()[0], 'Django', django.get_version())"; \
	$(MATRIX_VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not soak" $(PYTEST_ARGS)

# The whole gate, the same locally and in CI.
test: lint typecheck check pytest matrix

bench: venv
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

wheel: venv
	$(PY) -m pip wheel --no-deps -w dist .

clean:
	rm -rf $(VENV) $(MATRIX_VENV) .data dist build *.egg-info
