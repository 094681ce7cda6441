# Every set-up step lives here, so a fresh clone needs only `make test` or `./run`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

MATRIX_VENV := .venv-matrix
MATRIX_STAMP := $(MATRIX_VENV)/.installed

.PHONY: venv bytecode matrix-venv installs browser promtool nginx pgbouncer run test gate lint typecheck check pytest matrix soak bench wheel clean

# uv installs the project (in about ten seconds where pip takes forty; the same versions as
# pip's); pip itself stays in the environment for whoever uses it. --compile-bytecode as pip
# does: where PYTHONDONTWRITEBYTECODE is set (CI sets it), nothing compiles later, and every
# process the tests start would compile Django again (twice as slow to start). The matrix
# environment keeps pip: there the two resolve differently (uv prefers the newest Django, pip
# the newest django-prometheus, which caps Django), and the matrix tests what pip installs.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e '.[rabbitmq,embedded,example,dev,tasks]'
	touch $(STAMP)

venv: $(STAMP)

# The project's own modules compiled once, for each Python that runs them: the editable install
# compiles site-packages only, and where PYTHONDONTWRITEBYTECODE is set (CI sets it) every process
# a test starts, hundreds of them, would compile these two hundred modules again (a quarter of a
# second of CPU each). A module changed later is compiled in memory again, as without them.
SOURCES := composition billing project tests
bytecode: venv
	$(PY) -m compileall -q -j 0 $(SOURCES)

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

# PgBouncer: the tests behind a transaction pooler (tests/db/test_pgbouncer.py) start their own, on a
# free loopback port, never the packaged service.
pgbouncer:
	@$(INSTALL_TOOL) --why "the tests behind a transaction pooler (their own PgBouncer per test)" \
	  --command pgbouncer --service pgbouncer pgbouncer

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

# The main cell: every test but the soak tests, which `make soak` runs (docs/testing.md), in four
# shards side by side (tools/run_shards.py): these paths, those, those, and the rest, 7 to 9
# minutes of tests each. The scenarios are split by name (a new one joins by its first letter).
# The tests that start the embedded servers in .data (./run, the install guide, tests/project)
# are all in shard 0.
SCENARIOS_A_TO_J := $(wildcard tests/scenarios/test_[a-j]*.py)
SHARD_0 := $(SCENARIOS_A_TO_J) tests/scenarios/test_run_command.py tests/project tests/docs tests/deploy \
  tests/backpressure
SHARD_1 := $(filter-out $(SHARD_0),$(wildcard tests/scenarios/test_*.py)) tests/admin tests/broker
SHARD_2 := tests/health tests/outbox tests/db tests/billing tests/tasks
pytest: bytecode browser promtool nginx pgbouncer
	$(PY) tools/run_shards.py --pytest $(VENV)/bin/pytest --shard "$(SHARD_0)" --shard "$(SHARD_1)" --shard "$(SHARD_2)" -- \
	  -m "not soak" --durations=15 $(PYTEST_ARGS)

# The soak tests alone, never part of `make test`: the scenarios that take minutes by nature at
# full size (the chaos soak, the SIGKILL storm, a 35 s migration). The gate runs a short version of
# each; docs/testing.md says which and what it still catches. They need no browser, promtool or nginx.
soak: bytecode
	$(VENV)/bin/pytest -m soak --durations=15 $(PYTEST_ARGS)

# The second cell runs only what the Python or Django version changes, on the newest Python with
# the newest Django (6.x needs Python >= 3.12): the other dependencies resolve alike in both cells,
# so the rest would only run again. Chosen by path, as the tests mirror the code: the modules that
# read Django's internals (docs/architecture.md) or lean on its ORM, transactions and on_commit,
# request handling, admin, system checks, migrate and django.tasks (the framework's own on 6, the
# backport on 5.2); and Python's signals, threads, argparse messages and asynchronous exceptions
# (lifecycle, time limits). In those files the slow tests stay out unless marked version_smoke:
# real workers, gunicorn, signals and migrate on the new versions (tests/project/test_gate.py
# checks that every such file is listed); main_cell and soak tests never run here. A new test in a
# listed folder joins by itself. First `manage.py check` and `makemigrations --check`, which a new
# Django can fail on its own (a deprecation warning, a changed migration).
MATRIX_TESTS := \
	tests/core/test_internals.py tests/checks/test_settings.py tests/core/test_logging.py \
	tests/core/test_retention.py tests/core/test_views.py \
	tests/db tests/admin tests/tasks tests/locks/test_db.py \
	tests/outbox/test_publish.py tests/outbox/test_publish_many.py tests/outbox/test_maintenance.py \
	tests/jobs/test_inbox.py tests/jobs/test_schema.py tests/jobs/test_deadletters.py \
	tests/jobs/test_replay.py tests/jobs/test_connection_hygiene.py tests/jobs/middleware/test_stack.py \
	tests/cache/test_api.py tests/cache/test_invalidation.py \
	tests/billing/test_admin.py tests/billing/test_api.py tests/billing/test_services.py \
	tests/billing/test_pay_after_commit.py tests/health/test_checks.py tests/prometheus/test_access.py \
	tests/backpressure/test_admission.py tests/lifecycle/test_system.py tests/broker/test_time_limits.py \
	tests/scenarios/test_workers_drain.py tests/scenarios/test_billing_email.py \
	tests/schedules/test_ticks.py tests/schedules/test_checks_and_command.py

