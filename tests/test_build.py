"""cll-shards build / inspect / verify on real corpora, and the promises about bad input."""
import json
import re
import shutil
import time

import pyarrow as pa
import pytest
import sentencepiece as spm

from cll_scale.core.clock import StageClock
from cll_scale.data import shards as build_mod
from cll_scale.data.corpora import read_hf_dataset, read_multiway
from cll_scale.data.manifest import Manifest, ManifestError
from cll_scale.data.shards import BuildConfig, build_shards
from cll_scale.data.tokenizer import language_sample_rates
from data_tools.cli import main
from tests.conftest import OPUS_SAMPLE, run_cli
from tests.hf_fixtures import multi30k_pairs, write_pair, write_repo_card


def read_shard(path):
    return pa.ipc.open_file(pa.OSFile(str(path))).read_all()


def test_multi30k_centered_real_build(m30k_centered, multi30k):
    m = Manifest.load(m30k_centered)
    assert m.languages[0] == "en" and m.central_language == "en"
    train = m.splits["train"]
    assert sorted(train.directions()) == sorted(m.supervised) and len(m.supervised) == 6
    assert sorted(m.zero_shot) == sorted(["de-fr", "fr-de", "de-cs", "cs-de", "fr-cs", "cs-fr"])
    for d in m.supervised:   # every line is either written or counted as filtered
        assert train.rows(d) + sum(train.filtered[d].values()) == 29000
        assert train.rows(d) == 29000   # Multi30k has no empty or over-long line
    assert set(m.splits) == {"train", "valid", "test_2016_flickr", "test_2018_flickr"}
    assert m.splits["valid"].role == "valid" and m.splits["test_2016_flickr"].role == "test"
    assert len(m.splits["test_2016_flickr"].directions()) == 12
    # Test shards keep the raw text next to the ids, and the ids decode back to it.
    sp = spm.SentencePieceProcessor(model_file=str(m30k_centered / m.tokenizer.file))
    shard = next(s for s in m.splits["test_2016_flickr"].shards if s.direction == "de-fr")
    table = read_shard(m30k_centered / shard.file)
    de = (multi30k / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    assert table.column("src_text").to_pylist() == [x.strip() for x in de]
    assert table.column("line").to_pylist() == list(range(1, 1001))
    assert sp.decode(table.column("src_ids")[7].as_py()) == de[7].strip()
    # Tags are control symbols: typed text never turns into a tag id.
    tag = m.tokenizer.lang_tag_ids["de"]
    assert sp.id_to_piece(tag) == "<2de>" and tag not in sp.encode("<2de> Hallo")


def test_triangle_build_and_inspect(multi30k, tmp_path, capsys):
    out = tmp_path / "tri"
    code, stdout, _ = run_cli(main, ["build", "--corpus", str(multi30k), "--condition", "triangle",
                                     "--langs", "de,fr,cs", "--out", str(out)], capsys)
    assert code == 0
    m = Manifest.load(out)
    assert m.supervised == ["de-fr", "fr-cs", "cs-de"] and m.central_language is None
    assert sorted(m.zero_shot) == ["cs-fr", "de-cs", "fr-de"]
    assert [m.splits["train"].rows(d) for d in m.supervised] == [29000] * 3
    code, table, _ = run_cli(main, ["inspect", str(out)], capsys)
    assert code == 0 and "central: (none)" in table
    # The triangle's strict dependence (paper §4.1) is named, with each source's one target.
    assert "targets by source: de→fr  fr→cs  cs→de" in table
    assert "strict dependence: yes" in table
    row = next(line for line in table.splitlines() if line.startswith("train") and " de-fr " in line)
    assert "supervised" in row and "29,000" in row
    assert any(line.startswith("valid") and " fr-de " in line and "zero-shot" in line for line in table.splitlines())
    # The first line says where the build's time went, stage by stage, adding up to its total.
    total, stages = re.fullmatch(r"wrote .* in ([\d.]+) s \((.*)\)", stdout.splitlines()[0]).groups()
    seconds = {name: float(x) for name, x in (item.split() for item in stages.split(", "))}
    assert list(seconds) == ["scan", "spm_read", "spm_sample", "spm_train", "read", "encode", "filter", "write",
                             "finish"]
    assert abs(sum(seconds.values()) - float(total)) <= 0.05 * len(seconds)   # each rounded to 0.1 s


def test_opus100_sample_builds(tmp_path, capsys):
    if not OPUS_SAMPLE.is_dir():
        pytest.skip("OPUS-100 sample missing")
    out = tmp_path / "opus"
    code, _, err = run_cli(main, ["build", "--corpus", str(OPUS_SAMPLE), "--out", str(out),
                                  "--vocab-size", "400"], capsys)
    assert code == 0, err
    m = Manifest.load(out)
    assert m.central_language == "en" and sorted(m.zero_shot) == ["de-fr", "fr-de"]
    assert m.splits["train"].rows("de-en") == 2 and m.splits["test"].rows("fr-de") == 2
    assert run_cli(main, ["verify", str(out)], capsys)[0] == 0


def _hf_corpus(root, multi30k):
    sizes = {"de-en": 600, "en-fr": 150}
    for pair, n in sizes.items():
        write_pair(root, pair, "train", multi30k_pairs(multi30k, pair, "train", n))
        write_pair(root, pair, "validation", multi30k_pairs(multi30k, pair, "validation", 40))
    write_pair(root, "de-fr", "test", multi30k_pairs(multi30k, "de-fr", "test_2016_flickr", 30))
    return sizes


def test_parquet_in_hf_schema_builds(multi30k, tmp_path, capsys):
    root = tmp_path / "hf"
    _hf_corpus(root, multi30k)
    out = tmp_path / "out"
    code, _, err = run_cli(main, ["build", "--corpus", str(root), "--out", str(out), "--vocab-size", "1000"], capsys)
    assert code == 0, err
    m = Manifest.load(out)
    assert m.source["format"] == "parquet" and m.central_language == "en"
    assert m.splits["train"].rows("de-en") == 600 and m.splits["train"].rows("fr-en") == 150
    assert m.splits["valid"].rows("en-fr") == 40 and sorted(m.zero_shot) == ["de-fr", "fr-de"]


def test_hub_code_path_on_a_local_clone(multi30k, tmp_path):
    """The path users with network take, load_dataset(name, pair, split, streaming=True),
    exercised offline on a local directory laid out like the hub repository."""
    root = tmp_path / "opus-100"
    _hf_corpus(root, multi30k)
    write_repo_card(root, {"de-en": ["train", "validation"], "en-fr": ["train", "validation"],
                           "de-fr": ["test"]})
    corpus = read_hf_dataset(str(root))
    assert corpus.fmt == "hf" and corpus.central == "en"
    assert sorted(map(str, corpus.zero_shot)) == ["de-fr", "fr-de"]
    m = build_shards(corpus, BuildConfig(out_dir=str(tmp_path / "out"), vocab_size=1000))
    assert m.splits["train"].rows("en-de") == 600


def test_hf_rows_with_wrong_fields_are_an_error(tmp_path, capsys):
    write_pair(tmp_path / "hf", "de-en", "train", [("a", "b")])
    path = tmp_path / "hf" / "de-en" / "train-00000-of-00001.parquet"
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"translation": [{"de": "a", "fr": "b"}]}), path)
    code, _, err = run_cli(main, ["build", "--corpus", str(tmp_path / "hf"), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "expected a 'translation' struct with fields ['de', 'en']" in err
    assert not (tmp_path / "o").exists()


def test_empty_and_overlong_lines_are_filtered_and_counted(small_multiway, tmp_path):
    en = (small_multiway / "train.en").read_text().splitlines()
    de = (small_multiway / "train.de").read_text().splitlines()
    en[3], de[10] = "   ", ""
    en[20] = " ".join(["word"] * 400)
    (small_multiway / "train.en").write_text("\n".join(en) + "\n")
    (small_multiway / "train.de").write_text("\n".join(de) + "\n")
    m = build_shards(read_multiway(small_multiway, "centered"),
                     BuildConfig(out_dir=str(tmp_path / "o"), vocab_size=1200, max_length=150))
    train = m.splits["train"]
    assert train.filtered["en-de"] == {"empty": 2, "too_long": 1}
    assert train.filtered["de-en"] == {"empty": 2, "too_long": 1}
    assert train.filtered["en-fr"] == {"empty": 1, "too_long": 1}
    assert train.filtered["cs-en"]["empty"] == 1
    for d in m.supervised:
        assert train.rows(d) + sum(train.filtered[d].values()) == 300
    lines = read_shard(tmp_path / "o" / next(s.file for s in train.shards if s.direction == "en-de"))["line"]
    assert 4 not in lines.to_pylist() and 21 not in lines.to_pylist() and 22 in lines.to_pylist()


@pytest.mark.whole_machine
def test_build_stages_add_up_to_the_build(small_multiway, tmp_path):
    clock = StageClock()
    clock.add("scan", 100.0)                  # a stage the caller timed before is not the build's
    start = time.perf_counter()
    build_shards(read_multiway(small_multiway, "centered"),
                 BuildConfig(out_dir=str(tmp_path / "o"), vocab_size=1200), clock)
    wall = time.perf_counter() - start
    assert list(clock.seconds) == ["scan", "spm_read", "spm_sample", "spm_train", "read", "encode", "filter",
                                   "write", "finish"]
    assert clock.seconds["scan"] == 100.0 and min(clock.seconds.values()) >= 0
    build = clock.total() - 100.0
    assert wall - 0.05 <= build <= wall


def test_stage_clock_counts_a_readers_time_without_the_loop_body():
    now = [0.0]

    def reader():
        for i in range(3):
            now[0] += 1.0                     # reading one item takes 1 s
            yield i

    clock = StageClock(timer=lambda: now[0])
    for _ in clock.iterate("read", reader()):
        with clock.stage("work"):
            now[0] += 10.0                    # the body's 10 s are not the reader's
    assert clock.seconds == {"read": 3.0, "work": 30.0}
    assert clock.format() == "33.0 s (read 3.0, work 30.0)"


def test_bounded_shards_and_blocks(small_multiway, tmp_path):
    m = build_shards(read_multiway(small_multiway, "centered"),
                     BuildConfig(out_dir=str(tmp_path / "o"), vocab_size=1200, block_rows=64, shard_rows=128))
    shards = [s for s in m.splits["train"].shards if s.direction == "en-fr"]
    assert [s.rows for s in shards] == [128, 128, 44]
    reader = pa.ipc.open_file(pa.OSFile(str(tmp_path / "o" / shards[0].file)))
    assert reader.num_record_batches == 2 and reader.get_batch(1).num_rows == 64


def test_flipped_byte_fails_verify_naming_the_shard(small_multiway, tmp_path, capsys):
    out = tmp_path / "o"
    build_shards(read_multiway(small_multiway, "centered"), BuildConfig(out_dir=str(out), vocab_size=1200))
    assert run_cli(main, ["verify", str(out)], capsys)[0] == 0
    shard = out / "train" / "de-en.00000.arrow"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    code, _, err = run_cli(main, ["verify", str(out)], capsys)
    assert code == 2 and "train/de-en.00000.arrow: sha256 differs" in err
    assert "en-de.00000" not in err
    # Ranks of a node share the hashing: exactly one of three parts hashes (and names) the shard.
    m = Manifest.load(out)
    found = [m.check_files(out, part=(i, 3)) for i in range(3)]
    assert sorted(map(len, found)) == [0, 0, 1] and "de-en.00000.arrow: sha256" in sum(found, [])[0]
    shard.write_bytes(bytes(data[:-100]))
    # ... while every part checks every size.
    assert all("truncated" in m.check_files(out, part=(i, 3))[0] for i in range(3))
    code, _, err = run_cli(main, ["verify", str(out)], capsys)
    assert code == 2 and "de-en.00000.arrow" in err and "truncated" in err
    with pytest.raises(ManifestError, match="de-en.00000.arrow"):
        Manifest.load(out).verify(out, full=False)


def test_existing_output_is_refused_unless_overwrite(small_multiway, tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["build", "--corpus", str(small_multiway), "--out", str(out), "--vocab-size", "1200"]
    assert run_cli(main, argv, capsys)[0] == 0
    first = (out / "manifest.json").read_text()
    code, _, err = run_cli(main, argv, capsys)
    assert code == 2 and "exists; pass --overwrite" in err
    code, _, err = run_cli(main, argv + ["--overwrite", "--seed", "2"], capsys)
    assert code == 0, err
    assert (out / "manifest.json").read_text() != first and Manifest.load(out).languages[0] == "en"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "small"]
    # Every file we write is readable by others, as open() would make it (not mkstemp's 0600).
    assert (out / "manifest.json").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask():
    import os
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _tree(path):
    return sorted((str(p.relative_to(path)), p.read_bytes() if p.is_file() else None) for p in path.rglob("*"))


def test_overwrite_never_deletes_what_cll_shards_did_not_write(small_multiway, tmp_path, capsys):
    """Finding 1 of the misuse probe: --overwrite deleted a user's corpus, an unrelated
    directory and a symlink's target. Each case is now refused, and every byte stays."""
    parent = tmp_path / "parent"
    corpus = parent / "corpus"
    shutil.copytree(small_multiway, corpus)
    (parent / "other.txt").write_text("unrelated")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work")
    link = tmp_path / "link"
    link.symlink_to(victim, target_is_directory=True)
    before = {p: _tree(p) for p in (parent, victim)}

    def build(out, extra=()):
        return run_cli(main, ["build", "--corpus", str(corpus), "--out", str(out), "--vocab-size", "1200",
                              "--overwrite", *extra], capsys)
    code, _, err = build(corpus)                         # the corpus itself
    assert code == 2 and "is the input" in err
    code, _, err = build(parent)                         # a directory holding the corpus
    assert code == 2 and "contains the input" in err
    code, _, err = build(corpus / "shards")              # inside the corpus
    assert code == 2 and "sits inside the input" in err
    code, _, err = build(victim)                         # a plain directory of the user's
    assert code == 2 and "not a shard directory" in err and "thesis.tex" in err
    code, _, err = build(link)                           # a symlink to it
    assert code == 2 and "not a shard directory" in err and "thesis.tex" in err
    afile = tmp_path / "afile"
    afile.write_text("keep")
    code, _, err = build(afile)
    assert code == 2 and "is a file" in err and afile.read_text() == "keep"
    assert {p: _tree(p) for p in (parent, victim)} == before and link.resolve() == victim.resolve()
    # A shard build the user added a file to is not ours alone any more: refused, naming it.
    shards = tmp_path / "shards"
    assert build(shards)[0] == 0
    (shards / "notes.md").write_text("mine")
    code, _, err = build(shards)
    assert code == 2 and "notes.md" in err and (shards / "notes.md").read_text() == "mine"
    # A symlink to a real shard build is replaced through the link (the link stays a link).
    (shards / "notes.md").unlink()
    shard_link = tmp_path / "shard-link"
    shard_link.symlink_to(shards, target_is_directory=True)
    code, _, err = build(shard_link, ["--seed", "3"])
    assert code == 0, err
    assert shard_link.is_symlink() and Manifest.load(shard_link).source["spm"]["seed"] == 3


def test_download_overwrite_replaces_only_a_multi30k_download(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data.csv").write_text("mine")
    code, _, err = run_cli(main, ["download", "multi30k", "--out", str(victim), "--overwrite",
                                  "--base-url", (tmp_path / "nowhere").as_uri()], capsys)
    assert code == 2 and "not a Multi30k download" in err and (victim / "data.csv").read_text() == "mine"


def test_an_output_that_cannot_be_written_is_named_by_out_before_the_corpus_is_read(small_multiway, tmp_path,
                                                                                   capsys, monkeypatch):
    """Issue 51's build note: a build into an immutable directory named its temporary
    `.x.tmp-PID` folder, after scanning the whole corpus. Now one line names `--out` as given and
    says it cannot be written, and the corpus is never read. A file on the way refuses the
    directory for every user; a read-only folder only for one who is not root. A corpus refused
    after that check leaves no folder behind either."""
    import os
    import data_tools.commands
    from cll_scale.core.errors import EXIT_FILES, EXIT_INPUT

    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(main, ["build", "--corpus", "nosuch", "--out", "new/deep/x"], capsys)
    assert code == EXIT_INPUT and "nosuch" in err and not (tmp_path / "new").exists()

    def no_reading(args):
        raise AssertionError("the corpus was read before --out was known to be writable")
    monkeypatch.setattr(data_tools.commands, "read_corpus", no_reading)
    (tmp_path / "afile").write_text("keep")
    readonly = tmp_path / "ro"
    readonly.mkdir(mode=0o555)
    refused = {"afile/x": f"{tmp_path / 'afile'}: a file, not a directory",
               "afile/y/x": f"{tmp_path / 'afile'}: a file, not a directory"}
    if not os.access(readonly, os.W_OK):                 # root writes into a 0555 folder anyway
        refused["ro/x"] = f"{readonly}: Permission denied"
    for out, why in refused.items():
        code, _, err = run_cli(main, ["build", "--corpus", str(small_multiway), "--out", out], capsys)
        assert code == EXIT_FILES and err == f"cll-shards: error: --out {out} cannot be written: {why}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "ro", "small"] and not any(readonly.iterdir())


def test_failed_build_leaves_nothing_and_keeps_the_old_output(small_multiway, tmp_path, monkeypatch):
    out = tmp_path / "o"
    build_shards(read_multiway(small_multiway, "centered"), BuildConfig(out_dir=str(out), vocab_size=1200))
    before = json.loads((out / "manifest.json").read_text())
    calls = {"n": 0}
    real_close = build_mod._DirectionWriter.close

    def dying_close(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("interrupted mid-build")
        return real_close(self)
    monkeypatch.setattr(build_mod._DirectionWriter, "close", dying_close)
    with pytest.raises(KeyboardInterrupt):
        build_shards(read_multiway(small_multiway, "centered"),
                     BuildConfig(out_dir=str(out), vocab_size=1000, overwrite=True))
    assert json.loads((out / "manifest.json").read_text()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "small"]   # no temp dir left
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        build_shards(read_multiway(small_multiway, "centered"), BuildConfig(out_dir=str(tmp_path / "new")))
    assert not (tmp_path / "new").exists()


def test_reusing_a_sentencepiece_model(m30k_centered, small_multiway, tmp_path, capsys):
    spm_path = m30k_centered / "spm.model"
    out = tmp_path / "o"
    code, stdout, err = run_cli(main, ["build", "--corpus", str(small_multiway), "--out", str(out),
                                       "--spm-model", str(spm_path)], capsys)
    assert code == 0, err
    assert Manifest.load(out).tokenizer.sha256 == Manifest.load(m30k_centered).tokenizer.sha256
    assert "spm_" not in stdout.splitlines()[0]       # no SentencePiece stage with a given model
    # A model without the tags this corpus needs is refused with the missing tags named.
    other = tmp_path / "tri"
    shutil.copytree(small_multiway, other)
    for f in other.glob("*.cs"):
        f.rename(f.with_suffix(".it"))
    code, _, err = run_cli(main, ["build", "--corpus", str(other), "--out", str(tmp_path / "o2"),
                                  "--spm-model", str(spm_path)], capsys)
    assert code == 2 and "<2it>" in err and not (tmp_path / "o2").exists()


def test_vocabulary_temperature_balancing():
    counts = {"en": 90_000, "de": 9_000, "cs": 1_000}
    flat = language_sample_rates(counts, 10_000, temperature=1.0)
    assert all(abs(flat[x] - 10_000 / 100_000) < 1e-12 for x in counts)   # T=1: proportional
    hot = language_sample_rates(counts, 10_000, temperature=100.0)
    shares = {x: hot[x] * counts[x] / 10_000 for x in counts}
    assert all(abs(s - 1 / 3) < 0.02 for s in shares.values())             # T→∞: uniform
    t5 = language_sample_rates(counts, 10_000, temperature=5.0)
    assert t5["cs"] > t5["de"] > t5["en"] and t5["en"] * 90_000 < 0.9 * 10_000 * 0.9


def test_multi30k_downloader_on_local_files(multi30k, tmp_path, capsys):
    """The download path real users take, served from local .gz files (no network)."""
    import gzip
    from data_tools.download import MULTI30K_FILES
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name in MULTI30K_FILES:
        (mirror / f"{name}.gz").write_bytes(gzip.compress((multi30k / name).read_bytes()))
    out = tmp_path / "m30k"
    code, _, err = run_cli(main, ["download", "multi30k", "--out", str(out), "--base-url", mirror.as_uri()], capsys)
    assert code == 0, err
    assert (out / "train.cs").read_bytes() == (multi30k / "train.cs").read_bytes()
    (mirror / "val.fr.gz").unlink()
    code, _, err = run_cli(main, ["download", "multi30k", "--out", str(tmp_path / "b"),
                                  "--base-url", mirror.as_uri()], capsys)
    assert code == 3 and "val.fr.gz" in err and not (tmp_path / "b").exists()


def test_inspect_says_when_the_tag_decides_the_output_language():
    from data_tools.cli import dependence_lines
    from cll_scale.data.corpora import condition_directions
    square = dependence_lines(condition_directions("square", ["de", "fr", "cs", "en"], None)[2])
    assert square == ["targets by source: de→fr,en  fr→de,cs  cs→fr,en  en→cs,de",
                      "strict dependence: no, the language tag decides the output of every source language"]
    centered = dependence_lines(condition_directions("centered", ["en", "de", "fr"], "en")[2])
    assert centered[-1] == "strict dependence: no, the language tag decides the output of en"


def test_verify_of_an_export_is_refused_with_a_listed_exit_code(tiny_export, capsys):
    """Issue 66: `cll-shards verify EXPORT` listed every shard as missing and exited 1, a code the
    README does not list (a damaged shard directory exits 2 too, test above)."""
    code, _, err = run_cli(main, ["verify", str(tiny_export)], capsys)
    assert code == 2 and f"cll-shards: error: {tiny_export} holds an export (export.json), not a shard directory" in err
    assert "FAIL" not in err


def test_build_reuse_keeps_this_build_and_refuses_another(small_multiway, tmp_path, capsys):
    """Issue 66: make quickstart and cll-repro reused any directory holding a manifest.json. With
    --reuse (what both use) a build of this corpus and condition is kept, saying which settings it
    was built with otherwise; one of other languages, order, directions or corpus is refused."""
    out = tmp_path / "shards"
    args = ["build", "--reuse", "--corpus", str(small_multiway), "--condition", "triangle", "--out", str(out)]
    code, _, err = run_cli(main, [*args, "--langs", "de,fr,cs", "--vocab-size", "800"], capsys)
    assert code == 0 and (out / "manifest.json").is_file(), err
    built = (out / "manifest.json").stat().st_mtime_ns
    code, _, err = run_cli(main, [*args, "--langs", "de,fr,cs", "--vocab-size", "800"], capsys)
    assert code == 0 and err == f"kept {out}: the shards of this corpus and condition\n"
    code, _, err = run_cli(main, [*args, "--langs", "de,fr,cs"], capsys)            # cll-shards' default 8000
    assert code == 0 and "built with --vocab-size 800 (--overwrite rebuilds them" in err, err
    code, _, err = run_cli(main, [*args, "--langs", "fr,de,cs"], capsys)            # another triangle
    assert code == 2 and f"{out} holds shards of another build (languages de,fr,cs (central none), not fr,de,cs" in err
    assert len(err.strip().splitlines()) == 1, err
    other = tmp_path / "other"
    shutil.copytree(small_multiway, other)
    code, _, err = run_cli(main, [*args[:3], str(other), *args[4:], "--langs", "de,fr,cs"], capsys)
    assert code == 2 and f"(the corpus {small_multiway}, not {other})" in err, err
    assert (out / "manifest.json").stat().st_mtime_ns == built                       # never rebuilt


def test_a_ring_built_without_langs_takes_the_papers_order_as_cll_repro_does(small_multiway, tmp_path, capsys):
    """Issue 66, C: `cll-shards build --condition square` without --langs took the files'
    alphabetical order (cs, de, en, fr), so its zero-shot directions (cs-en, de-fr, …) were not
    cll-repro's square (de-cs, fr-en). Without --langs a ring takes the paper's order; other
    languages than the paper's are refused, since the order decides the zero-shot directions."""
    from cll_scale.core.errors import EXIT_INPUT
    from cll_scale.repro.scheduler import CONDITION_LANGS       # the order cll-repro builds with
    for condition in ("square", "cycle"):
        repro = read_multiway(small_multiway, condition, langs=CONDITION_LANGS[condition].split(","))
        plain = read_multiway(small_multiway, condition)
        assert (plain.supervised, plain.zero_shot) == (repro.supervised, repro.zero_shot)
    out = tmp_path / "square"
    code, _, err = run_cli(main, ["build", "--corpus", str(small_multiway), "--condition", "square",
                                  "--vocab-size", "400", "--out", str(out)], capsys)
    assert code == 0, err
    assert sorted(Manifest.load(out).zero_shot) == ["cs-de", "de-cs", "en-fr", "fr-en"]
    other = tmp_path / "other"
    other.mkdir()
    for lang in ("es", "it", "pt", "nl"):
        (other / f"train.{lang}").write_text("a\nb\n", encoding="utf-8")
    code, _, err = run_cli(main, ["build", "--corpus", str(other), "--condition", "square", "--out",
                                  str(tmp_path / "o")], capsys)
    assert code == EXIT_INPUT and "pass --langs" in err and "the paper's is de,fr,cs,en" in err, err


@pytest.mark.parametrize("content", ["[1, 2]", "null", "\"manifest\""])
def test_a_manifest_that_is_not_a_json_object_is_named_by_every_reader(m30k_centered, tmp_path, capsys, content):
    """Issue 66, C: a manifest.json holding `[1,2]` or `null` gave an AttributeError traceback in
    `inspect`, `build --overwrite` and `cll-train --data`. Each now says which file is damaged."""
    from cll_scale.core.errors import EXIT_INPUT
    from cll_scale.train import main as train_main
    from tests.test_train import common
    shards = tmp_path / "shards"
    shutil.copytree(m30k_centered, shards)
    (shards / "manifest.json").write_text(content)
    named = f"{shards / 'manifest.json'}: damaged manifest"
    code, _, err = run_cli(main, ["inspect", str(shards)], capsys)
    assert code == EXIT_INPUT and named in err and "Traceback" not in err, err
    code, _, err = run_cli(train_main, common(shards, tmp_path / "run", 2), capsys)
    assert code == EXIT_INPUT and named in err and "Traceback" not in err, err
    code, _, err = run_cli(main, ["build", "--corpus", str(tmp_path / "nowhere"), "--out", str(shards),
                                  "--overwrite"], capsys)
    assert code == EXIT_INPUT and named in err and "Traceback" not in err, err
    assert (shards / "manifest.json").read_text() == content


@pytest.mark.parametrize("flags, reason", [
    (["--character-coverage", "2"], "--character-coverage 2: the share of the text's characters the vocabulary "
                                    "covers, in (0, 1]"),
    (["--threads", "0"], "--threads 0: SentencePiece trains with at least 1 thread"),
    (["--vocab-size", "-5"], "--vocab-size -5: the number of subwords to learn"),
    (["--vocab-size", "200"], "--vocab-size 200 leaves no room for learned subwords: the 256 byte pieces"),
])
def test_sentencepiece_settings_are_refused_with_their_reason(small_multiway, tmp_path, capsys, flags, reason):
    """Issue 66, C: `--character-coverage 2`, `--threads 0`, `--vocab-size -5` ended in "could not
    learn a vocabulary of N:" with an empty reason. Each is refused before the corpus is read,
    saying what the setting means."""
    from cll_scale.core.errors import EXIT_INPUT
    out = tmp_path / "s"
    code, _, err = run_cli(main, ["build", "--corpus", str(small_multiway), "--out", str(out), *flags], capsys)
    assert code == EXIT_INPUT and reason in err and "could not learn" not in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
