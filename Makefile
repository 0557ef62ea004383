# The README's commands. `make sandbox` runs the whole of site.yml on the local sandbox cloud;
# `make test` runs every test (lint, unit, emulator, molecule on real test hosts).
# Both run `make setup` first, which is idempotent and fast once done.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export TH_BASE ?= $(HOME)/.cache/forja
APT_PACKAGES := debootstrap systemd-container nftables zstd curl iproute2 openssh-client rsync sqlite3 gpg chromium

.PHONY: setup apt venv golden sandbox sandbox-down test check hosts-tier lint docs unit molecule clean-hosts

setup: apt venv golden

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(wildcard requirements/*.txt) trainer/requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[trainer,test,sandbox]'
	touch $@

# The golden Ubuntu image, then the Deep Learning VM layer over it (the image's Python with
# PyTorch 2.7.1; forja_sandbox/README.md). Both are cached in $(TH_BASE)/images: built once.
golden: venv
	$(PY) -m forja_sandbox.testhosts golden
	$(PY) -m forja_sandbox.testhosts dlvm

# The inventory is always named: ansible.cfg's default lists no hosts and asks for one. The sandbox
# service (the Compute emulator bound to local hosts) is started here, never by an inventory.
SANDBOX_INVENTORY := inventory/sandbox

sandbox: setup
	$(PY) -m forja_sandbox.service ensure
	ansible-playbook -i $(SANDBOX_INVENTORY) site.yml
	@echo "next: source $(VENV)/bin/activate; export FORJA_INVENTORY=$(CURDIR)/$(SANDBOX_INVENTORY); forja status"

sandbox-down: venv
	$(PY) -m forja_sandbox.service ensure
	ansible-playbook -i $(SANDBOX_INVENTORY) playbooks/teardown.yml -e forja_teardown_delete=true
	$(PY) -m forja_sandbox.service destroy

# The last step is Ansible's own `ansible-test sanity` on the built collection, as google.cloud and
# amazon.aws run it (tests/sanity/run.py: offline, about 40 s on the 2-core test machine once its
# test venvs are cached in ~/.ansible/test; accepted exceptions in tests/sanity/ignore-2.19.txt).
lint: venv
	ruff check forja forja_sandbox trainer plugins tests bench docs
	yamllint -s .
	ansible-lint
	$(MAKE) --no-print-directory docs
	$(PY) tests/sanity/run.py

# The docs site (mkdocs.yml), built strictly into a folder that is thrown away: a link to a missing page
# or anchor, or a page left out of the nav, fails the build (about 1 s). Never with -q: MkDocs counts
# the warnings it logs, and -q logs none. `mkdocs serve` shows the site while you write.
docs: venv
	@site=$$(mktemp -d); mkdocs build --strict -d "$$site"; status=$$?; rm -rf "$$site"; exit $$status

# Two tiers. `make check` is the edit loop: every test that needs no test host and no sandbox (unit,
# emulator, localhost plays), on both cores (CHECK_WORKERS); `make lint check` adds the linters.
# `make hosts-tier` is the rest (marked `hosts` or `slow`) in two lanes on two workers (TEST_WORKERS=2,
# tests/lanes.py): the host tests in two lanes that share nothing (HOST_LANES=2), the test sandbox's
# (its VMs, its port, local port 8888) and the other test hosts', each lane one test at a time, and
# the slow tests that boot nothing (multi-process training, long emulator drills) on whichever
# worker is free. Two host lanes took 25.6 minutes on this 2-core machine (at c1e7e93) where one took 53
# (HOST_LANES=1: every host test on one worker). The two failures seen in two lanes are fixed at
# their cause: a VM created or deleted changed the test bridge's MAC under the other lane's hosts
# (th-up.sh keeps it), and the autostop stand-in's forked `date` was killed by systemd's stop
# before it wrote its mark (it writes with bash's own printf).
# TEST_WORKERS=1 runs the tier serially. Every test phase and
# bring-up is timed into .ci-logs/test-times.jsonl (tests/timings.py); `python bench/suite_times.py`
# prints where it went.
CHECK_WORKERS ?= 2
TEST_WORKERS ?= 2
HOST_LANES ?= 2
CHECK_TIER := not hosts and not slow
XDIST = $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
CHECK_XDIST = $(if $(filter 1,$(CHECK_WORKERS)),,-n $(CHECK_WORKERS) --dist loadfile --no-loadscope-reorder)
TIMES := .ci-logs/test-times.jsonl

check: venv
	@mkdir -p .ci-logs; rm -f $(TIMES)
	FORJA_TIER=check pytest -q $(CHECK_XDIST) -m "$(CHECK_TIER)" --durations=10 tests

hosts-tier: setup
	HOST_LANES=$(HOST_LANES) pytest -q $(XDIST) -m "not ($(CHECK_TIER))" --durations=25 tests

# Every test in one pytest session (both tiers at once, as before the split).
unit: venv
	pytest -q $(XDIST) --durations=25 tests

# Every molecule scenario alone (tests/molecule/test_scenarios.py, which the host tier runs too): each
# scenario's output is kept in .ci-logs/, and a failing one's failing tasks and assertion lines are
# printed in the test's failure, so the end of a CI log says what broke.
molecule: setup
	pytest -q $(XDIST) tests/molecule

# Lint and the check tier first, so a broken unit fails in minutes; then the host tier.
test: setup lint check hosts-tier

clean-hosts: venv
	$(PY) -m forja_sandbox.testhosts down-all
