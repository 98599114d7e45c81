# The two set-up commands of the README:   make quickstart   (main job)   and   make test
PY := .venv/bin/python
MULTI30K ?= $(firstword $(wildcard ../shared/data/multi30k) data/raw/multi30k)

.PHONY: env quickstart test test-fast demo bench-stream bench-model bench-train bench-decode bench-opus gpu-check clean

env:
	@bash scripts/setup_env.sh dev,demo

quickstart: env
	@MULTI30K=$(MULTI30K) bash scripts/quickstart.sh

demo: env
	$(PY) -m demo --model baseline=runs/quickstart/multi30k-centered-baseline/export \
	    --model fcll=runs/quickstart/multi30k-centered-fcll/export --examples $(MULTI30K)

test: env
	$(PY) -m pytest -q

test-fast: env
	$(PY) -m pytest -q -m "not slow"

bench-stream: env
	$(PY) bench/bench_stream.py --multi30k $(MULTI30K)

bench-model: env
	$(PY) bench/bench_model.py

bench-train: env
	$(PY) bench/bench_train.py --data data/shards/multi30k-centered

bench-decode: env
	$(PY) bench/bench_decode.py

# OPUS-100's shape (synthetic text) at scales 0.01 and 0.05, extrapolated to 1.0, and a tiny FCLL
# run on all 100 languages (2 CPU ranks); BENCH_OPUS_ARGS="--scales 0.01 0.05 0.2" for more
bench-opus: env
	$(PY) bench/bench_opus_shape.py $(BENCH_OPUS_ARGS)

# Every GPU measurement in one call (on a CUDA machine; see the script's header)
gpu-check:
	bash bench/gpu_check.sh

clean:
	rm -rf data/shards runs bench/out
