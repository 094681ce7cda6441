# Every set-up step lives here, so a fresh clone needs only `make test` or `./run`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

MATRIX_VENV := .venv-matrix
MATRIX_STAMP := $(MATRIX_VENV)/.installed

.PHONY: venv browser promtool run test lint typecheck check pytest matrix bench wheel clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[rabbitmq,embedded,example,dev,tasks]'
	touch $(STAMP)

venv: $(STAMP)

# Debian's Chromium and its driver for the browser tests (the admin pages, in a real browser):
# the driver the package puts on the PATH, so no driver manager ever tries a download. Needs
# root (CI runs as root); elsewhere it says what to install and the browser tests skip.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  echo "installing Debian's chromium and chromium-driver for the browser tests"; \
	  (apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 || \
	   (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null)) \
	  || echo "browser: could not install chromium; the browser tests will skip"; \
	else echo "browser: run 'apt-get install chromium chromium-driver' as root for the browser tests"; fi

# Debian's Prometheus for its promtool: the alert rules test runs `promtool check rules` on
# docker/alerts.yml. Installed as the browser target installs chromium: needs root (CI runs as
# root); elsewhere it says what to install and that test skips.
promtool:
	@if command -v promtool >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  echo "installing Debian's prometheus for promtool (the alert rules test)"; \
	  (apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 || \
	   (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null)) \
	  || echo "promtool: could not install prometheus; the alert rules test will skip"; \
	else echo "promtool: run 'apt-get install prometheus' as root for the alert rules test"; fi

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

pytest: venv browser promtool
	$(VENV)/bin/pytest --durations=15 $(PYTEST_ARGS)

# The suite again on the newest Python with the newest Django (6.x needs Python >= 3.12), less
# the soak tests (they test our code, not the versions, and take a minute each), the tests of
# ./run (it runs the main .venv whatever the interpreter) and the slow ones (real processes and
# servers: they test our code's timing more than the versions, and halve the cell's time)
# except a few marked version_smoke, which run real workers, gunicorn and signals on the new
# versions; skipped, saying so, where no Python 3.13 is installed.
matrix: pyproject.toml browser promtool
	@py=""; for candidate in "$$(pyenv prefix 3.13 2>/dev/null)/bin/python" python3.13; do \
	  if "$$candidate" -c "import sys; assert sys.version_info[:2] == (3, 13)" 2>/dev/null; then py=$$candidate; break; fi; \
	done; \
	if [ -z "$$py" ]; then echo "matrix: no Python 3.13 on this machine, skipped"; exit 0; fi; \
	if [ ! -f $(MATRIX_STAMP) ] || [ pyproject.toml -nt $(MATRIX_STAMP) ]; then \
	  test -x $(MATRIX_VENV)/bin/python || $$py -m venv $(MATRIX_VENV); \
	  $(MATRIX_VENV)/bin/python -m pip install -q --upgrade pip && \
	  $(MATRIX_VENV)/bin/python -m pip install -q -e '.[rabbitmq,embedded,example,dev,tasks]' && touch $(MATRIX_STAMP) || exit 1; \
	fi; \
	$(MATRIX_VENV)/bin/python -c "import django, sys; print('matrix: Python', sys.version.split()[0], 'Django', django.get_version())"; \
	$(MATRIX_VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not soak and not main_cell and (not slow or version_smoke)" --durations=15 $(PYTEST_ARGS)

# The whole gate, the same locally and in CI.
test: lint typecheck check pytest matrix

bench: venv
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

wheel: venv
	$(PY) -m pip wheel --no-deps -w dist .

clean:
	rm -rf $(VENV) $(MATRIX_VENV) .data dist build *.egg-info
