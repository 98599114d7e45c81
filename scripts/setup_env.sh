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
# pip's and setuptools' own output (build warnings, resolver notes) goes to a log a person reads
# only when a step fails; what they see is one line a step.
LOG="$VENV/setup.log"
step() {
  echo "[set-up $1/3] $2"
  if ! "${@:3}" >> "$LOG" 2>&1; then
    echo "set-up failed at: $2 (the last lines of $LOG follow)" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
: > "$LOG"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
step 1 "pip, setuptools, wheel" "${PIP[@]}" install --upgrade "pip>=24" setuptools wheel
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "[set-up 2/3] torch: already installed"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  step 2 "torch (CUDA build)" "${PIP[@]}" install "torch>=2.4,<2.15"
else
  step 2 "torch (CPU build)" "${PIP[@]}" install "torch==2.13.0"
fi
step 3 "cll-scale and its packages ($EXTRAS)" "${PIP[@]}" install -e ".[$EXTRAS]"
touch "$STAMP"
echo "set-up done: $VENV (log: $LOG)"
