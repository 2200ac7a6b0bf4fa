# rankscope: `make demo` and `make test` each do the whole set-up on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := demo-out

.PHONY: setup sysdeps demo test lint bench docs clean

# Debian packages the tests use (flow exporters: softflowd, nfdump's nfpcapd, pmacct's sFlow probe;
# nfdump; headless browser; ip netns; promtool, from Debian's prometheus, for deploy/'s alert rules);
# installed only when running as root and something is missing.
SYSDEPS := softflowd nfdump pmacct chromium chromium-driver iproute2 prometheus
sysdeps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; for p in $(SYSDEPS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then echo "apt-get install$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null \
	    || echo "warning: could not install$$missing (tests that need them will skip)"; fi; \
	fi

$(STAMP): pyproject.toml setup.py $(wildcard collectors/hooks/*.c collectors/hooks/*.h)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,torch,ray]'
	touch $(STAMP)

setup: $(STAMP) sysdeps

demo: setup
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(BIN)/rankscope simulate --out $(DEMO)/sim --dp 4 --pp 2 --tp 2 --gpus-per-host 2 --steps 6 --fault slow-worker:rank=5,factor=1.5
	$(BIN)/rankscope analyze --store $(DEMO)/sim --out-dir $(DEMO)/reports
	$(BIN)/rankscope ingest datasets/samples/demo --store $(DEMO)/store --job demo
	$(BIN)/rankscope info --store $(DEMO)/store
	$(BIN)/rankscope sql --store $(DEMO)/store "select op, count(*) as calls, sum(size_bytes) as bytes from comm_op group by op order by op"
	@if $(BIN)/python -c "import torch.distributed" 2>/dev/null; then \
	  $(BIN)/rankscope attach --store $(DEMO)/hook --job hooked --flush-interval-s 1 -- \
	    $(BIN)/torchrun --standalone --nproc_per_node=4 tests/jobs/train_dp_pp.py --steps 2 --out $(DEMO)/hook-job \
	  && $(BIN)/rankscope info --store $(DEMO)/hook; \
	else echo "torch not installed: skipping the hooked job"; fi

test: setup
	$(BIN)/python -m pytest -q tests

# docs/report.md and docs/report.schema.json are generated from the report's types (a test checks them)
docs: setup
	$(BIN)/python -c "from rankscope.analysis.report.schema import markdown; print(markdown())" > docs/report.md
	$(BIN)/python -c "import json; from rankscope.analysis.report.schema import json_schema; \
	  print(json.dumps(json_schema(), indent=1))" > docs/report.schema.json

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) $(DEMO) bench-out .pytest_cache .ruff_cache
