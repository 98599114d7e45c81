"""The training stream, in both mixings (several directions per microbatch, or one): token-budget
batches, disjoint ranks, temperature sampling, and exact resume in a new process."""
import hashlib
import itertools
import json
import subprocess
import sys
from collections import Counter

import pytest
import torch

from cll_scale.data.corpora import read_parquet_dir
from cll_scale.data.manifest import Manifest, ManifestError
from cll_scale.data.shards import BuildConfig, build_shards
from cll_scale.data.stream import ShardStream, StreamConfig, eval_batches
from tests.conftest import ROOT
from tests.hf_fixtures import multi30k_pairs, write_pair


def digest(batch) -> str:
    h = hashlib.sha256()
    for t in (batch.src_tokens, batch.tgt_tokens, batch.lines):
        h.update(t.numpy().tobytes())
    h.update(batch.direction.encode())
    return h.hexdigest()[:16]


def test_one_direction_batches_are_language_grouped_within_budget(m30k_centered):
    m = Manifest.load(m30k_centered)
    stream = ShardStream(m30k_centered, StreamConfig(batch_tokens=2048, seed=5, mixing="direction"))
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
        assert batch.lang_runs == ((m.lang_id(tgt), len(batch)),)
    assert set(seen) == set(m.supervised)
    assert pad / total < 0.10, f"padding {pad / total:.1%}: length bucketing is not working"


def test_mixed_batches_hold_many_directions_ordered_by_target_language(m30k_centered):
    m = Manifest.load(m30k_centered)
    stream = ShardStream(m30k_centered, StreamConfig(batch_tokens=2048, seed=5))
    assert stream.cfg.mixing == "mixed"                 # the default (issue 34)
    supervised = {(m.lang_id(d.split("-")[0]), m.lang_id(d.split("-")[1])) for d in m.supervised}
    tag_of = {m.lang_id(x): i for x, i in m.tokenizer.lang_tag_ids.items()}
    lsl_order = {i: -1 if x == m.central_language else i for i, x in enumerate(m.languages)}
    pad = total = several = 0
    for batch in itertools.islice(stream, 300):
        assert batch.direction == "mixed"
        pairs = set(zip(batch.src_lang.tolist(), batch.tgt_lang.tolist()))
        assert pairs <= supervised
        several += len(pairs) > 1
        assert batch.src_tokens[:, 0].tolist() == [tag_of[t] for t in batch.tgt_lang.tolist()]   # <2tgt> per row
        keys = [lsl_order[t] for t in batch.tgt_lang.tolist()]
        assert keys == sorted(keys)                      # central language first, then the LSL slots
        runs = [(t, len(list(g))) for t, g in itertools.groupby(batch.tgt_lang.tolist())]
        assert batch.lang_runs == tuple(runs)
        assert len(batch) * max(batch.src_tokens.shape[1], batch.tgt_tokens.shape[1]) <= 2048
        assert batch.ntokens == int((batch.tgt_tokens != m.tokenizer.pad_id).sum())
        for toks in (batch.src_tokens, batch.tgt_tokens):
            pad += int((toks == m.tokenizer.pad_id).sum())
            total += toks.numel()
    assert several > 290                                 # a step is several directions, not one
    assert pad / total < 0.12, f"padding {pad / total:.1%}: length bucketing is not working"


def test_mixed_ranks_are_disjoint_and_cover_an_epoch(m30k_centered):
    de = Manifest.load(m30k_centered).lang_id("de")
    seen = {}
    for rank in range(2):
        stream = ShardStream(m30k_centered, StreamConfig(directions=["de-en", "en-de"], mix_rows=3000), rank, 2)
        served = {0: Counter(), 1: Counter()}
        # Whole mixed pools until each direction has begun its second epoch: a pool that holds the
        # end of one epoch and the start of the next serves their rows in one shuffled order.
        while not (min(c[0] for c in stream.cursor) >= 1 and stream.mix[1] >= len(stream._mixed.batches)):
            batch = next(stream)
            for src, line in zip(batch.src_lang.tolist(), batch.lines.tolist()):
                served[0 if src == de else 1][line] += 1
        for d, counts in served.items():
            assert len(counts) == stream.rank_rows[d]                # every row of the rank's slice...
            assert max(counts.values()) == 2                         # ...once an epoch
            assert sum(counts.values()) - len(counts) == sum(v == 2 for v in counts.values())
            seen[rank, d] = set(counts)
    for d in (0, 1):
        assert not seen[0, d] & seen[1, d]
        assert seen[0, d] | seen[1, d] == set(range(1, 29001))


def test_pool_rows_bound_the_pooled_rows_of_all_directions(m30k_centered):
    m = Manifest.load(m30k_centered)
    n_dirs = len(m.splits["train"].directions())
    assert ShardStream(m30k_centered).pool_blocks == 8            # the default budget: pool_blocks rules
    for budget, k in ((n_dirs * 3 * m.block_rows, 3), (n_dirs * 3 * m.block_rows - 1, 2), (1, 1)):
        stream = ShardStream(m30k_centered, StreamConfig(pool_rows=budget, batch_tokens=1024, mixing="direction"))
        assert stream.pool_blocks == k
        peak = 0
        for _ in range(600):
            next(stream)
            peak = max(peak, sum(len(pool.lines) for _, pool in stream._pools.values()))
        assert len(stream._pools) == n_dirs and peak <= max(budget, n_dirs * m.block_rows)
        assert peak > (k - 1) * n_dirs * m.block_rows      # the budget is used, not just obeyed


