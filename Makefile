# idem — the project's verbs. Every target honours DATABASE_URL (an existing server);
# without it, a throwaway local PostgreSQL 15 is started on 127.0.0.1:$(IDEM_PGPORT).
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The local cluster's port: IDEM_PGPORT if set, else the port of this checkout's cluster (read
# from its data directory, so a second shell finds it), else 54329 for a new one.
ifeq ($(origin IDEM_PGPORT),undefined)
IDEM_PGPORT := $(shell bash scripts/db.sh port 2>/dev/null || echo 54329)
endif
export IDEM_PGPORT
EXTERNAL_DB := $(DATABASE_URL)
export DATABASE_URL ?= postgresql://postgres@127.0.0.1:$(IDEM_PGPORT)/idem
# The venv installs idem-shim itself (editable); only examples/ and bench/ come from the checkout.
export PYTHONPATH := $(CURDIR)

VENV := .venv
PY := $(VENV)/bin/python
TESTDB := $(PY) scripts/testdb.py

.PHONY: help deps venv db-up db-down migrate psql test test-unit test-rules test-sql test-py test-conformance test-wheel lint lint-sql lint-py format clean env

help:  ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps:  ## Debian packages (installed as root, else the apt-get line is printed)
	@bash scripts/ensure-deps.sh

$(VENV)/.installed: requirements.txt pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -r <(sed '/^# peers:/,$$d' requirements.txt)
	@$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

venv: $(VENV)/.installed  ## Python virtualenv: the pinned requirements and idem-shim itself (editable)

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
	@p=$$(bash scripts/db.sh port 2>/dev/null); \
	  if [ -z "$(EXTERNAL_DB)" ] && [ -n "$$p" ] && [ "$$p" != "$(IDEM_PGPORT)" ]; then \
	    echo "make env: the project's cluster is on port $$p, not $(IDEM_PGPORT) (IDEM_PGPORT): unset IDEM_PGPORT or export IDEM_PGPORT=$$p" >&2; exit 1; fi
	@echo "export DATABASE_URL=$(DATABASE_URL)"

migrate: venv db-up  ## idem migrate: role, migrations and functions (one transaction), pg_cron job
	@$(VENV)/bin/idem migrate

psql: db-up  ## open psql on the database
	@psql "$(DATABASE_URL)"

# Everything CI runs, in this order; the one declaration of `test` (a new suite is added here).
test: lint test-rules test-sql test-py test-conformance test-wheel test-e2e test-chaos test-citus-if-found test-chaos-citus-if-found  ## everything CI runs

test-unit: venv  ## pytest tests/python/unit: the tests that need no database
	@$(PY) -m pytest -q tests/python/unit

# ops/prometheus/: the alert rules parse (a malformed file fails here with promtool's message) and
# every alert's unit-test file passes (series in, alerts expected out).
test-rules: deps  ## promtool check rules + promtool test rules (ops/prometheus)
	@promtool check rules ops/prometheus/idem-rules.yml
	@promtool test rules ops/prometheus/tests/*.test.yml

test-sql: venv db-up  ## pgTAP suite (pg_prove) on a fresh database
	@url=$$($(TESTDB) fresh idem_test_sql --extensions pgtap) && \
	  pg_prove -ovf --ext .sql -r -d "$$url" tests/pgtap; rc=$$?; \
	  $(TESTDB) drop idem_test_sql; exit $$rc

# Under tests/python/: unit (no database), sql (the SQL API through psycopg), shim (Flask and the
# decorator against a database), ops (cron, health, encryption, docs, GDPR, the CLI). pytest-xdist
# spreads them over PYTEST_WORKERS processes (default twice the cores: a test waits on the server
# about as long as it computes; auto: one per core; 0: one process, in order): each test builds
# its own database from its worker's template, so none depends on another or on their order.
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) * 2 )))
# Tests that share a named resource (pg_cron's own database and job, the docs' scratch databases)
# carry one xdist_group each: each holds the group's lock on the server for its whole run, so no two
# of a group run at once (tests/python/conftest.py). --dist loadgroup would also send a group to one
# worker, which pytest-xdist 3.8 cannot do under pytest 9 (tests/python/support/groups.py).
PYTEST_XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n $(PYTEST_WORKERS) --dist loadgroup)
test-py: venv db-up  ## pytest: unit, SQL API, shim, operations (on every core)
	@$(PY) -m pytest -q $(PYTEST_XDIST) tests/python/unit tests/python/sql tests/python/shim tests/python/ops

# The public conformance suites (docs/shim.md, "Conformance"): anyonce's HTTP vectors (copied in
# tests/conformance/anyonce/) against the fixture app behind the decorator under a real server, and
# idemkit 1.0.2's backend vectors from the package itself through an adapter onto the SQL API, run
# with the peers' venv (idemkit never enters the main one). About 20 s on 2 workers.
test-conformance: venv db-up peers-venv  ## the public conformance suites: anyonce's HTTP vectors, idemkit's backend vectors
	@$(PY) -m pytest -q $(PYTEST_XDIST) tests/python/conformance

test-wheel: venv db-up  ## build the wheel, install it in a clean venv outside the checkout, migrate, serve
	@PY=$(PY) bash scripts/test_wheel.sh

lint: lint-sql lint-py  ## plpgsql_check, qualified names (lint_qualified.py), ruff (check, format --check), mypy --strict

lint-sql: venv db-up
	@url=$$($(TESTDB) fresh idem_lint --extensions plpgsql_check) && \
	  $(PY) scripts/lint_sql.py "$$url"; rc=$$?; $(TESTDB) drop idem_lint; exit $$rc

PY_SOURCES := $(wildcard python scripts tests examples bench)

lint-py: venv
	@bash scripts/lint_commits.sh  # commit subjects under 72 characters (DEVELOPERS.md)
	@$(PY) scripts/lint_qualified.py  # docs, messages, queries name idem's objects as public.*
	@$(VENV)/bin/ruff check $(PY_SOURCES)
	@$(VENV)/bin/mypy  # strict, over the files listed in pyproject.toml [tool.mypy]
	@$(VENV)/bin/ruff format --check $(PY_SOURCES)

format: venv  ## ruff format: rewrite the Python sources in the project's style
	@$(VENV)/bin/ruff format $(PY_SOURCES)

clean: db-down bench-db-down ha-down citus-down ha-citus-down  ## stop the clusters and remove local state
	rm -rf .pg .pg-bench .ha .citus/cluster .ha-citus .ha-citus-test .pytest_cache .mypy_cache .ruff_cache dist .venv-peers

# --- app ---
# The reference Raptor app (examples/raptor/), its demo and the end-to-end suite (docs/demo.md).
.PHONY: serve demo test-e2e
PORT ?= 8000

serve: migrate  ## Raptor under gunicorn (4 workers) on 127.0.0.1:$(PORT), as raptor_web
	@app_url=$$($(PY) -m examples.raptor init-db) && \
	  echo "serve: seed a user with: $(PY) -m examples.raptor seed-user" && \
	  DATABASE_URL=$$app_url PORT=$(PORT) exec $(PY) -m gunicorn -c examples/raptor/gunicorn.conf.py \
	    'examples.raptor:create_app()'

demo: venv  ## local database, Raptor, a retrying client: the transcript of docs/demo.md
	@bash scripts/ensure-deps.sh demo
	@EXTERNAL_DB='$(EXTERNAL_DB)' PY=$(PY) bash examples/raptor/demo.sh

test-e2e: venv deps  ## end-to-end: gunicorn, PgBouncer, killed and frozen workers, a pg_auto_failover promotion (own clusters)
	@$(PY) -m pytest -q tests/python/e2e --ignore=tests/python/e2e/test_citus_ha.py  # that one: test-chaos-citus

# --- chaos ---
# tests/python/chaos/: Raptor (4 gunicorn workers, direct and through PgBouncer) on a durable cluster,
# 16-32 retrying clients, a seeded fault injector, then an invariant checker over the database
# and the clients' records (docs/testing.md "Chaos"). CHAOS_SEED fixes the fault schedule.
.PHONY: chaos test-chaos
CHAOS_SECONDS ?= 600
CHAOS_SEED ?= 11
# The paper order route's claim shape (before, the default; in_transaction once the shim takes it).
CHAOS_CLAIM ?= before

chaos: venv deps  ## chaos soak: faults under load, then the invariant checker (CHAOS_SECONDS, CHAOS_SEED, CHAOS_CLAIM)
	@CHAOS_SECONDS=$(CHAOS_SECONDS) CHAOS_SEED=$(CHAOS_SEED) CHAOS_CLAIM=$(CHAOS_CLAIM) $(PY) -m tests.python.chaos.soak

test-chaos: venv deps  ## the checker's own tests, then a 60-second soak with a fixed seed
	@$(PY) -m pytest -q tests/python/chaos
	@CHAOS_SECONDS=60 CHAOS_SEED=11 CHAOS_CLAIM=$(CHAOS_CLAIM) $(PY) -m tests.python.chaos.soak

# --- replicated store ---
# pg_auto_failover (scripts/ha.sh): a monitor on IDEM_HA_PORT (IDEM_PGPORT + 1) and two nodes on
# the next two ports, data in .ha/, the standby synchronous, pg_cron on both nodes; idem migrate
# goes through the multi-host URL `make ha-url` prints (docs/operations.md "Failover").
.PHONY: ha-up ha-down ha-state ha-url chaos-ha
IDEM_HA_PORT ?= $(shell echo $$(( $(IDEM_PGPORT) + 1 )))
export IDEM_HA_PORT

ha-up: venv deps  ## pg_auto_failover monitor + primary + synchronous standby (.ha/), migrated
	@bash scripts/ha.sh up
	@$(VENV)/bin/idem migrate --database-url "$$(bash scripts/ha.sh url)"

ha-down:  ## stop the replicated store's monitor and nodes
	@bash scripts/ha.sh down

ha-state:  ## pg_autoctl show state: which node is primary, which is standby
	@bash scripts/ha.sh state

ha-url:  ## print the multi-host DATABASE_URL of the replicated store
	@echo "export DATABASE_URL=$$(bash scripts/ha.sh url)"

chaos-ha: venv deps  ## chaos soak on the replicated store: primary killed, standby lost, rejoins (CHAOS_SECONDS)
	@CHAOS_SECONDS=$(CHAOS_SECONDS) CHAOS_SEED=$(CHAOS_SEED) CHAOS_CLAIM=$(CHAOS_CLAIM) $(PY) -m tests.python.chaos.soak_ha

# --- bench ---
# Contract §6's figures side by side in one run (bench/run.py: pgbench, gunicorn + wrk); prints a
# Markdown table. `make bench` writes it to bench/RESULTS.md (bench/README.md carries it). The
# benchmark asserts no timing; `make test` runs it once at a tiny size (tests/python/ops/test_bench_smoke.py).
.PHONY: bench bench-quick bench-budget bench-db-up bench-db-down
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

bench: venv bench-db-up  ## full benchmark on a durable server: 10 M rows, 100 k requests (~28 min) -> bench/RESULTS.md, bench/*.png
	@command -v wrk >/dev/null || echo "bench: wrk is missing (apt-get install wrk): the HTTP parts will not run" >&2
	@$(BENCH_ENV) $(VENV)/bin/idem migrate -q
	@$(BENCH_ENV) $(PY) bench/run.py --output bench/RESULTS.md --plots bench

bench-quick: venv bench-db-up  ## the same figures at 1.5 M rows (1 M expired) and 10 k requests (~13 min) -> bench/*-quick.png
	@command -v wrk >/dev/null || echo "bench: wrk is missing (apt-get install wrk): the HTTP parts will not run" >&2
	@$(BENCH_ENV) $(VENV)/bin/idem migrate -q
	@$(BENCH_ENV) $(PY) bench/run.py --quick --plots bench

# The database's CPU per claimed request, part by part (bench/levers/db_budget.py: subtraction
# variants of the two functions, stubs, raw statements on table copies; backend CPU from schedstat,
# so run it on the database's machine). BENCH_BUDGET_ARGS: e.g. --profile 500 --perf 10, or --ab main.
BENCH_BUDGET_ARGS ?=
bench-budget: venv bench-db-up  ## the database's budget of a claimed request (~5-15 min): what each part of the two calls costs
	@$(BENCH_ENV) $(PY) -m bench.levers.db_budget $(BENCH_BUDGET_ARGS)

# The ORM path against the plain connection, in one process (bench/levers/orm_cost.py): worker and
# database CPU per request and round trips, plain / Flask-SQLAlchemy joined / naive. BENCH_ORM_ARGS:
# ROUNDS REQUESTS (default 6 400).
.PHONY: bench-orm
BENCH_ORM_ARGS ?=
bench-orm: venv bench-db-up  ## the ORM cell (~2 min): Flask-SQLAlchemy on idem's connection against the plain route
	@$(BENCH_ENV) $(VENV)/bin/idem migrate -q
	@$(PY) -m bench.levers.orm_cost $(BENCH_URL) $(BENCH_ORM_ARGS)

# A store outage under load (bench/outage.py): a durable cluster of its own, stopped and started
# under wrk; answers per second and p99 while it is down, the time to the first 201 after.
.PHONY: bench-outage
BENCH_OUTAGE_ARGS ?=
bench-outage: venv deps  ## a 10 s store outage under 4 gunicorn workers: answers/s and p99 during, first 201 after (~1 min)
	@command -v wrk >/dev/null || { echo "bench-outage: wrk is missing (apt-get install wrk)" >&2; exit 1; }
	@$(PY) -m bench.outage $(BENCH_OUTAGE_ARGS)

# idem beside the other Python idempotency libraries on one harness (bench/peers/): each system
# in an app of its own with a raw route beside the protected one, the same `orders` INSERT, the
# same durable server, gunicorn with the same workers. The peers run from a venv of their own
# (.venv-peers: requirements.txt's shared pins for the apps plus its peers group), so the main
# venv never holds them. BENCH_PEERS_ARGS=--quick (or --smoke) for a shorter run, '--rounds N' for
# N ABBA rounds (default 3). The floor (idem's shape in raw SQL, no rules) runs beside them.
.PHONY: bench-peers peers-venv
PEERS_VENV := .venv-peers
PEERS_SHARED := gunicorn|Flask|psycopg\[binary\]|psycopg-pool|prometheus-client|SQLAlchemy
BENCH_PEERS_ARGS ?=

$(PEERS_VENV)/.installed: requirements.txt
	@test -x $(PEERS_VENV)/bin/python || python3 -m venv $(PEERS_VENV)
	@$(PEERS_VENV)/bin/python -m pip install -q --disable-pip-version-check \
	  -r <(grep -E '^($(PEERS_SHARED))==' requirements.txt; sed -n '/^# peers:/,$$p' requirements.txt)
	@touch $@

peers-venv: $(PEERS_VENV)/.installed  ## the peers' venv (.venv-peers): idemkit, drf-idempotency and their apps' packages

bench-peers: venv peers-venv bench-db-up  ## idem beside its floor and the peers (idemkit, drf-idempotency, fastidempotent): ratios, added p50, a race, on loopback and 1 ms away (~14 min)
	@command -v wrk >/dev/null || echo "bench: wrk is missing (apt-get install wrk): the peers part will not run" >&2
	@$(BENCH_ENV) $(VENV)/bin/idem migrate -q
	@$(BENCH_ENV) IDEM_PEERS_PYTHON=$(CURDIR)/$(PEERS_VENV)/bin/python $(PY) bench/run.py --parts peers $(BENCH_PEERS_ARGS)

# --- citus ---
# Contract §8: the store distributed on Citus 13.2 (docs/scaling.md). `make citus` builds it from
# CITUS_SOURCE (the tarball and its patch in ../shared/vendor/citus/) when citus.so is missing;
# the build tree is kept in .citus/build. The local cluster: a coordinator on CITUS_PORT
# (IDEM_PGPORT + 1) and two workers on the next two ports, data in .citus/cluster/.
.PHONY: citus citus-up citus-down test-citus test-citus-if-found bench-citus
CITUS_SOURCE ?= ../shared/vendor/citus/citus-13.2.2.tar.gz
export CITUS_SOURCE
CITUS_PORT ?= $(shell echo $$(( $(IDEM_PGPORT) + 1 )))
export CITUS_PORT
CITUS_URL := postgresql://postgres@127.0.0.1:$(CITUS_PORT)/idem
CITUS_LIB := $(shell /usr/lib/postgresql/15/bin/pg_config --pkglibdir 2>/dev/null)/citus.so

citus: deps  ## build and install Citus 13.2 from CITUS_SOURCE, unless citus.so is installed
	@bash scripts/citus-build.sh

citus-up: citus  ## start a local Citus coordinator and two workers (pg_cron on the coordinator)
	@bash scripts/citus.sh up

citus-down:  ## stop the local Citus cluster
	@bash scripts/citus.sh down

# On the coordinator: every pgTAP file (the same contract checks as on a single node; where the
# distributed form differs by design, a file asserts that form under psql's \if :distributed),
# the SQL API's races and its property-based state machine, and the Citus suite itself
# (tests/python/sql/test_citus.py: one shard per call, no 2PC, races on both workers, the NULL
# scope, cleanup per shard, key rotation, refusals, in-place conversion, a shard move), and the
# reference app over gunicorn with its tables colocated (tests/python/e2e/test_citus.py).
# IDEM_CITUS tells testdb.py to create each database on every node.
# Two files are left out: 070_idem_cleanup_batch.sql and 071_idem_delete_expired.sql build their
# fixture inside their own transaction, and on Citus each shard's batch commits on its worker in a
# transaction of its own (sql/citus/071), which cannot see it;
# test_the_cleanup_batch_contract_of_pgtap_070_holds_on_one_shard asserts the same outcomes there
# on the same fixture, committed.
CITUS_PGTAP_SKIP := tests/pgtap/070_idem_cleanup_batch.sql tests/pgtap/071_idem_delete_expired.sql
CITUS_PGTAP := $(filter-out $(CITUS_PGTAP_SKIP),$(sort $(wildcard tests/pgtap/*.sql)))
# the races that wait for a backend to show a lock in pg_stat_activity: on Citus it waits on a worker
CITUS_DESELECT := not beats_a_concurrent_healer and not wait_ms_returns_replay
# Its databases distributed over CITUS_TEST_SHARDS shards, not Citus's 32: every multi-shard
# statement (an install, a cleanup, the state machine's look at the whole table after each step)
# fans out to each of them, and the state machine took 95 s at 32, 41 s at 8. The same layout, both
# workers hold shards; the chaos-citus formation and bench-citus keep 32.
CITUS_TEST_SHARDS ?= 8
# Its pytest on one worker per core (each test spends seconds making a database on three nodes and
# migrating it, much of that waiting); a test that stops a worker is marked alone and runs by itself
# (tests/python/support/groups.py). CITUS_PYTEST_WORKERS=0 runs them in one process.
CITUS_PYTEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
CITUS_XDIST := $(if $(filter 0,$(CITUS_PYTEST_WORKERS)),-p no:xdist,-n $(CITUS_PYTEST_WORKERS) --dist worksteal)
test-citus: venv citus-up  ## the store on the local Citus cluster: SQL suite, races, state machine
	@export DATABASE_URL=$(CITUS_URL) IDEM_CITUS=1 IDEM_CITUS_SHARDS=$(CITUS_TEST_SHARDS) && \
	  url=$$($(TESTDB) fresh idem_test_citus --extensions pgtap) && \
	  pg_prove -f --ext .sql -d "$$url" $(CITUS_PGTAP); rc=$$?; \
	  $(TESTDB) drop idem_test_citus; [ $$rc -eq 0 ] || exit $$rc; \
	  $(PY) -m pytest -q $(CITUS_XDIST) tests/python/sql/test_citus.py tests/python/sql/test_citus_ha.py tests/python/sql/test_sec_citus.py tests/python/sql/test_sec_citus_workers.py tests/python/sql/test_sec_citus_host_users.py \
	    tests/python/sql/test_concurrency.py tests/python/sql/test_prop_sql.py \
	    tests/python/e2e/test_citus.py \
	    -k '$(CITUS_DESELECT)'

bench-citus: venv citus-up  ## benchmark part 7: the store on the local Citus cluster against a single node
	@DATABASE_URL=$(CITUS_URL) IDEM_CITUS_URL=$(CITUS_URL) $(PY) bench/run.py --parts citus

test-citus-if-found:  # make test: the Citus suite where Citus is installed or its source is found
	@if [ -f "$(CITUS_LIB)" ] || [ -f "$(CITUS_SOURCE)" ]; then $(MAKE) --no-print-directory test-citus; \
	else echo "test-citus: skipped: Citus is not installed and CITUS_SOURCE ($(CITUS_SOURCE)) is not found"; fi

# --- citus formation ---
# Contract §8's growth and failover: a Citus formation under pg_auto_failover (scripts/ha-citus.sh,
# docs/scaling.md "Growing and failing over"): a monitor on IDEM_HA_CITUS_PORT (IDEM_PGPORT + 20),
# the coordinator on the next port, worker groups of a primary and its synchronous standby after it
# (group G on +1+2G and +2+2G, three groups at most), data in .ha-citus/. `make test` builds a
# second one for the suite (.ha-citus-test/, on IDEM_PGPORT + 30), runs the formation's e2e tests
# and a 60-second chaos-citus on it, and removes it.
.PHONY: ha-citus-up ha-citus-down ha-citus-state ha-citus-url ha-citus-add-worker ha-citus-drop-worker \
	ha-citus-rebalance ha-citus-rebalance-status chaos-citus bench-citus-ha test-chaos-citus test-chaos-citus-if-found
IDEM_HA_CITUS_PORT ?= $(shell echo $$(( $(IDEM_PGPORT) + 20 )))
IDEM_HA_CITUS_TEST_PORT ?= $(shell echo $$(( $(IDEM_PGPORT) + 30 )))
export IDEM_HA_CITUS_PORT
HA_CITUS_TEST := IDEM_HA_CITUS_DIR=$(CURDIR)/.ha-citus-test IDEM_HA_CITUS_PORT=$(IDEM_HA_CITUS_TEST_PORT)

ha-citus-up: venv citus  ## Citus formation: monitor, coordinator, 2 workers with a synchronous standby each (.ha-citus/), migrated
	@bash scripts/ha-citus.sh up
	@$(VENV)/bin/idem migrate --database-url "$$(bash scripts/ha-citus.sh url)"

ha-citus-down:  ## stop the Citus formation (and the suite's, when a run left it)
	@bash scripts/ha-citus.sh down
	@$(HA_CITUS_TEST) bash scripts/ha-citus.sh down

ha-citus-state:  ## pg_autoctl show state of the formation: each group's primary and standby
	@bash scripts/ha-citus.sh state

ha-citus-url:  ## print the DATABASE_URL of the formation's coordinator
	@echo "export DATABASE_URL=$$(bash scripts/ha-citus.sh url)"

ha-citus-add-worker:  ## a new worker group and its standby (GROUP=, default the next free one); then ha-citus-rebalance
	@bash scripts/ha-citus.sh add-worker $(GROUP)

ha-citus-drop-worker:  ## move worker group GROUP's shards to the others, then remove its nodes
	@bash scripts/ha-citus.sh drop-worker $(GROUP)

ha-citus-rebalance:  ## move shards until the workers hold as many each, writes flowing (force_logical)
	@bash scripts/ha-citus.sh rebalance

ha-citus-rebalance-status:  ## the newest rebalance job and the shards per worker
	@bash scripts/ha-citus.sh rebalance-status

chaos-citus: venv citus  ## chaos soak on a Citus formation: workers lost, cuts, joins, moves (CHAOS_SECONDS, CHAOS_SEED)
	@CHAOS_SECONDS=$(CHAOS_SECONDS) CHAOS_SEED=$(CHAOS_SEED) CHAOS_CLAIM=$(CHAOS_CLAIM) $(PY) -m tests.python.chaos.soak_citus

bench-citus-ha: venv citus  ## one machine's figures of the formation: CPU per claim per node, claims across a rebalance -> bench/citus-rebalance.png
	@$(PY) -m bench.citus_ha --out bench

test-chaos-citus: venv citus  ## the formation's e2e tests, then a 60-second chaos-citus, on one formation of their own
	@export $(HA_CITUS_TEST) IDEM_HA_CITUS_REUSE=1; dir=$$(bash scripts/ha-citus.sh dir); \
	  trap 'bash scripts/ha-citus.sh down; rm -rf "$$dir"' EXIT; \
	  bash scripts/ha-citus.sh down && rm -rf "$$dir" && \
	  bash scripts/ha-citus.sh up && \
	  $(PY) -m pytest -q tests/python/e2e/test_citus_ha.py && \
	  CHAOS_SECONDS=60 CHAOS_SEED=11 $(PY) -m tests.python.chaos.soak_citus

test-chaos-citus-if-found:  # make test: the formation's suite where Citus is installed or its source is found
	@if [ -f "$(CITUS_LIB)" ] || [ -f "$(CITUS_SOURCE)" ]; then $(MAKE) --no-print-directory test-chaos-citus; \
	else echo "test-chaos-citus: skipped: Citus is not installed and CITUS_SOURCE ($(CITUS_SOURCE)) is not found"; fi
