"""The training stream: language-grouped token-budget batches, disjoint ranks, temperature
sampling, and exact resume in a new process."""
import hashlib
import itertools
import json
import subprocess
import sys
from collections import Counter

import pytest
import torch

from cll_scale.manifest import Manifest, ManifestError
from cll_scale.stream import ShardStream, StreamConfig, eval_batches
from data_tools.build import BuildConfig, build_shards
from data_tools.sources import read_parquet_dir
from tests.conftest import ROOT
from tests.hf_fixtures import multi30k_pairs, write_pair


def digest(batch) -> str:
    h = hashlib.sha256()
    for t in (batch.src_tokens, batch.tgt_tokens, batch.lines):
        h.update(t.numpy().tobytes())
    h.update(batch.direction.encode())
    return h.hexdigest()[:16]


def test_batches_are_language_grouped_within_budget(m30k_centered):
    m = Manifest.load(m30k_centered)
    stream = ShardStream(m30k_centered, StreamConfig(max_tokens=2048, seed=5))
    pad = total = 0
    seen = Counter()
    for batch in itertools.islice(stream, 300):
        tgt = batch.direction.split("-")[1]
        seen[batch.direction] += 1
        assert (batch.tgt_lang == m.lang_id(tgt)).all()            # one target language
        assert (batch.src_lang == m.lang_id(batch.direction.split("-")[0])).all()
        assert (batch.src_tokens[:, 0] == m.tokenizer.lang_tag_ids[tgt]).all()   # <2tgt> first
        assert len(batch) * max(batch.src_tokens.shape[1], batch.tgt_tokens.shape[1]) <= 2048
        for toks in (batch.src_tokens, batch.tgt_tokens):
            lengths = (toks != m.tokenizer.pad_id).sum(1)
            assert (toks[torch.arange(len(batch)), lengths - 1] == m.tokenizer.eos_id).all()
            pad += int((toks == m.tokenizer.pad_id).sum())
            total += toks.numel()
        assert batch.ntokens == int((batch.tgt_tokens != m.tokenizer.pad_id).sum())
    assert set(seen) == set(m.supervised)
    assert pad / total < 0.10, f"padding {pad / total:.1%}: length bucketing is not working"


def test_no_tag_switch(m30k_centered):
    m = Manifest.load(m30k_centered)
    batch = next(ShardStream(m30k_centered, StreamConfig(add_lang_tag=False)))
    assert not torch.isin(batch.src_tokens[:, 0], torch.tensor(list(m.tokenizer.lang_tag_ids.values()))).any()


def test_ranks_are_disjoint_and_cover_an_epoch(m30k_centered):
    seen = []
    for rank in range(2):
        # 512 rows per block and rank: a 1,536-row budget makes pools of 3 blocks.
        stream = ShardStream(m30k_centered, StreamConfig(directions=["de-en"], pool_rows=1536), rank, 2)
        assert stream.pool_blocks == 3
        lines = []
        while stream.cursor[0][0] == 0:   # until this rank starts its second epoch
            lines += next(stream).lines.tolist()
        lines = lines[:int(stream.rank_rows[0])]
        assert len(lines) == len(set(lines)) == stream.rank_rows[0]
        seen.append(set(lines))
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(1, 29001))


def test_pool_rows_bound_the_pooled_rows_of_all_directions(m30k_centered):
    m = Manifest.load(m30k_centered)
    n_dirs = len(m.splits["train"].directions())
    assert ShardStream(m30k_centered).pool_blocks == 8            # the default budget: pool_blocks rules
    for budget, k in ((n_dirs * 3 * m.block_rows, 3), (n_dirs * 3 * m.block_rows - 1, 2), (1, 1)):
        stream = ShardStream(m30k_centered, StreamConfig(pool_rows=budget, max_tokens=1024))
        assert stream.pool_blocks == k
        peak = 0
        for _ in range(600):
            next(stream)
            peak = max(peak, sum(len(pool.lines) for _, pool in stream._pools.values()))
        assert len(stream._pools) == n_dirs and peak <= max(budget, n_dirs * m.block_rows)
        assert peak > (k - 1) * n_dirs * m.block_rows      # the budget is used, not just obeyed


def test_same_seed_same_stream_and_epochs_reshuffle(m30k_centered):
    cfg = StreamConfig(seed=11, max_tokens=1024)
    a = [digest(b) for b in itertools.islice(ShardStream(m30k_centered, cfg), 40)]
    b = [digest(b) for b in itertools.islice(ShardStream(m30k_centered, cfg), 40)]
    c = [digest(b) for b in itertools.islice(ShardStream(m30k_centered, StreamConfig(seed=12, max_tokens=1024)), 40)]
    assert a == b and a != c
    one = ShardStream(m30k_centered, StreamConfig(directions=["en-fr"], pool_blocks=64))
    first = [b.lines.tolist() for b in itertools.islice(one, 5)]
    while one.cursor[0][0] == 0:
        next(one)
    second = [next(one).lines.tolist() for _ in range(5)]
    assert first != second   # a new epoch is a new order


