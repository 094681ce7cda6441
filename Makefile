# Every set-up step lives here, so a fresh clone needs only `make test` or `./run`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test lint typecheck check pytest bench wheel clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[rabbitmq,embedded,example,dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: venv
	$(VENV)/bin/ruff check .

typecheck: venv
	$(VENV)/bin/mypy

check: venv
	$(PY) manage.py check --fail-level WARNING
	$(PY) manage.py makemigrations --check --dry-run

pytest: venv
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The whole gate, the same locally and in CI.
test: lint typecheck check pytest

bench: venv
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

wheel: venv
	$(PY) -m pip wheel --no-deps -w dist .

clean:
	rm -rf $(VENV) .data dist build *.egg-info
