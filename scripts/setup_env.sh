#!/usr/bin/env bash
# Create (or reuse) the project's virtual env and install what it needs.
#   scripts/setup_env.sh [EXTRAS]      e.g. scripts/setup_env.sh dev,demo
# On a machine without a CUDA GPU the CPU build of torch is installed first: a bare
# `pip install deepspeed` would otherwise resolve a multi-GB CUDA torch plus nvidia-* wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${1:-dev}
STAMP="$VENV/.cll-installed-$EXTRAS-$(sha256sum setup.py | cut -c1-12)"

if [ -f "$STAMP" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
$PIP install --upgrade "pip>=24" setuptools wheel
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    $PIP install "torch>=2.4,<2.15"
  else
    $PIP install "torch==2.13.0"
  fi
fi
$PIP install -e ".[$EXTRAS]"
touch "$STAMP"