def test_same_seed_same_stream_and_epochs_reshuffle(m30k_centered):
    cfg = StreamConfig(seed=11, batch_tokens=1024)
    a = [digest(b) for b in itertools.islice(ShardStream(m30k_centered, cfg), 40)]
    b = [digest(b) for b in itertools.islice(ShardStream(m30k_centered, cfg), 40)]
    c = [digest(b) for b in itertools.islice(ShardStream(m30k_centered, StreamConfig(seed=12, batch_tokens=1024)), 40)]
    assert a == b and a != c
    one = ShardStream(m30k_centered, StreamConfig(directions=["en-fr"], pool_blocks=64, mixing="direction"))
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
    m = Manifest.load(out)
    name = {(m.lang_id(d.split("-")[0]), m.lang_id(d.split("-")[1])): d for d in m.supervised}
    for temperature, expect in ((1.0, {"de-en": 0.4, "en-de": 0.4, "en-fr": 0.1, "fr-en": 0.1}),
                                (1e9, {"de-en": 0.25, "en-de": 0.25, "en-fr": 0.25, "fr-en": 0.25})):
        stream = ShardStream(out, StreamConfig(temperature=temperature, batch_tokens=512, mixing="direction"))
        counts = Counter(b.direction for b in itertools.islice(stream, 4000))
        for d, p in expect.items():           # batches of one direction: 4,000 draws, sd <= 0.008
            assert abs(counts[d] / 4000 - p) < 0.03, (temperature, counts)
        stream = ShardStream(out, StreamConfig(temperature=temperature, batch_tokens=512, mix_rows=1000))
        rows = Counter()
        while stream.mix[0] < 20:             # 20 whole mixed pools: 20,000 rows, sd <= 0.0035
            batch = next(stream)
            rows.update(name[pair] for pair in zip(batch.src_lang.tolist(), batch.tgt_lang.tolist()))
        total = sum(rows.values())
        assert total == 20 * 1000 + sum(len(b) for b in stream._mixed.batches[:stream.mix[1]])
        for d, p in expect.items():
            assert abs(rows[d] / total - p) < 0.015, (temperature, rows)


RESUME_SCRIPT = """
import json, sys, itertools, hashlib
from cll_scale.data.stream import ShardStream, StreamConfig
from tests.test_stream import digest
shards, state_file, mode, n, mixing = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
stream = ShardStream(shards, StreamConfig(seed=3, batch_tokens=1024, pool_blocks=2, mix_rows=2000, mixing=mixing),
                     rank=1, world_size=2)
if mode == "resume":
    stream.load_state_dict(json.load(open(state_file)))
out = [digest(b) for b in itertools.islice(stream, n)]
json.dump(stream.state_dict(), open(state_file, "w"))
print(json.dumps(out))
"""


def resume_in_new_processes(shards, state, mixing):
    def run(mode, n):
        res = subprocess.run([sys.executable, "-c", RESUME_SCRIPT, str(shards), str(state), mode, str(n), mixing],
                             cwd=ROOT, capture_output=True, text=True, check=True)
        return json.loads(res.stdout)
    first = run("fresh", 150)
    saved = json.loads(state.read_text())
    assert saved["step"] == 150 and saved["rank"] == 1 and saved["world_size"] == 2
    rest = run("resume", 120)
    stream = ShardStream(shards, StreamConfig(seed=3, batch_tokens=1024, pool_blocks=2, mix_rows=2000, mixing=mixing),
                         rank=1, world_size=2)
    uninterrupted = [digest(b) for b in itertools.islice(stream, 270)]
    assert first + rest == uninterrupted
    return saved


@pytest.mark.integration
def test_exact_resume_of_mixed_batches_in_a_new_process(m30k_centered, tmp_path):
    saved = resume_in_new_processes(m30k_centered, tmp_path / "state.json", "mixed")
    assert saved["version"] == 2 and saved["mix"][0] > 2 and saved["mix"][1] > 0     # resumed mid-pool
    one = ShardStream(m30k_centered, StreamConfig(seed=3, mixing="direction"))
    with pytest.raises(ValueError, match="trained with data.mixing=mixed, resume it with that"):
        one.load_state_dict(saved)
    mixed = ShardStream(m30k_centered, StreamConfig(seed=3, mix_rows=2000))
    mixed.load_state_dict(saved, strict_world=False)        # another world size: the pool from its start
    assert mixed.mix == [saved["mix"][0], 0] and all(c[2] == 0 for c in mixed.cursor)
    with pytest.raises(ValueError, match="mix_rows=2000"):
        ShardStream(m30k_centered, StreamConfig(seed=3, mix_rows=1000), 1, 2).load_state_dict(saved)


