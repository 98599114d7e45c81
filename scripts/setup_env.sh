#!/usr/bin/env bash
# Create (or reuse) the project's virtual env and install what it needs.
#   scripts/setup_env.sh [EXTRAS]      e.g. scripts/setup_env.sh dev,demo (the default: dev)
#   scripts/setup_env.sh --write-lock  rewrite requirements.lock from the env as it is
# On a machine without a CUDA GPU the CPU build of torch is installed first: a bare
# `pip install deepspeed` would otherwise resolve a multi-GB CUDA torch plus nvidia-* wheels.
# The packages are installed at the versions requirements.lock pins (pip constraints), so a set-up
# made later resolves what the committed results were made with; CLL_LOCK= (empty) resolves freely.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
LOCK=${CLL_LOCK-requirements.lock}
if [ "${1:-}" = "--write-lock" ]; then
  # torch is left out: step 2 below picks its CPU or CUDA build.
  { echo "# The set-up's resolved versions (Python $("$VENV/bin/python" -c 'import platform; print(platform.python_version())')), installed by scripts/setup_env.sh as pip constraints;"
    echo "# torch is left out (the set-up picks its CPU or CUDA build). Rewrite: scripts/setup_env.sh --write-lock"
    "$VENV/bin/python" -m pip freeze --exclude-editable | grep -v '^torch=='; } > "$LOCK.tmp"
  mv "$LOCK.tmp" "$LOCK"
  echo "wrote $LOCK"
  exit 0
fi
EXTRAS=${1:-dev}
CONSTRAINTS=()
if [ -n "$LOCK" ] && [ -f "$LOCK" ]; then
  CONSTRAINTS=(-c "$LOCK")
fi
HASH=$(cat setup.py ${CONSTRAINTS[@]:+"$LOCK"} | sha256sum | cut -c1-12)
STAMP="$VENV/.cll-installed-$EXTRAS-$HASH"

# Done before: these extras, or more of them (make test's dev,demo covers make quickstart's demo)
for done in "$VENV"/.cll-installed-*-"$HASH"; do
  [ -f "$done" ] || continue
  have=${done#"$VENV/.cll-installed-"}; have=",${have%-"$HASH"},"
  missing=0
  for extra in ${EXTRAS//,/ }; do [[ $have == *",$extra,"* ]] || missing=1; done
  [ $missing = 0 ] && exit 0
done
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
step 3 "cll-scale and its packages ($EXTRAS${CONSTRAINTS[@]:+, at the versions of $LOCK})" \
  "${PIP[@]}" install ${CONSTRAINTS[@]+"${CONSTRAINTS[@]}"} -e ".[$EXTRAS]"
touch "$STAMP"
echo "set-up done: $VENV (log: $LOG)"
