#!/usr/bin/env bash
# The README's main job: Multi30k → shards (centered), a short Baseline and FCLL `small` training
# (QUICKSTART_MINUTES per model, default 8: under 20 minutes in all on 2 CPU cores), cll-eval on
# test_2016_flickr (first QUICKSTART_SENTENCES sentences per direction), and the comparison table.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
MULTI30K=${MULTI30K:-../shared/data/multi30k}
MINUTES=${QUICKSTART_MINUTES:-8}
SENTENCES=${QUICKSTART_SENTENCES:-100}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}

if [ ! -f "$MULTI30K/train.en" ]; then
  echo "Multi30k not found at $MULTI30K: downloading it to data/raw/multi30k"
  HF_HUB_OFFLINE=0 $PY -m data_tools download multi30k --out data/raw/multi30k
  MULTI30K=data/raw/multi30k
fi
SHARDS=data/shards/multi30k-centered
[ -f "$SHARDS/manifest.json" ] || $PY -m data_tools build --input "$MULTI30K" --condition centered --out "$SHARDS"
$PY -m data_tools verify "$SHARDS"
$PY -m data_tools inspect "$SHARDS"
# Re-running resumes unfinished models and skips finished ones.
$PY -m cll_scale.repro --condition centered --variants baseline,fcll --minutes-per-model "$MINUTES" \
    --multi30k "$MULTI30K" --shards-root data/shards --runs-root runs/quickstart --out runs/quickstart/results \
    --splits test_2016_flickr --max-sentences "$SENTENCES"
# The ten-second summary: what the numbers mean at this budget, and what the same recipes reach in full.
$PY scripts/quickstart_summary.py --report runs/quickstart/results/centered --runs runs/quickstart/runs \
    --corpus "$MULTI30K" --split test_2016_flickr
