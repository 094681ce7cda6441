# Every set-up step lives here, so a fresh clone needs only `make test` or `./run`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

MATRIX_VENV := .venv-matrix
MATRIX_STAMP := $(MATRIX_VENV)/.installed

.PHONY: venv browser promtool nginx run test gate lint typecheck check pytest matrix bench wheel clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[rabbitmq,embedded,example,dev,tasks]'
	touch $(STAMP)

venv: $(STAMP)

# The tools some tests run, from Debian, by tools/install-debian-tool: it says what it installs and
# why before it does, keeps the packages' services from starting (nginx on :80, prometheus on
# :9090: nothing asked for them) and disables them at boot. Installing needs root (CI runs as
# root); elsewhere it says what to install and those tests skip (they fail where CI is set).
INSTALL_TOOL := tools/install-debian-tool

# Chromium and the driver the package puts on the PATH (so no driver manager ever tries a
# download), for the browser tests of the admin pages.
browser:
	@$(INSTALL_TOOL) --why "the browser tests (the admin pages in a real browser)" \
	  --command chromium --command chromedriver --with-recommends chromium chromium-driver

# Prometheus for its promtool: the alert rules test runs `promtool check rules` on docker/alerts.yml.
promtool:
	@$(INSTALL_TOOL) --why "the alert rules test (promtool check rules docker/alerts.yml)" \
	  --command promtool --service prometheus prometheus

# nginx: the front door test (tests/scenarios/test_front_door.py) runs the shipped docker/nginx.conf in
# front of gunicorn, on 127.0.0.1, as a process of its own.
nginx:
	@$(INSTALL_TOOL) --why "the front door test (docker/nginx.conf in front of gunicorn)" \
	  --command nginx --service nginx nginx

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

pytest: venv browser promtool nginx
	$(VENV)/bin/pytest --durations=15 $(PYTEST_ARGS)

# The suite again on the newest Python with the newest Django (6.x needs Python >= 3.12), less
# the soak tests (they test our code, not the versions, and take a minute each), the tests of
# ./run (it runs the main .venv whatever the interpreter) and the slow ones (real processes and
# servers: they test our code's timing more than the versions, and halve the cell's time)
# except a few marked version_smoke, which run real workers, gunicorn and signals on the new
# versions; skipped, saying so, where no Python 3.13 is installed.
matrix: pyproject.toml browser promtool nginx
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

# The whole gate, the same locally and in CI, then a check that it left no new listening TCP
# port behind (a daemon an install started, a server a test did not stop): the LISTEN sockets
# before and after (tools/listening_ports.py), the new ones named with their processes.
test:
	@before=$$(mktemp); $(PYTHON) tools/listening_ports.py save "$$before"; \
	$(MAKE) --no-print-directory gate; status=$$?; \
	$(PYTHON) tools/listening_ports.py check "$$before" || status=1; \
	rm -f "$$before"; exit $$status

gate: lint typecheck check pytest matrix

bench: venv
	$(PY) -m pip install -q -e '.[bench]'
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

wheel: venv
	$(PY) -m pip wheel --no-deps -w dist .

clean:
	rm -rf $(VENV) $(MATRIX_VENV) .data dist build *.egg-info
