# Weir: the commands a user and CI run. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INFRA := deploy/local/infra.sh
# Every target here works with the local services: the local mode (the local S3 server and its development
# keys are the S3 defaults; docs/configuration.md). `make ... WEIR_LOCAL_MODE=false` turns it off.
export WEIR_LOCAL_MODE ?= true
BROWSER := deploy/local/browser.sh

.PHONY: help setup proto infra-up infra-down infra-status browser tools bytecode test test-unit test-integration \
        lint constraints demo scenarios scenario-keyed-aggregation scenario-barriers scenario-two-phase-commit \
        scenario-recovery scenario-upgrade scenario-backpressure chaos cluster-up cluster-down bench bench-quick bench-exchange bench-state \
        bench-backpressure bench-recovery bench-json bench-jobtest bench-cpu bench-nexmark bench-jm-scale bench-docs bench-slots bench-deps clean

help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# The dependencies exactly as requirements/dev.lock pins them (the server, postgres-binary and dev extras,
# every file's hash checked), then Weir itself, editable, without them and without build isolation (the
# lock holds the build backend); `pip check` that the two agree. The editable install runs the build hook
# (build_hooks.py), which generates weir/wire/*_pb2* from proto/.
$(VENV)/.installed: pyproject.toml requirements/dev.lock
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --require-hashes --no-deps -r requirements/dev.lock
	$(VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	$(VENV)/bin/pip check
	touch $@

setup: $(VENV)/.installed proto ## create .venv: Weir with its server and dev extras at the versions of requirements/dev.lock, gRPC code generated

proto: | $(VENV)/.installed ## (re)generate weir/wire/*_pb2*.py from proto/ after a .proto changed (the build hook's generator)
	$(PY) build_hooks.py

constraints: | $(VENV)/.installed ## regenerate the lock files requirements/*.lock from pyproject.toml (uv pip compile, hashes); UPGRADE=1: the newest versions allowed
	$(PY) deploy/lock.py $(if $(UPGRADE),--upgrade)

infra-up: ## install (first use) and start Kafka, PostgreSQL, the S3 server and Prometheus
	$(INFRA) up

infra-down: ## stop the local services
	$(INFRA) down

browser: ## install Debian's chromium for the web UI's browser test (only when /usr/bin/chromium is missing)
	$(BROWSER) install

infra-status: ## print the endpoints (NAME=value) and each service's state
	@$(INFRA) status

# Exit 3: the Go module proxy cannot be reached; the rest of make test still runs, and the tests that
# need a tool fail, saying so (a test never skips for a missing tool).
tools: ## build the pinned docker-compose and kustomize (deploy checks) into ~/.cache/weir/tools (first use)
	deploy/local/tools.sh install || [ $$? -eq 3 ]

# Every test, the scenarios at test size among them (there is no separate long suite); the slowest 30 listed.
# The unit tests (CPU-bound, no services) run beside the integration tests (which mostly wait on their
# clusters and services). First the integration tests marked `serial` (they restart or pause the shared
# services; the short chaos run is a paced job, mostly waiting) run alone on one cluster, beside the first
# minutes of the unit tests rather than the two clusters; then the others on INTEGRATION_WORKERS session clusters at once
# (pytest-xdist, whole files per worker so that a module's fixtures start once, handed out in collection
# order: the longest files first, tests/integration/conftest.py's SLOW_FILES; each worker's cluster on
# ports of its own, tests/integration/ports.py). Each run collects only its own folder. The unit run's
# output follows; any of the three failing fails.
UNIT_LOG := .pytest-unit.log
INTEGRATION_WORKERS ?= 2
test: setup infra-up browser tools bytecode ## unit + integration tests against the real local services, scenarios included (28.7 min measured at 56d4444 on 2 cores with two clusters; what CI runs)
	@$(PY) -m pytest -q -p no:cacheprovider -m "not integration" tests/unit > $(UNIT_LOG) 2>&1 & unit=$$!; \
	echo "== the serial integration tests (they restart or pause the shared services), alone beside the unit tests:"; \
	$(PY) -m pytest -q -m "integration and serial" --durations=10 tests/integration; serial=$$?; \
	echo "== the other integration tests, on $(INTEGRATION_WORKERS) clusters:"; \
	$(PY) -m pytest -q -m "integration and not serial" -n $(INTEGRATION_WORKERS) --dist loadfile --no-loadscope-reorder \
	    --durations=30 tests/integration; integration=$$?; \
	wait $$unit; unit_rc=$$?; echo "== unit tests (-m 'not integration'), run beside the integration tests:"; \
	tail -n 40 $(UNIT_LOG); echo "== integration: exit $$integration; serial: exit $$serial; unit: exit $$unit_rc"; \
	[ $$integration -eq 0 ] && [ $$serial -eq 0 ] && [ $$unit_rc -eq 0 ]

# The checkout's modules compiled once, before a run of many processes: where Python may not write its
# bytecode (PYTHONDONTWRITEBYTECODE, as this machine sets it), every process started
# (a TaskManager, a job's load check, a CLI call, a restart after a kill) otherwise compiled the weir
# modules it imports from source again (0.25 s of the JobManager's 1.15 s of imports, 0.2 s of a
# TaskManager's 0.9). Only what changed is compiled.
bytecode: | $(VENV)/.installed ## compile the checkout's modules to bytecode (make test runs it)
	$(PY) -m compileall -q -j 0 weir jobmanager taskmanager connectors operators bench tests > /dev/null

test-unit: setup tools bytecode ## unit tests only, no services
	$(PY) -m pytest -q -m "not integration" tests/unit

lint: setup ## ruff, the import-linter contracts and mypy (pyproject.toml); tests/unit/test_lint.py runs the same in make test
	$(VENV)/bin/ruff check weir jobmanager taskmanager connectors operators tests examples bench
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

demo: setup infra-up ## run the keyed aggregation demo end to end
	$(PY) -m weir.tools.demo

# The end-to-end scenarios (weir scenario NAME; `weir scenario` lists them; the code is weir/scenarios/).
# SCENARIO_ARGS go to the scenario, e.g. make scenario-recovery SCENARIO_ARGS="--events 20000", or
# SCENARIO_ARGS=--json for the report as one JSON document.
SCENARIOS := keyed-aggregation barriers two-phase-commit recovery upgrade backpressure

scenario-keyed-aggregation: setup infra-up ## the keyed window job: state and both sinks equal a reference
	$(PY) -m weir.tools.cli scenario keyed-aggregation $(SCENARIO_ARGS)

scenario-barriers: setup infra-up ## a two-input job: barrier arrival and hold per channel, the snapshot's cut, visibility vs recovery point
	$(PY) -m weir.tools.cli scenario barriers $(SCENARIO_ARGS)

scenario-two-phase-commit: setup infra-up ## the open Kafka transaction and the prepared PostgreSQL one, then both committed
	$(PY) -m weir.tools.cli scenario two-phase-commit $(SCENARIO_ARGS)

scenario-recovery: setup infra-up ## a TaskManager killed after pre-commit: aborted output, replay counted, effects once, sinks reconciled
	$(PY) -m weir.tools.cli scenario recovery $(SCENARIO_ARGS)

scenario-upgrade: setup infra-up ## the seed's upgrade scenario: v1 -> stop with savepoint -> v2 at another parallelism, checked
	$(PY) -m weir.tools.cli scenario upgrade $(SCENARIO_ARGS)

scenario-backpressure: setup infra-up ## the seed's backpressure scenario: a slow sink, aligned then unaligned checkpoints, measured
	$(PY) -m weir.tools.cli scenario backpressure $(SCENARIO_ARGS)

scenarios: setup infra-up ## every scenario above, one after the other (~15 min); exit 1 if any FAILed
	@rc=0; for s in $(SCENARIOS); do $(PY) -m weir.tools.cli scenario $$s || rc=1; done; exit $$rc

chaos: setup infra-up ## faults of TaskManagers, the JobManager, Kafka, PostgreSQL, S3 and a local disk at random (~12 min); CHAOS_ARGS="--seed 7 --faults 12"
	$(PY) -m tests.chaos.driver $(CHAOS_ARGS)

cluster-up: setup ## JobManager + 3 TaskManagers as local processes
	$(VENV)/bin/weir cluster up

cluster-down:
	$(VENV)/bin/weir cluster down

$(VENV)/.bench-installed: requirements/bench.lock $(VENV)/.installed
	$(VENV)/bin/pip install -q --require-hashes --no-deps -r requirements/bench.lock
	touch $@

bench-deps: $(VENV)/.bench-installed ## the bench extra; the Flink contender built (when missing or stale) into the cache, WEIR_CACHE_DIR/bench/flink
	bench/flink/build.sh

bench-exchange: setup bench-deps ## records/s: raw gRPC, one Weir channel, the keyed job on a private cluster
	$(PY) -m bench.exchange_bench $(BENCH_ARGS)
	$(PY) -m bench.docs

bench-quick: setup bench-deps ## the keyed benchmark, short: 200k events, 3 runs per contender, rotated order (docs/benchmarks.md)
	$(PY) -m bench.run --quick $(BENCH_ARGS)
	$(PY) -m bench.docs

bench-state: setup bench-deps ## checkpoint and restore curves over 100k/1M/5M keys
	$(PY) -m bench.state_bench $(STATE_BENCH_ARGS)
	$(PY) -m bench.docs

bench-backpressure: setup bench-deps ## checkpoint duration aligned vs unaligned under a slow sink; unaligned's throughput cost
	$(PY) -m bench.backpressure_bench $(BACKPRESSURE_BENCH_ARGS)
	$(PY) -m bench.docs

bench-recovery: setup bench-deps ## SIGKILL of a TaskManager under load to the first committed output, median of 5 kills
	$(PY) -m bench.recovery_bench $(RECOVERY_BENCH_ARGS)
	$(PY) -m bench.docs

bench-slots: setup ## one TaskManager, 1 vs 2 slots, slot processes on and off, on a CPU-bound job: records/s, cores, the ratio (~8 min)
	$(PY) -m bench.slots_bench $(SLOTS_BENCH_ARGS)

bench-json: setup $(VENV)/.bench-installed ## JSON decode/encode CPU µs per event, stdlib vs orjson vs msgspec vs ujson (~30 s)
	$(PY) -m bench.json_bench $(JSON_BENCH_ARGS)
	$(PY) -m bench.docs

bench-jobtest: setup ## weir test --failures over the example keyed aggregation (10,000 records): CPU and wall s, this tree vs where it left main, 5 alternating runs each (~5 min)
	$(PY) -m bench.jobtest_bench $(JOBTEST_BENCH_ARGS)
	$(PY) -m bench.docs

bench-cpu: setup ## CPU µs per event of the keyed job's two paths and every Nexmark query's record path, in one process (CPU_BENCH_ARGS; --compare to set two trees' rounds side by side)
	$(PY) -m bench.cpu_bench --nexmark q0,q1,q2,q3,q4,q5,q7,q8,q11 $(CPU_BENCH_ARGS)

bench-nexmark: setup bench-deps ## Nexmark on Weir vs Flink SQL as the reference configures it: 3 runs per query and side (ABBA), medians and spread, outputs checked record for record (1M events; NEXMARK_BENCH_ARGS=--quick: 100k, q0-q2; --sql: Weir runs the same SQL text as Flink, results in nexmark-sql.*)
	$(PY) -m bench.nexmark_bench $(NEXMARK_BENCH_ARGS)
	$(PY) -m bench.docs

bench-docs: setup ## docs/benchmarks.md's results blocks regenerated from bench/results/*.json (the bench targets run it)
	$(PY) -m bench.docs

bench-jm-scale: setup $(VENV)/.bench-installed ## one JobManager against simulated TaskManagers: deployment, checkpoint round trip, CPU, heartbeats up to 1,000 subtasks / 100 TaskManagers (~5 min; JM_SCALE_ARGS=--quick); writes docs/benchmarks-jm-scale.md
	$(PY) -m bench.jm_scale $(JM_SCALE_ARGS)

bench: setup bench-deps ## the keyed benchmark vs Quix Streams, the raw limit, Flink and the ceiling (2M events, 3 runs), then bench-json, bench-state, bench-backpressure and bench-recovery (long)
	$(PY) -m bench.run $(BENCH_ARGS)
	$(PY) -m bench.json_bench $(JSON_BENCH_ARGS)
	$(PY) -m bench.state_bench $(STATE_BENCH_ARGS)
	$(PY) -m bench.backpressure_bench $(BACKPRESSURE_BENCH_ARGS)
	$(PY) -m bench.recovery_bench $(RECOVERY_BENCH_ARGS)
	$(PY) -m bench.docs

clean:
	rm -rf $(VENV) weir/wire/*_pb2*.py weir/wire/*_pb2*.pyi *.egg-info build dist .pytest_cache