def test_temperature_sampling_over_directions(multi30k, tmp_path):
    root = tmp_path / "hf"
    write_pair(root, "de-en", "train", multi30k_pairs(multi30k, "de-en", "train", 2000))
    write_pair(root, "en-fr", "train", multi30k_pairs(multi30k, "en-fr", "train", 500))
    out = tmp_path / "shards"
    build_shards(read_parquet_dir(root), BuildConfig(out_dir=str(out), vocab_size=1500, block_rows=128))
    for temperature, expect in ((1.0, {"de-en": 0.4, "en-de": 0.4, "en-fr": 0.1, "fr-en": 0.1}),
                                (1e9, {"de-en": 0.25, "en-de": 0.25, "en-fr": 0.25, "fr-en": 0.25})):
        stream = ShardStream(out, StreamConfig(temperature=temperature, max_tokens=512))
        counts = Counter(b.direction for b in itertools.islice(stream, 4000))
        for d, p in expect.items():
            assert abs(counts[d] / 4000 - p) < 0.03, (temperature, counts)


RESUME_SCRIPT = """
import json, sys, itertools, hashlib
from cll_scale.stream import ShardStream, StreamConfig
from tests.test_stream import digest
shards, state_file, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
stream = ShardStream(shards, StreamConfig(seed=3, max_tokens=1024, pool_blocks=2), rank=1, world_size=2)
if mode == "resume":
    stream.load_state_dict(json.load(open(state_file)))
out = [digest(b) for b in itertools.islice(stream, n)]
json.dump(stream.state_dict(), open(state_file, "w"))
print(json.dumps(out))
"""


def test_exact_resume_in_a_new_process(m30k_centered, tmp_path):
    state = tmp_path / "state.json"

    def run(mode, n):
        res = subprocess.run([sys.executable, "-c", RESUME_SCRIPT, str(m30k_centered), str(state), mode, str(n)],
                             cwd=ROOT, capture_output=True, text=True, check=True)
        return json.loads(res.stdout)
    first = run("fresh", 150)
    saved = json.loads(state.read_text())
    assert saved["step"] == 150 and saved["rank"] == 1 and saved["world_size"] == 2
    rest = run("resume", 120)
    stream = ShardStream(m30k_centered, StreamConfig(seed=3, max_tokens=1024, pool_blocks=2), rank=1, world_size=2)
    uninterrupted = [digest(b) for b in itertools.islice(stream, 270)]
    assert first + rest == uninterrupted
    # A state from another world size is refused unless asked for the approximate resume.
    other = ShardStream(m30k_centered, StreamConfig(seed=3, max_tokens=1024, pool_blocks=2))
    with pytest.raises(ValueError, match="rank 1 of 2"):
        other.load_state_dict(saved)
    other.load_state_dict(saved, strict_world=False)
    assert other.step == 150 and all(c[2] == 0 for c in other.cursor)
    # With another pool size too, each direction restarts at the pool holding its saved pool's first block.
    saved["cursor"][0][1] = 5          # blocks 10 and 11 of its epoch's order: pool 2 of 4-block pools
    bigger = ShardStream(m30k_centered, StreamConfig(seed=3, max_tokens=1024, pool_blocks=4))
    bigger.load_state_dict(saved, strict_world=False)
    assert [c[:2] for c in bigger.cursor] == [[e, p * 2 // 4] for e, p, _ in saved["cursor"]]
    assert bigger.cursor[0][1] == 2
    saved["pool_blocks"] = 3
    with pytest.raises(ValueError, match="3 blocks per pool"):
        ShardStream(m30k_centered, StreamConfig(seed=3, max_tokens=1024, pool_blocks=2), rank=1,
                    world_size=2).load_state_dict(saved)


def test_eval_batches_cover_each_row_once(m30k_centered):
    m = Manifest.load(m30k_centered)
    parts = []
    for rank in range(3):
        lines = []
        for batch in eval_batches(m30k_centered, "valid", "fr-de", max_tokens=700, rank=rank, world_size=3):
            assert (batch.tgt_lang == m.lang_id("de")).all()
            lines += batch.lines.tolist()
        parts.append(lines)
    flat = [x for p in parts for x in p]
    assert sorted(flat) == list(range(1, 1015))


def test_stream_refuses_bad_settings_and_damaged_shards(m30k_centered, tmp_path):
    with pytest.raises(ValueError, match="cannot hold the longest pair"):
        ShardStream(m30k_centered, StreamConfig(max_tokens=100))
    with pytest.raises(ManifestError, match="no direction de-fr"):
        ShardStream(m30k_centered, StreamConfig(directions=["de-fr"]))
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(m30k_centered, copy)
    shard = copy / "train" / "fr-en.00000.arrow"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(ManifestError, match="fr-en.00000.arrow"):
        ShardStream(copy)
