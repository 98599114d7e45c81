"""Fetch Multi30k (task 1, raw text) for users with network access.

The files are the upstream ``{split}.{lang}.gz``; they are decompressed into ``--out`` through a
temporary directory, so an interrupted download never leaves a partial corpus behind.
Multi30k is for non-commercial research and education (derived from Flickr30k); cite
Elliott et al. 2016/2017 and Barrault et al. 2018.
"""
from __future__ import annotations

import gzip
import os
import urllib.request
from pathlib import Path

from cll_scale.core.outputs import atomic_dir, check_output

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
MULTI30K_FILES = [f"{split}.{lang}" for split in ("train", "val", "test_2016_flickr", "test_2018_flickr")
                  for lang in ("en", "de", "fr", "cs")]


def multi30k_strangers(path: Path) -> list[str] | None:
    """What in ``path`` is not a Multi30k file (``None`` when it holds none of them)."""
    names = {p.name for p in path.iterdir()}
    if not names & set(MULTI30K_FILES):
        return None
    return sorted(names - set(MULTI30K_FILES))


def download_multi30k(out: str | os.PathLike, base_url: str = MULTI30K_URL, overwrite: bool = False) -> Path:
    out = check_output(out, overwrite=overwrite, kind="Multi30k download", strangers=multi30k_strangers)
    with atomic_dir(out, replace=True) as tmp:
        for name in MULTI30K_FILES:
            with urllib.request.urlopen(f"{base_url.rstrip('/')}/{name}.gz", timeout=60) as resp:
                data = gzip.decompress(resp.read())
            data.decode("utf-8")   # fail here, not later, on a broken download
            (tmp / name).write_bytes(data)
    return out
