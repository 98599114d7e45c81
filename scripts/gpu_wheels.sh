#!/usr/bin/env bash
# Wheels for a GPU machine that has torch but not the rest and no network (the lent H200:
# Python 3.12, no deepspeed, langdetect, hjson, pydantic): pure-Python or manylinux wheels in
# .whl/ (git-ignored, about 6 MB), installed there by bench/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
cd .whl
PIP="${PIP:-../.venv/bin/python -m pip}"
$PIP download -q --no-deps deepspeed==0.19.8 langdetect==1.0.9
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 pydantic pydantic-core annotated-types typing-inspection hjson \
    "typing-extensions>=4.16"
$PIP wheel -q --no-deps -w . langdetect-1.0.9.tar.gz
DS_BUILD_OPS=0 $PIP wheel -q --no-deps -w . deepspeed-0.19.8.tar.gz   # no torch needed: py3-none-any
rm -f ./*.tar.gz
ls -1 ./*.whl
