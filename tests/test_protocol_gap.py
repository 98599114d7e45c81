"""scripts/protocol_gap.py: the validation protocol and the test protocol on one model, and the
steps between them, each read from cll-eval's own results."""
import json
import sys

from tests.conftest import ROOT, head_corpus


def test_the_chain_goes_from_the_validation_protocol_to_the_tests_one_step_at_a_time(triangle_export, multi30k,
                                                                                      tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import protocol_gap
    from cll_scale.evaluation.report import EvalReport
    export, _ = triangle_export
    corpus = head_corpus(multi30k, tmp_path / "corpus", lambda name: name.split(".")[-1] in ("de", "fr", "cs")
                         and name.startswith(("val.", "test_2016_flickr.")), lines=6)
    out = tmp_path / "out"
    assert protocol_gap.main(["--model", str(export), "--corpus", str(corpus), "--out", str(out),
                              "--sample", "3", "--lid-workers", "0"]) == 0
    reports = {name: EvalReport.load(out / name / "results.json") for name, *_ in protocol_gap.RUNS}
    rows = {name: {r.direction: r for r in rep.models["m"].directions} for name, rep in reports.items()}
    # the zero-shot directions of the triangle only, every sentence but in the sample run
    assert all(sorted(r) == ["cs-fr", "de-cs", "fr-de"] for r in rows.values())
    assert {r.n for r in rows["valid-greedy-sample"].values()} == {3}
    assert {r.n for name in ("valid-greedy", "valid-beam4", "test-beam4") for r in rows[name].values()} == {6}
    # greedy decoding is per sentence: the sample's outputs are the first of the whole split's
    for d in rows["valid-greedy"]:
        whole = (out / "valid-greedy" / "hyps" / "m" / "default" / f"{d}.txt").read_text().splitlines()
        sample = (out / "valid-greedy-sample" / "hyps" / "m" / "default" / f"{d}.txt").read_text().splitlines()
        assert sample == whole[:3]
    mean = lambda name, metric: sum(getattr(r, metric) for r in rows[name].values()) / 3     # noqa: E731
    steps = json.loads((out / "protocol.json").read_text())["steps"]
    assert [s["zero_shot_off_target"] for s in steps] == [
        mean("valid-greedy-sample", "off_target_restricted"), mean("valid-greedy-sample", "off_target"),
        mean("valid-greedy", "off_target"), mean("valid-beam4", "off_target"), mean("test-beam4", "off_target")]
    table = (out / "protocol.md").read_text()
    assert table.count("\n| ") == 6 and f"{steps[-1]['zero_shot_off_target']:.1f}%" in table
