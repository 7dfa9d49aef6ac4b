# idem — the project's verbs. Every target honours DATABASE_URL (an existing server);
# without it, a throwaway local PostgreSQL 15 is started on 127.0.0.1:$(IDEM_PGPORT).
SHELL := /bin/bash
.DEFAULT_GOAL := help

IDEM_PGPORT ?= 54329
export IDEM_PGPORT
EXTERNAL_DB := $(DATABASE_URL)
export DATABASE_URL ?= postgresql://postgres@127.0.0.1:$(IDEM_PGPORT)/idem
export PYTHONPATH := $(CURDIR)/python:$(CURDIR)

VENV := .venv
PY := $(VENV)/bin/python
TESTDB := $(PY) scripts/testdb.py

.PHONY: help deps venv db-up db-down migrate psql test test-sql test-py lint lint-sql lint-py clean env

help:  ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps:  ## Debian packages (installed as root, else the apt-get line is printed)
	@bash scripts/ensure-deps.sh

$(VENV)/.installed: requirements.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	@touch $@

venv: $(VENV)/.installed  ## Python virtualenv with the pinned requirements

db-up: deps  ## start the local cluster (no-op with DATABASE_URL)
ifeq ($(EXTERNAL_DB),)
	@DATABASE_URL= bash scripts/db.sh up
else
	@echo "db-up: using DATABASE_URL"
endif

db-down:  ## stop the local cluster
ifeq ($(EXTERNAL_DB),)
	@DATABASE_URL= bash scripts/db.sh down
endif

env:  ## print the DATABASE_URL the targets use
	@echo "export DATABASE_URL=$(DATABASE_URL)"

migrate: venv db-up  ## apply migrations, then re-apply every function
	@$(PY) scripts/migrate.py

psql: db-up  ## open psql on the database
	@psql "$(DATABASE_URL)"

test: lint test-sql test-py  ## everything CI runs

test-sql: venv db-up  ## pgTAP suite (pg_prove) on a fresh database
	@url=$$($(TESTDB) fresh idem_test_sql --extensions pgtap,dblink) && \
	  pg_prove -ovf --ext .sql -r -d "$$url" tests/pgtap; rc=$$?; \
	  $(TESTDB) drop idem_test_sql; exit $$rc

test-py: venv db-up  ## pytest: concurrency, migrations, shim
	@$(PY) -m pytest -q tests/python

lint: lint-sql lint-py  ## plpgsql_check, ruff, mypy

lint-sql: venv db-up
	@url=$$($(TESTDB) fresh idem_lint --extensions plpgsql_check) && \
	  $(PY) scripts/lint_sql.py "$$url"; rc=$$?; $(TESTDB) drop idem_lint; exit $$rc

lint-py: venv
	@$(VENV)/bin/ruff check $(wildcard python tests scripts examples bench)
	@$(VENV)/bin/mypy --strict python/idem_shim

clean: db-down bench-db-down  ## stop the clusters and remove local state
	rm -rf .pg .pg-bench .pytest_cache .mypy_cache .ruff_cache

# --- app ---
# The reference Raptor app (examples/raptor/), its demo and the end-to-end suite (docs/demo.md).
.PHONY: serve demo test-e2e
PORT ?= 8000

serve: migrate  ## Raptor under gunicorn (4 workers) on 127.0.0.1:$(PORT), as raptor_web
	@app_url=$$($(PY) -m examples.raptor init-db) && \
	  echo "serve: seed a user with: $(PY) -m examples.raptor seed-user" && \
	  DATABASE_URL=$$app_url PORT=$(PORT) exec $(PY) -m gunicorn -c examples/raptor/gunicorn.conf.py \
	    'examples.raptor:create_app()'

demo: venv deps  ## local database, Raptor, a retrying client: the transcript of docs/demo.md
	@EXTERNAL_DB='$(EXTERNAL_DB)' PY=$(PY) bash examples/raptor/demo.sh

test-e2e: venv deps  ## end-to-end: gunicorn, PgBouncer, killed and frozen workers (own cluster)
	@$(PY) -m pytest -q tests/e2e

test: test-e2e

# --- bench ---
# SPEC §6's figures side by side in one run (bench/run.py: pgbench, gunicorn + wrk); prints a
# Markdown table. `make bench` writes it to bench/RESULTS.md (the README carries it). The
# benchmark asserts no timing; `make test` runs it once at a tiny size (tests/python/test_bench_smoke.py).
.PHONY: bench bench-quick bench-db-up bench-db-down
# The benchmark measures production shape: a cluster of its own with fsync, synchronous_commit and
# full_page_writes on (data in .pg-bench/, port IDEM_BENCH_PGPORT = IDEM_PGPORT + 100), so the
# test cluster keeps its fast settings. With DATABASE_URL, that server is measured as it is (the
# table's first line says so when it is not durable).
IDEM_BENCH_PGPORT ?= $(shell echo $$(( $(IDEM_PGPORT) + 100 )))
BENCH_URL := $(if $(EXTERNAL_DB),$(EXTERNAL_DB),postgresql://postgres@127.0.0.1:$(IDEM_BENCH_PGPORT)/idem)
BENCH_ENV := DATABASE_URL=$(BENCH_URL)

bench-db-up: deps  ## start the durable benchmark cluster (no-op with DATABASE_URL)
ifeq ($(EXTERNAL_DB),)
	@DATABASE_URL= IDEM_PGDIR=$(CURDIR)/.pg-bench IDEM_PGPORT=$(IDEM_BENCH_PGPORT) IDEM_PG_DURABLE=1 \
	  bash scripts/db.sh up
endif

bench-db-down:  ## stop the benchmark cluster
ifeq ($(EXTERNAL_DB),)
	@DATABASE_URL= IDEM_PGDIR=$(CURDIR)/.pg-bench IDEM_PGPORT=$(IDEM_BENCH_PGPORT) bash scripts/db.sh down
endif

bench: venv bench-db-up  ## full benchmark on a durable server: 10 M rows, 100 k requests (~15 min) -> bench/RESULTS.md
	@command -v wrk >/dev/null || echo "bench: wrk is missing (apt-get install wrk): the HTTP parts will not run" >&2
	@$(BENCH_ENV) $(PY) scripts/migrate.py
	@$(BENCH_ENV) $(PY) bench/run.py --output bench/RESULTS.md

bench-quick: venv bench-db-up  ## the same figures at 1 M rows and 10 k requests (~3 min)
	@command -v wrk >/dev/null || echo "bench: wrk is missing (apt-get install wrk): the HTTP parts will not run" >&2
	@$(BENCH_ENV) $(PY) scripts/migrate.py
	@$(BENCH_ENV) $(PY) bench/run.py --quick
