#!/usr/bin/env bash
# Every GPU measurement of the training- and decoding-speed work, packed as one JSON
# (gpu_check.json) and one archive of the logs (gpu_check.tgz):
#
#   bash bench/gpu_check.sh [OUT_DIR] [PARTS]     # OUT_DIR default: $OUT, else bench/out/gpu
#
# PARTS: "train" (MFU, trainer ÷ plain step with and without torch.compile, engine settings,
# FCLL ÷ Baseline at 16/99 languages; about 6 minutes), "decode" (beam search ÷ HF generate at
# 16/64/256 sentences, small and base; cll-eval of 12 directions × 1,000 sentences with a small
# model trained here for 300 steps; about 3 minutes), "study" (the triangle study of issue 20:
# 4 variants × 3 seeds of `small`, 6 at a time, 3 minutes or 4,200 steps each, evaluated on
# test_2016_flickr with the LSLs on and off; about 9 minutes, so it takes a call of its own; shards
# from $TRIANGLE_SHARDS, default runs/study/shards/multi30k-triangle, else built), "paper" (seed 1
# of the 4 variants at the paper settings, 5 minutes each, a call of its own) or "all" (train
# and decode, the default). The study parts' results folders (reports, records, cached
# evaluations) go under docs/results/h200/ as they come back: their budgets differ from the CPU
# study's, so they are reports of their own. Each step has its own
# time limit and never stops the others. lingua is not among the wheels (96 MB, above what a
# call may carry): cll-eval runs with langdetect there; lingua's cost is CPU-side and measured
# on the CPU.
#
# On a machine without deepspeed/langdetect/hjson/pydantic (the lent H200 has none of them and no
# network) the wheels in .whl/ are installed into a private directory first; build them on a
# networked machine with `bash scripts/gpu_wheels.sh`. Shards: $SHARDS, else
# data/shards/multi30k-centered, else built from $MULTI30K (default ../shared/data/multi30k).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-bench/out/gpu}}
PARTS=${2:-all}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ! $PY -c "import deepspeed, langdetect" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --target /tmp/cll-site .whl/*.whl
    export PYTHONPATH=/tmp/cll-site:$PYTHONPATH
  else
    echo "deepspeed is missing and no wheels are in .whl/ (scripts/gpu_wheels.sh builds them)" >&2
    exit 2
  fi
fi
export DS_ACCELERATOR=${DS_ACCELERATOR:-cuda}
SHARDS=${SHARDS:-data/shards/multi30k-centered}
if [ ! -f "$SHARDS/manifest.json" ]; then
  $PY -m data_tools build --corpus "${MULTI30K:-../shared/data/multi30k}" --condition centered --out "$SHARDS" \
    > "$OUT_DIR/shards.log" 2>&1 || { echo "no shards and none could be built (see shards.log)" >&2; exit 2; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT_DIR/gpu.txt" 2>&1

step() {    # step NAME TIMEOUT_S COMMAND...: run, keep its log, never stop the whole check
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT_DIR/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT_DIR/steps.txt"
}
BASE=(--device cuda --preset base)
if [ "$PARTS" = all ] || [ "$PARTS" = train ]; then
  step mfu_256x64 45 $PY bench/bench_model.py "${BASE[@]}" --only mfu --json "$OUT_DIR/mfu_256x64.json"
  step mfu_512x128 45 $PY bench/bench_model.py "${BASE[@]}" --only mfu --shape 512 128 128 --json "$OUT_DIR/mfu_512x128.json"
  step fcll16 45 $PY bench/bench_model.py "${BASE[@]}" --only fcll --json "$OUT_DIR/fcll16.json"
  step trainer 150 $PY bench/bench_train.py "${BASE[@]}" --data "$SHARDS" --batch-tokens 24000 --only trainer \
    --compile inductor --blocks 4 --block-steps 10 --json "$OUT_DIR/trainer.json"
  step configs 120 $PY bench/bench_train.py "${BASE[@]}" --data "$SHARDS" --batch-tokens 24000 --only configs \
    --blocks 2 --block-steps 10 --json "$OUT_DIR/configs.json"
  step langs 60 $PY bench/bench_train.py "${BASE[@]}" --data "$SHARDS" --only langs --blocks 3 --block-steps 10 \
    --json "$OUT_DIR/langs.json"
fi
if [ "$PARTS" = all ] || [ "$PARTS" = decode ]; then
  step decode_base 60 $PY bench/bench_decode.py "${BASE[@]}" --sizes 16 64 256 --vocab 32000 \
    --json "$OUT_DIR/decode_base.json"
  step decode_small 45 $PY bench/bench_decode.py --device cuda --preset small --sizes 16 64 256 \
    --json "$OUT_DIR/decode_small.json"
  RUN=/tmp/cll-gpu-eval-run
  rm -rf "$RUN"
  step train_small 90 $PY -m cll_scale.train --data "$SHARDS" --preset small --run-dir "$RUN" --max-steps 300 \
    --set data.batch_tokens=16000 --set optim.warmup_steps=100 --set valid.every=1000
  step eval_small 120 $PY -m cll_scale.evaluate --model small="$RUN/export" --data "$SHARDS" \
    --split test_2016_flickr --beam 4 --device cuda --out "$OUT_DIR/eval_small"
  [ -f "$OUT_DIR/eval_small/results.json" ] && $PY -c "import json,sys; from cll_scale.evaluation.report import EvalReport; \
r=EvalReport.load(sys.argv[1]); json.dump({k: e.timing for k, e in r.models.items()}, open(sys.argv[2], 'w'))" \
    "$OUT_DIR/eval_small/results.json" "$OUT_DIR/eval_small_timing.json"
fi

if [ "$PARTS" = study ]; then
  STUDY=/tmp/cll-gpu-study
  step study 560 $PY -m cll_scale.repro --condition triangle --variants baseline,fcll,sd,sd_attn --seeds 1,2,3 \
    --steps-per-model 4200 --minutes-per-model 3 --parallel 6 --splits test_2016_flickr --ablate-lsl \
    --corpus "${MULTI30K:-../shared/data/multi30k}" --shards-root "$(dirname "${TRIANGLE_SHARDS:-runs/study/shards/multi30k-triangle}")" \
    --runs-root "$STUDY/runs" --out "$STUDY/results" --lid-workers 12
  # the report, every model's record (metrics, configs, export manifests: no weights), the cached
  # evaluations and the hypotheses; copied into docs/results, a later cll-repro reuses them all
  tar czf "$OUT_DIR/study_results.tgz" -C "$STUDY/results" . 2>/dev/null
fi

if [ "$PARTS" = paper ]; then
  # The paper settings (recipes multi30k_triangle_paper_*: 5+5 post-norm layers, d=512, 16k tokens
  # a step) at the most one call allows: seed 1 of the 4 variants at once, 5 minutes each, far
  # short of the authors' 4k warm-up plus training; the report says so (steps, epochs).
  PAPER=/tmp/cll-gpu-paper
  step paper 570 $PY -m cll_scale.repro --condition triangle --settings paper --variants baseline,fcll,sd,sd_attn \
    --seeds 1 --steps-per-model 4000 --minutes-per-model 5 --parallel 4 --splits test_2016_flickr --ablate-lsl \
    --corpus "${MULTI30K:-../shared/data/multi30k}" --shards-root "$(dirname "${TRIANGLE_SHARDS:-runs/study/shards/multi30k-triangle}")" \
    --runs-root "$PAPER/runs" --out "$PAPER/results" --lid-workers 12
  tar czf "$OUT_DIR/paper_results.tgz" -C "$PAPER/results" . 2>/dev/null
fi

$PY - "$OUT_DIR" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
merged = {"gpu": (out / "gpu.txt").read_text() if (out / "gpu.txt").exists() else "",
          "steps": (out / "steps.txt").read_text().splitlines() if (out / "steps.txt").exists() else []}
for f in sorted(out.glob("*.json")):   # top level only: eval_small/ stays in the archive
    if f.name != "gpu_check.json":
        merged[f.stem] = json.loads(f.read_text())
(out / "gpu_check.json").write_text(json.dumps(merged, indent=1))
EOF
tar czf "$OUT_DIR/gpu_check.tgz" -C "$OUT_DIR" --exclude gpu_check.tgz .
echo "wrote $OUT_DIR/gpu_check.json and $OUT_DIR/gpu_check.tgz"
