#!/usr/bin/env bash
# The README's main job: Multi30k → triangle shards (de→fr→cs→de; the reverses zero-shot), the
# quickstart's `mini` Baseline and FCLL (recipes/multi30k_triangle_quickstart_*.yaml: 1,024 tokens
# a step, lr 3e-3 after 400 warm-up steps) trained side by side for
# QUICKSTART_STEPS steps each (a step budget, so what it shows does not depend on how busy the
# machine is; cll-repro's progress lines give the time left), cll-eval on the first
# QUICKSTART_SENTENCES sentences of each test_2016 direction, and the summary.
#   QUICKSTART_STEPS                steps a model (1,500)
#   QUICKSTART_CONDITION=centered   the English-centered run of before (8 minutes a model)
#   QUICKSTART_PRECISION            auto (bf16 where this CPU's bf16 matmuls are faster), bf16 or fp32
#   QUICKSTART_SHARDS, QUICKSTART_RUNS   where the shards and the runs go (data/shards, runs/quickstart)
#   QUICKSTART_ARGS                 more cll-repro flags (the test: a tiny model)
# Re-running resumes unfinished models and skips finished ones.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
MULTI30K=${MULTI30K:-../shared/data/multi30k}
CONDITION=${QUICKSTART_CONDITION:-triangle}
SHARDS_ROOT=${QUICKSTART_SHARDS:-data/shards}
RUNS=${QUICKSTART_RUNS:-runs/quickstart}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
CORES=$(nproc)
stage() { echo; echo "== [$1/3] $2 =="; }

# Each variable is checked before anything runs, its error naming it: cll-repro would refuse a bad
# value only after stage 1, naming its own flag, and QUICKSTART_STEPS=0 would mean no step budget.
check_var() {   # NAME PATTERN WHAT: NAME, when set and not empty, must match PATTERN
  local value=${!1:-}
  if [ -n "$value" ] && ! [[ $value =~ $2 ]]; then
    echo "quickstart: $1 must be $3, not '$value'" >&2
    exit 2
  fi
}
check_var QUICKSTART_STEPS '^[1-9][0-9]*$' "a positive whole number of steps"
check_var QUICKSTART_SENTENCES '^[0-9]+$' "a whole number of sentences (0: all of them)"
check_var QUICKSTART_MINUTES '^(0*[1-9][0-9]*(\.[0-9]*)?|0*\.[0-9]*[1-9][0-9]*)$' "a positive number of minutes"
check_var QUICKSTART_PRECISION '^(auto|bf16|fp32)$' "auto, bf16 or fp32"

case "$CONDITION" in
  # The triangle's two models train side by side, each on half the cores: two threads share one
  # model's small matrices badly (`small` at 2,048 tokens a step: 2,416 target tokens/s on two
  # threads against 2 x 1,745 side by side on the 2-core Xeon; the `mini` matrices are smaller).
  triangle) BUDGET=(--settings quickstart --steps-per-model "${QUICKSTART_STEPS:-1500}" --parallel 2)
            THREADS=$(( CORES > 1 ? CORES / 2 : 1 ))
            SENTENCES=${QUICKSTART_SENTENCES:-150}; LANGS=(--langs de,fr,cs); REPORT=triangle-quickstart ;;
  centered) BUDGET=(--minutes-per-model "${QUICKSTART_MINUTES:-8}"); THREADS=$CORES
            SENTENCES=${QUICKSTART_SENTENCES:-100}; LANGS=(); REPORT=centered ;;
  *) echo "QUICKSTART_CONDITION must be triangle or centered, not '$CONDITION'" >&2; exit 2 ;;
esac
if [ "$CONDITION" = centered ] && [ -n "${QUICKSTART_STEPS:-}" ]; then
  echo "quickstart: QUICKSTART_STEPS is the triangle's budget; the centered models train QUICKSTART_MINUTES each" >&2
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$THREADS}
mkdir -p "$RUNS"

stage 1 "data: Multi30k → $CONDITION shards"
if [ ! -f "$MULTI30K/train.en" ]; then
  echo "Multi30k not found at $MULTI30K: downloading it to data/raw/multi30k"
  HF_HUB_OFFLINE=0 $PY -m data_tools download multi30k --out data/raw/multi30k
  MULTI30K=data/raw/multi30k
fi
SHARDS=$SHARDS_ROOT/multi30k-$CONDITION
# --reuse: shards of this corpus and condition are kept, a directory of this name built otherwise is refused
$PY -m data_tools build --reuse --corpus "$MULTI30K" --condition "$CONDITION" "${LANGS[@]}" --out "$SHARDS" \
    > "$RUNS/build.log"
$PY -m data_tools verify "$SHARDS"
$PY -m data_tools inspect "$SHARDS" | sed -n 1,5p

stage 2 "training Baseline and FCLL, each evaluated on the first $SENTENCES sentences of every test_2016 direction"
# One progress bar a model (with the time left) and one a direction evaluated; the full report
# (cll-repro's stdout) goes to $RUNS/report.log.
# shellcheck disable=SC2086
$PY -m cll_scale.repro --condition "$CONDITION" --variants baseline,fcll "${BUDGET[@]}" \
    --precision "${QUICKSTART_PRECISION:-auto}" \
    --corpus "$MULTI30K" --shards-root "$SHARDS_ROOT" --runs-root "$RUNS/runs" --out "$RUNS/results" \
    --splits test_2016_flickr --max-sentences "$SENTENCES" ${QUICKSTART_ARGS:-} > "$RUNS/report.log"

stage 3 "summary"
$PY scripts/quickstart_summary.py --report "$RUNS/results/$REPORT" --runs "$RUNS/runs" --corpus "$MULTI30K" \
    --split test_2016_flickr --condition "$CONDITION"