# The matrix cell's virtual environment, on Python 3.13 (pyenv's, else python3.13 on the PATH);
# where there is none, it says so and the matrix cell is skipped.
matrix-venv:
	@py=""; for candidate in "$$(pyenv prefix 3.13 2>/dev/null)/bin/python" python3.13; do \
	  if "$$candidate" -c "import sys; assert sys.version_info[:2] == (3, 13)" 2>/dev/null; then py=$$candidate; break; fi; \
	done; \
	if [ -z "$$py" ]; then echo "matrix: no Python 3.13 on this machine, skipped"; rm -f $(MATRIX_STAMP); exit 0; fi; \
	if [ ! -f $(MATRIX_STAMP) ] || [ pyproject.toml -nt $(MATRIX_STAMP) ]; then \
	  test -x $(MATRIX_VENV)/bin/python || $$py -m venv $(MATRIX_VENV); \
	  $(MATRIX_VENV)/bin/python -m pip install -q --upgrade pip && \
	  $(MATRIX_VENV)/bin/python -m pip install -q -e '.[rabbitmq,embedded,example,dev,tasks]' && touch $(MATRIX_STAMP) || exit 1; \
	fi

matrix: matrix-venv
	@if [ ! -f $(MATRIX_STAMP) ]; then exit 0; fi; \
	$(MATRIX_VENV)/bin/python -c "import django, sys; print('matrix: Python', sys.version.split()[0], 'Django', django.get_version())" && \
	$(MATRIX_VENV)/bin/python -m compileall -q -j 0 $(SOURCES) && \
	$(MATRIX_VENV)/bin/python manage.py check --fail-level WARNING && \
	$(MATRIX_VENV)/bin/python manage.py makemigrations --check --dry-run && \
	$(MATRIX_VENV)/bin/python -m pytest -q -p no:cacheprovider $(MATRIX_TESTS) \
	  -m "not soak and not main_cell and (not slow or version_smoke)" --durations=15 $(PYTEST_ARGS)

# Everything the gate installs, the Debian tools beside the two virtual environments: about half
# a minute rather than a minute one after the other. The environments go one after the other
# (their editable installs build in the same tree), and so do the tools (one apt at a time); the
# tools' lines are printed once both are done.
installs:
	@log=$$(mktemp); \
	$(MAKE) --no-print-directory browser promtool nginx pgbouncer >"$$log" 2>&1 & tools=$$!; \
	$(MAKE) --no-print-directory venv matrix-venv; envs=$$?; \
	wait $$tools; tools_status=$$?; cat "$$log"; rm -f "$$log"; \
	[ $$envs -eq 0 ] && [ $$tools_status -eq 0 ]

# The whole gate, the same locally and in CI (the installs, then the checks and both cells; at most
# 12 minutes on a 2-core machine from a fresh clone), then a check that it left no new listening TCP
# port behind (a daemon an install started, a server a test did not stop): the LISTEN sockets
# before and after (tools/listening_ports.py), the new ones named with their processes.
test:
	@before=$$(mktemp); $(PYTHON) tools/listening_ports.py save "$$before"; \
	$(MAKE) --no-print-directory installs && $(MAKE) --no-print-directory gate; status=$$?; \
	$(PYTHON) tools/listening_ports.py check "$$before" || status=1; \
	rm -f "$$before"; exit $$status

# The matrix cell runs beside the others (its own test database, Redis databases and temporary
# directory: TEST_SHARD=4, after the main cell's four shards), its output printed after theirs.
gate:
	@log=$$(mktemp); tmp=$$(mktemp -d /tmp/shard4-XXXXXX); chmod 1777 "$$tmp"; \
	TEST_SHARD=4 TMPDIR="$$tmp" $(MAKE) --no-print-directory matrix >"$$log" 2>&1 & matrix=$$!; \
	$(MAKE) --no-print-directory lint typecheck check pytest; status=$$?; \
	wait $$matrix; matrix_status=$$?; cat "$$log"; rm -rf "$$log" "$$tmp"; \
	[ $$status -eq 0 ] && [ $$matrix_status -eq 0 ]

bench: venv
	$(PY) -m pip install -q -e '.[bench]'
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

wheel: venv
	$(PY) -m pip wheel --no-deps -w dist .

clean:
	rm -rf $(VENV) $(MATRIX_VENV) .data dist build *.egg-info
