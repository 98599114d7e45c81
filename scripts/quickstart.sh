#!/usr/bin/env bash
# The README's main job: Multi30k → shards (centered condition), then their table.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
MULTI30K=${MULTI30K:-../shared/data/multi30k}
SHARDS=${SHARDS:-data/shards/multi30k-centered}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}

if [ ! -f "$MULTI30K/train.en" ]; then
  echo "Multi30k not found at $MULTI30K: downloading it to data/raw/multi30k"
  HF_HUB_OFFLINE=0 $PY -m data_tools download multi30k --out data/raw/multi30k
  MULTI30K=data/raw/multi30k
fi
if [ ! -f "$SHARDS/manifest.json" ]; then
  $PY -m data_tools build --input "$MULTI30K" --condition centered --out "$SHARDS"
fi
$PY -m data_tools verify "$SHARDS"
$PY -m data_tools inspect "$SHARDS"
