# The two set-up commands of the README:   make quickstart   (main job)   and   make test
PY := .venv/bin/python
MULTI30K ?= $(firstword $(wildcard ../shared/data/multi30k) data/raw/multi30k)

.PHONY: env quickstart test test-fast bench-stream bench-model clean

env:
	@bash scripts/setup_env.sh dev,demo

quickstart: env
	@MULTI30K=$(MULTI30K) bash scripts/quickstart.sh

test: env
	$(PY) -m pytest -q

test-fast: env
	$(PY) -m pytest -q -m "not slow"

bench-stream: env
	$(PY) bench/bench_stream.py --multi30k $(MULTI30K)

bench-model: env
	$(PY) bench/bench_model.py

clean:
	rm -rf data/shards runs bench/out
