# The two set-up commands of the README:   make quickstart   (main job)   and   make test
PY := .venv/bin/python
MULTI30K ?= $(firstword $(wildcard ../shared/data/multi30k) data/raw/multi30k)
# make quickstart's condition: triangle (default) or centered (the run of before issue 52)
QUICKSTART_CONDITION ?= triangle

.PHONY: env env-demo quickstart test test-fast demo bench-stream bench-model bench-train bench-decode bench-opus gpu-check clean

# make test's set-up: the package with the demo's and the developers' extras
env:
	@bash scripts/setup_env.sh dev,demo

# The main job's and the demo's: no test tools (pytest, transformers, playwright: a quarter of the
# set-up's time on the Xeon)
env-demo:
	@bash scripts/setup_env.sh demo

quickstart: env-demo
	@MULTI30K=$(MULTI30K) QUICKSTART_CONDITION=$(QUICKSTART_CONDITION) bash scripts/quickstart.sh

# The two models make quickstart trained (the checkpoint it evaluated: export-best/ when there is one),
# under QUICKSTART_RUNS as the script puts them
QUICKSTART_RUNS ?= runs/quickstart
QS_RUN = $(QUICKSTART_RUNS)/runs/multi30k-$(if $(filter centered,$(QUICKSTART_CONDITION)),centered,triangle-quickstart)
qs_export = $(firstword $(wildcard $(QS_RUN)-$(1)/export-best) $(QS_RUN)-$(1)/export)
# ...and the report that evaluated them: the demo shows each model's measured zero-shot off-target rate from it
QS_REPORT = $(QUICKSTART_RUNS)/results/$(if $(filter centered,$(QUICKSTART_CONDITION)),centered,triangle-quickstart)

QS_VARS = QUICKSTART_CONDITION=$(QUICKSTART_CONDITION) QUICKSTART_RUNS=$(QUICKSTART_RUNS)

demo: env-demo
	@for m in $(call qs_export,baseline) $(call qs_export,fcll); do [ -f "$$m/export.json" ] || { \
	    echo "make demo: no quickstart model at $$m: run make quickstart first ($(QS_VARS))" >&2; exit 2; }; done
	$(PY) -m demo --model baseline=$(call qs_export,baseline) --model fcll=$(call qs_export,fcll) \
	    --examples $(MULTI30K) $(if $(wildcard $(QS_REPORT)/evaluated),--results $(QS_REPORT))

# The suite, both tiers, on TEST_WORKERS processes (pytest-xdist; one torch thread each); the tests
# marked whole_machine run last, one at a time, with no other test beside them (tests/conftest.py)
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test: env
	$(PY) -m pytest -q $(XDIST) --durations=15

# The in-process tier: commands called through main(argv), the tiny models trained once per run
test-fast: env
	$(PY) -m pytest -q $(XDIST) -m "not integration"

bench-stream: env
	$(PY) bench/bench_stream.py --corpus $(MULTI30K)

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