@pytest.mark.integration
def test_exact_resume_in_a_new_process(m30k_centered, tmp_path):
    saved = resume_in_new_processes(m30k_centered, tmp_path / "state.json", "direction")
    # A state from another world size is refused unless asked for the approximate resume.
    other = ShardStream(m30k_centered, StreamConfig(seed=3, batch_tokens=1024, pool_blocks=2, mixing="direction"))
    with pytest.raises(ValueError, match="rank 1 of 2"):
        other.load_state_dict(saved)
    other.load_state_dict(saved, strict_world=False)
    assert other.step == 150 and all(c[2] == 0 for c in other.cursor)
    # With another pool size too, each direction restarts at the pool holding its saved pool's first block.
    saved["cursor"][0][1] = 5          # blocks 10 and 11 of its epoch's order: pool 2 of 4-block pools
    bigger = ShardStream(m30k_centered, StreamConfig(seed=3, batch_tokens=1024, pool_blocks=4, mixing="direction"))
    bigger.load_state_dict(saved, strict_world=False)
    assert [c[:2] for c in bigger.cursor] == [[e, p * 2 // 4] for e, p, _ in saved["cursor"]]
    assert bigger.cursor[0][1] == 2
    saved["pool_blocks"] = 3
    with pytest.raises(ValueError, match="3 blocks per pool"):
        ShardStream(m30k_centered, StreamConfig(seed=3, batch_tokens=1024, pool_blocks=2, mixing="direction"), rank=1,
                    world_size=2).load_state_dict(saved)


def test_eval_batches_cover_each_row_once(m30k_centered):
    m = Manifest.load(m30k_centered)
    parts = []
    for rank in range(3):
        lines = []
        for batch in eval_batches(m30k_centered, "valid", "fr-de", batch_tokens=700, rank=rank, world_size=3):
            assert (batch.tgt_lang == m.lang_id("de")).all()
            lines += batch.lines.tolist()
        parts.append(lines)
    flat = [x for p in parts for x in p]
    assert sorted(flat) == list(range(1, 1015))


def test_stream_refuses_bad_settings_and_damaged_shards(m30k_centered, tmp_path):
    with pytest.raises(ValueError, match="cannot hold the longest pair"):
        ShardStream(m30k_centered, StreamConfig(batch_tokens=100))
    with pytest.raises(ManifestError, match="no direction de-fr"):
        ShardStream(m30k_centered, StreamConfig(directions=["de-fr"]))
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(m30k_centered, copy)
    shard = copy / "train" / "fr-en.00000.arrow"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(ManifestError, match="fr-en.00000.arrow"):
        ShardStream(copy)


@pytest.mark.parametrize("fraction", [0.5, 0.6])
def test_rows_fraction_trains_on_the_first_share_of_each_direction(m30k_centered, fraction):
    full = ShardStream(m30k_centered, StreamConfig(directions=["de-en"]))
    part = ShardStream(m30k_centered, StreamConfig(directions=["de-en"], rows_fraction=fraction, mixing="direction"))
    # to the nearest row (issue 51, finding 5: whole 1,024-row blocks made 0.6 all of them, 0.5 51-53%)
    assert part.rows[0] == round(fraction * full.rows[0])
    lines = set()
    while part.epoch < 1:
        lines.update(next(part).lines.tolist())
    assert len(lines) == part.rows[0] and max(lines) <= part.rows[0] + 1
    with pytest.raises(ValueError, match="rows_fraction"):
        StreamConfig(rows_fraction=0.0)
    with pytest.raises(ValueError, match=r"data.rows_fraction=1e-09 keeps no row of de-en \(29,000 rows\); "
                                         r"the smallest share that keeps one is 3.4e-05"):
        ShardStream(m30k_centered, StreamConfig(directions=["de-en"], rows_fraction=1e-9))


def test_a_direction_listed_twice_and_mix_directions_without_mixing_are_refused():
    with pytest.raises(ValueError, match="data.directions lists de-fr twice"):     # finding 8
        StreamConfig(directions=["de-fr", "fr-cs", "de-fr"])
    with pytest.raises(ValueError, match="data.mix_directions=2 applies to data.mixing: mixed"):
        StreamConfig(mixing="direction", mix_directions=2)


def test_mix_directions_bounds_the_directions_of_a_mixed_pool(m30k_centered):
    m = Manifest.load(m30k_centered)
    stream = ShardStream(m30k_centered, StreamConfig(mix_rows=600, mix_directions=2, batch_tokens=2048))
    pools = {}
    while stream.mix[0] < 200:
        batch = next(stream)
        pools.setdefault(stream.mix[0], set()).update(zip(batch.src_lang.tolist(), batch.tgt_lang.tolist()))
    assert max(map(len, pools.values())) == 2 and min(map(len, pools.values())) == 1   # a draw may repeat
    shares = Counter(d for dirs in pools.values() for d in dirs)
    assert len(shares) == len(m.supervised)          # every direction still comes (uniform at T=5 here)
    state = stream.state_dict()
    with pytest.raises(ValueError, match="mix_directions=2"):
        ShardStream(m30k_centered, StreamConfig(mix_rows=600, batch_tokens=2048)).load_state_dict(state)
