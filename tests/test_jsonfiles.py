"""The one reader of the project's JSON files (cll_scale.core.jsonfiles): every error names its
file and line, and a torn last line of an append-only log is dropped with a warning, so that the
run that reads it goes on."""
import json
import re

import pytest

from cll_scale.training.metrics import MetricsLogger, read_rows


def test_a_torn_last_line_of_metrics_is_dropped_with_a_warning_and_the_next_record_has_its_own_line(tmp_path, capsys):
    """Issue 66: a full disk can leave half a metrics.jsonl line; --resume and cll-repro stopped
    at "Unterminated string starting at: line 1 column 27", naming no file."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 5.0}) + "\n" + json.dumps({"step": 2, "loss": 4.0}) + "\n"
                    + '{"step": 3, "loss": 3.', encoding="utf-8")
    assert read_rows(path) == [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0}]
    err = capsys.readouterr().err
    assert f"warning: {path}: line 3 is torn" in err and "dropped" in err
    # The resume that follows truncates after its checkpoint: the torn line goes, so the records
    # written next are whole lines of their own.
    logger = MetricsLogger(path, rank=0)
    assert logger.truncate_after(2) == 0
    logger.log({"step": 3, "loss": 3.5}, {})
    assert [row["step"] for row in read_rows(path)] == [1, 2, 3]
    assert path.read_text(encoding="utf-8").endswith('"loss": 3.5}\n')


def test_a_damaged_json_file_or_line_is_named_with_its_line(tmp_path):
    from cll_scale.core.jsonfiles import read_json_lines, read_json_object
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n{"step": 2, \n{"step": 3}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{log}: line 2, column \d+: not valid JSON .*only the last line"):
        read_json_lines(log)
    damaged = tmp_path / "export.json"
    damaged.write_text('{"step": 4,\n "sha256": {"model', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{damaged}: line 2, column \d+: not valid JSON \(Unterminated string"):
        read_json_object(damaged)
    for text in ("[1, 2]", "null"):
        damaged.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=rf"^{damaged}: holds {re.escape(text)}, not a JSON object"):
            read_json_object(damaged)
    damaged.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ValueError, match=rf"^{damaged}: not UTF-8 text"):
        read_json_object(damaged)
