# Thin targets; the logic lives in scripts/. `make run` and `make test` do all setup, each only
# what it needs (scripts/setup.sh run | test).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
# `make run` installs the project itself (not editable): a change to its code installs it again
SOURCES := $(shell find agent tiers -name '*.py' 2>/dev/null)
# `make run CONFIG=my.yaml`: the configuration file to run with (default config/agent.yaml)
ifdef CONFIG
export VOICE_AGENT_CONFIG := $(abspath $(CONFIG))
endif

.PHONY: setup setup-run run install uninstall docs test test-slow test-clients test-fleet test-plant test-all test-install test-small test-arm64 lint bench bench-fleet soak clean

setup: $(STAMP)  ## what the tests need: run and test packages, .venv with the project editable and the dev extra

$(STAMP): pyproject.toml scripts/setup.sh scripts/system-packages.txt
	PYTHON=$(PYTHON) bash scripts/setup.sh test

setup-run: $(RUN_STAMP)  ## what running needs: run packages, .venv with `pip install .` (no extras), the voice prepared

$(RUN_STAMP): pyproject.toml scripts/setup.sh scripts/system-packages.txt $(SOURCES)
	PYTHON=$(PYTHON) bash scripts/setup.sh run

run: $(RUN_STAMP)  ## run the agent with config/agent.yaml, or CONFIG=FILE (starts a loopback Mosquitto if no broker answers)
	bash scripts/run.sh

install:  ## (root) the production install: /opt/voice-agent, /etc/voice-agent/agent.yaml, the user and the systemd unit (docs/raspberry-pi.md)
	bash scripts/install.sh

uninstall:  ## (root) undo `make install`; the configuration is kept unless PURGE=1
	PURGE=$(PURGE) bash scripts/uninstall.sh

# `make test`'s workers: three on two cores (most tests wait on a broker, a device or a child);
# TEST_WORKERS=0 runs them in one process
TEST_WORKERS ?= 3

test: $(STAMP)  ## every test: unit, and integration against a real Mosquitto and ALSA (3 workers)
	$(VENV)/bin/pytest -n $(TEST_WORKERS)

test-slow: $(STAMP)  ## the tests marked slow (a minute or more each: real-time audio, the short soak, 1,000 fuzzed and 3,000 hostile messages through the broker)
	$(VENV)/bin/pytest -m slow

test-clients: $(STAMP)  ## real Home Assistant and rhasspy-hermes as clients (installs them in .cache/ once)
	$(VENV)/bin/pytest -m clients

test-fleet: $(STAMP)  ## the operator's tool against simulated fleets and a bridged broker pair
	$(VENV)/bin/pytest -m fleet

test-plant: $(STAMP)  ## industrial sites: Sparkplug B against a SCADA stand-in (its own cached venv), failover between two Mosquittos, a three-node RabbitMQ cluster
	$(VENV)/bin/pytest -m plant

test-install: $(STAMP)  ## the production install: the wheel into a fresh venv outside the tree, say and run; as root also `make run`, `make install` and `make uninstall` on a new Debian 12 root (scripts/fresh_machine.sh --scenario install)
	$(VENV)/bin/pytest -m install

test-all: test test-slow test-install test-clients test-fleet test-plant test-small  ## what CI runs (.ci/run)

test-small: $(STAMP)  ## memory budgets held by the kernel: steady work in a 256 MB cgroup, a node's whole life (OTA update, rollback) in 384 MB (root, cgroup v1; ~8 min)
	$(VENV)/bin/pytest -m small -rP

test-arm64: $(STAMP)  ## install from a wheel and run on aarch64 (Debian bookworm arm64 under QEMU), compared with x86_64: docs/arm64.md
	bash scripts/arm64/run.sh

docs: $(STAMP)  ## the generated pages (configuration reference, config/agent.yaml, bench figures), then the site from docs/ into site/ (MkDocs, Material theme; strict: a broken link or anchor fails)
	$(VENV)/bin/python -m scripts.generate_docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(STAMP)  ## ruff (lint and format check) and strict mypy
	$(VENV)/bin/ruff check agent tests scripts bench ota tiers harness
	$(VENV)/bin/ruff format --check agent tests scripts bench ota tiers harness
	$(VENV)/bin/mypy

bench: $(STAMP)  ## benchmark against piper-tts (bench/REPORT.md), rooms: two nodes in step (bench/ROOMS.md), alarms beside hostile sounds and memory of waiting media (bench/TRUST.md), first audio through Wyoming against wyoming-piper (bench/WYOMING.md)
	$(VENV)/bin/python -m bench.run --out-dir bench
	$(VENV)/bin/python -m bench.rooms --out-dir bench
	$(VENV)/bin/python -m bench.trust --out-dir bench
	$(VENV)/bin/python -m bench.wyoming --out-dir bench
	$(VENV)/bin/python -m bench.alarms --out-dir bench
	$(VENV)/bin/python -m bench.tiers --out-dir bench

bench-fleet: $(STAMP)  ## the operator tool against 100-3,000 simulated nodes: bench/FLEET.md, bench/fleet.json
	$(VENV)/bin/python -m bench.fleet_scale --out-dir bench --save-every-change 300,1000

soak: $(STAMP)  ## 30 minutes under a steady mix: bench/SOAK.md, bench/soak.json
	$(VENV)/bin/python -m tests.soak --minutes 30 --out bench

clean:
	rm -rf $(VENV) .run site .mypy_cache .ruff_cache .pytest_cache *.egg-info
