"""The one reader of the JSON files the project writes and a user hands back: every error names
the file (and the line), so "Unterminated string starting at: line 1 column 27" never reaches a
user without saying which of a run's dozen JSON files it is about.

An append-only JSON-lines log (``metrics.jsonl``) may end in a torn line: a full disk or a kill
during a write leaves half a record and no newline. That last line is dropped with a warning that
names the file and the line, so that ``--resume`` and ``cll-repro`` go on (the run writes those
steps again); a damaged line anywhere before it is an error, since lines after it were written
by a run that read the file whole.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}); the file is damaged or not JSON") from None


DAMAGED = "the file is damaged or of another format"


def read_json(path, hint: str = DAMAGED):
    """The JSON file ``path``; one that does not parse is a ``ValueError`` naming it, the line and
    ``hint`` (what the file should be). A missing file stays a ``FileNotFoundError`` (it names the
    path)."""
    path = Path(path)
    try:
        return json.loads(_text(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: line {err.lineno}, column {err.colno}: not valid JSON ({err.msg}); {hint}") from None


def read_json_object(path, hint: str = DAMAGED) -> dict:
    """The JSON file ``path``, which must hold an object (``{...}``): a file holding ``[1, 2]``
    or ``null`` is refused here, not as an ``AttributeError`` in whoever reads a key."""
    value = read_json(path, hint)
    if not isinstance(value, dict):
        raise ValueError(f"{path}: holds {json.dumps(value)[:40]}, not a JSON object ({{...}}); {hint}")
    return value


_WARNED: set[tuple[str, int]] = set()


class JsonLines(list):
    """The records of a JSON-lines file; ``torn`` is the line number of a torn last line that was
    dropped (None when the file ended cleanly)."""
    torn: int | None = None


def read_json_lines(path, warn: bool = True) -> JsonLines:
    """Every record of the JSON-lines file ``path`` (none when it does not exist). A last line that
    does not parse is dropped, with a warning naming the file and the line; any other is an error."""
    path = Path(path)
    rows = JsonLines()
    if not path.is_file():
        return rows
    lines = _text(path).split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines[:last + 1]):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            if i < last:
                raise ValueError(f"{path}: line {i + 1}, column {err.colno}: not valid JSON ({err.msg}); "
                                 "only the last line of a log may be torn: the file is damaged") from None
            rows.torn = i + 1
            if warn and (str(path), i + 1) not in _WARNED:     # once: a run's log is read more than once
                _WARNED.add((str(path), i + 1))
                print(f"[cll-scale] warning: {path}: line {i + 1} is torn ({err.msg}; a full disk or a kill "
                      "during a write leaves one); it is dropped and the run goes on", file=sys.stderr)
    return rows
