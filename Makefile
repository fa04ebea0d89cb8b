# dblog-delta: two commands on a fresh machine — `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
SEEDS ?= 3

.PHONY: setup services-up services-down lint test test-slow test-unit chaos demo dagster clean

setup:  ## install Debian packages, the virtual environment and the Spark jars (idempotent)
	@bash scripts/setup.sh

services-up: setup  ## start MariaDB, PostgreSQL and ZooKeeper on loopback (idempotent)
	@$(PY) -m devtools.services up

services-down:
	@$(PY) -m devtools.services down

lint: setup  ## ruff and mypy on the packages; every test module imports (collection only)
	@$(VENV)/bin/ruff check dblog devtools assets resources tests bench
	@$(VENV)/bin/mypy
	@$(PY) -m pytest tests -q --collect-only -p no:cacheprovider > /dev/null || \
		$(PY) -m pytest tests -q --collect-only -p no:cacheprovider

test-unit: setup  ## the pure, service-free tests only
	@$(PY) -m pytest tests/unit -q

test: services-up lint  ## the whole suite against the real services (what CI runs)
	@$(PY) -m pytest tests -q --seeds $(SEEDS) --durations=25 -m "not slow"

test-slow: services-up  ## the long suites (every crash point); not part of `make test`
	@$(PY) -m pytest tests -q --seeds $(SEEDS) --durations=25 -m slow

ROUNDS ?= 100
chaos: services-up  ## the chaos run, per database: ROUNDS kills of tailers, captures, ZooKeeper and MariaDB or PostgreSQL
	@DBLOG_CHAOS_ROUNDS=$(ROUNDS) DBLOG_CHAOS_RESULTS=$(CURDIR)/bench/results \
		$(PY) -m pytest tests/integration/test_chaos.py -q -s -p no:cacheprovider

demo: services-up  ## the main job on the embedded default configuration
	@$(PY) -m devtools.demo

DAGSTER_HOME_DIR := $(CURDIR)/.dblog/dagster

dagster: services-up  ## the Dagster UI and daemon on http://127.0.0.1:3000 (config: $$DBLOG_CONFIG or the demo's)
	@mkdir -p $(DAGSTER_HOME_DIR) && cp deploy/dagster.yaml $(DAGSTER_HOME_DIR)/dagster.yaml
	@test -n "$$DBLOG_CONFIG" || test -f .dblog/demo/dblog.yaml || $(PY) -m devtools.demo --config-only
	@eval "$$($(PY) -m devtools.services env)" && export DBLOG_MARIADB_PASSWORD DBLOG_PG_PASSWORD && \
		DAGSTER_HOME=$(DAGSTER_HOME_DIR) $(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

clean: services-down
	rm -rf .dblog

.PHONY: bench
bench: services-up  ## capture and tail benchmarks against plain baselines (bench/results/*.json)
	@$(PY) -m bench.bench_capture
	@$(PY) -m bench.bench_capture_tables
	@$(PY) -m bench.bench_select
	@$(PY) -m bench.bench_tail
	@$(PY) -m bench.bench_current
	@$(PY) -m bench.bench_startup
	@$(PY) -m bench.bench_latency
	@$(PY) -m bench.bench_impact
	@$(PY) -m bench.bench_repair
	@$(PY) -m bench.bench_pg_capture
	@$(PY) -m bench.bench_pg_tail
