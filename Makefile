# rl-verify developer entry points. Everything runs from the project virtualenv (.venv).
#   make venv            create/update .venv (fast no-op when requirements are unchanged)
#   make test            lint, then all tests: unit, integration (simulated node over real sshd), e2e (real Airflow);
#                        test files in two pytest processes (see requirements-dev.txt)
#   make demo            whole DAG on the simulated node through a real local Airflow
#                        (COMMIT=<branch|tag|sha>, KEEP=1 leaves it running)
#   make demo-calibration  calibrate OPD's baseline (N runs, one node then two), reject then approve, verify
#                        main (PASS) and sim/regress-teacher (FAIL) against the new version
#   make demo-distributed  the same on PostgreSQL + Redis + two Celery workers + S3 + two nodes
#                        (GRPO and OPD in parallel; SEQUENTIAL=1 adds a one-node run for comparison)
#   make demo-bisect     a nightly FAIL bisected to its culprit commit, probes in parallel on two nodes
#   make demo-slurm      the verification (PASS) and a bisection (its culprit, two probes at once) with the GPU jobs
#                        through a real private single-node Slurm (as root: Debian's slurmctld, slurmd, munge)
#   make gallery         report headline, class and first next step for every simulated regression
#                        (.venv/bin/python -m scripts.report_gallery --no-early-abort: reports comparable byte for byte)
#   make lint            byte-compile + ruff + the layer contract (lint-imports) + shellcheck (pinned in
#                        requirements-dev.txt; ruff and import-linter config in pyproject.toml); shellcheck:
#                        sh templates, scripts, .ci/run, tracked .sh files
#                        except simulator/xtuner_checkout (test doubles mimicking XTuner's scripts, traps included)
#   make clean           remove .venv, .state, caches
# Variables (unset or empty = the default; a bad value is refused in one line naming it, nothing started):
#   COMMIT=<branch|tag|sha>  demo, demo-distributed, demo-calibration (default main)
#   SUITES=<grpo,opd>        demo: the suites to verify (default both)
#   KEEP=1                   demo: leave Airflow and the node running
#   SEQUENTIAL=1             demo-distributed: also run both suites on one node
#   STEP_SECONDS=<seconds>   simulated seconds per training step (demo, demo-distributed 1.0; demo-calibration 0.2;
#                            demo-bisect 0.1)
#   RUNS=<N>                 demo-calibration: calibration runs (default 3, from 2 to 20)
#   NODES=<1|2>              demo-bisect: nodes the bisection probes on (default 2)
#   PYTEST_ARGS=<args>       test: extra pytest arguments, e.g. PYTEST_ARGS="-k history"

SHELL := /bin/bash
PY := .venv/bin/python
COMMIT ?=
SUITES ?=
KEEP ?=
SEQUENTIAL ?=
STEP_SECONDS ?=
RUNS ?=
NODES ?=
PYTEST_ARGS ?=
# $(call q,TEXT): TEXT as one single-quoted shell word, whatever it holds (the script judges the value).
q = '$(subst ','\'',$(1))'

.PHONY: venv test demo demo-distributed demo-calibration demo-bisect demo-slurm demo-stop bench gallery lint clean ensure-sshd ensure-chromium ensure-services ensure-slurm

venv:
	./scripts/bootstrap.sh

ensure-sshd:
	@if [ -x scripts/ensure_sshd.sh ]; then ./scripts/ensure_sshd.sh; \
	elif [ -f scripts/ensure_sshd.sh ]; then bash scripts/ensure_sshd.sh; fi

# pytest exit code 5 = no tests collected: a failure here, never a silent success.
ensure-chromium:
	bash scripts/ensure_chromium.sh

# Debian's slurmctld, slurmd, slurm-client and munge for the private single-node Slurm (issue 45; started as root).
ensure-slurm:
	bash scripts/ensure_slurm.sh

# Debian's postgresql and redis-server for the distributed (Celery) stack's private services.
ensure-services:
	bash scripts/ensure_services.sh

# Three test processes on two cores: the end-to-end tests spend part of their time waiting on the simulated
# node (a cron tick, an sshd outage, an approval timeout); a third process keeps the cores busy meanwhile.
test: venv ensure-sshd ensure-chromium ensure-services ensure-slurm lint
	@rc=0; $(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=25 tests $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: FAILED - pytest collected no tests" >&2; fi; \
	exit $$rc

demo: venv ensure-sshd
	COMMIT=$(call q,$(COMMIT)) SUITES=$(call q,$(SUITES)) KEEP=$(call q,$(KEEP)) $(PY) -m scripts.demo

# The distributed stack on this machine: PostgreSQL, Redis, two Celery workers, S3 (SeaweedFS), two nodes.
demo-distributed: venv ensure-sshd ensure-services
	COMMIT=$(call q,$(COMMIT)) SEQUENTIAL=$(call q,$(SEQUENTIAL)) STEP_SECONDS=$(call q,$(STEP_SECONDS)) \
	  $(PY) -m scripts.demo --distributed

# The baseline calibration story: reject, approve on two nodes, verify main and a regression against it.
demo-calibration: venv ensure-sshd
	COMMIT=$(call q,$(COMMIT)) RUNS=$(call q,$(RUNS)) STEP_SECONDS=$(call q,$(STEP_SECONDS)) \
	  $(PY) -m scripts.demo_calibration

# A reproduced FAIL bisected to its culprit commit on two nodes (NODES=1: one node, for the comparison).
demo-bisect: venv ensure-sshd
	STEP_SECONDS=$(call q,$(STEP_SECONDS)) NODES=$(call q,$(NODES)) $(PY) -m scripts.demo_bisect

# The verification and a two-probe-parallel bisection with GPU jobs through a real (private, single-node) Slurm.
demo-slurm: venv ensure-sshd ensure-services ensure-slurm
	$(PY) -m scripts.demo_slurm

demo-stop: venv
	$(PY) -m scripts.demo --stop

# What the report says (headline, class, first next step) for every simulated regression.
gallery: venv ensure-sshd
	$(PY) -m scripts.report_gallery

bench: venv ensure-sshd
	$(PY) scripts/bench_engine.py
	$(PY) scripts/bench_parse.py
	$(PY) -m scripts.bench_early_abort
	$(PY) -m scripts.bench_verdict_time
	$(PY) -m scripts.bench_confirmation
	$(PY) -m scripts.bench_bisect --positions 20
	$(PY) -m scripts.bench_bisect_dag
	$(PY) -m scripts.bench_unchanged
	$(PY) -m scripts.bench_lane
	$(PY) -m scripts.bench_shortcuts
	$(PY) -m scripts.bench_evidence
	$(PY) -m scripts.bench_mutation
	$(PY) -m scripts.bench_retry

lint: venv
	$(PY) -m compileall -q include dags harness scripts simulator tests
	$(PY) -m ruff check include dags harness scripts simulator tests
	.venv/bin/lint-imports --config pyproject.toml
	.venv/bin/shellcheck $(sort $(wildcard include/rl_verify/node/sh/*.sh scripts/*.sh) .ci/run simulator/node_bin/pgrep \
	  $(filter-out simulator/xtuner_checkout/% .venv/%,$(shell git ls-files '*.sh' 2>/dev/null)))

clean:
	rm -rf .venv .state .pytest_cache build include/*.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
