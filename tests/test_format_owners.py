"""One owner per file format: a run's config.json, an export's export.json, a shard manifest and an
evaluation report (results.json) are each read raw in one module, and everything else asks that
module's typed reader (``RunDir``, ``ExportInfo``, ``Manifest``, ``EvalReport``). Checked by
scanning the sources, as tests/test_layout.py does for imports: a JSON read (``json.load(s)``,
``read_json``, ``read_json_object``) in a function that names one of these files, by its name or by
the owner's constant for it, must be in that file's owner."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("cll_scale", "scripts", "bench", "data_tools", "demo")
OWNERS = {
    "config.json": "cll_scale/training/rundir.py",
    "export.json": "cll_scale/model/export.py",
    "manifest.json": "cll_scale/data/manifest.py",
    "results.json": "cll_scale/evaluation/report.py",
}
READS = {"load", "loads", "read_json", "read_json_object"}


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def owner_constants() -> dict[tuple[str, str], str]:
    """(owner module, constant) -> file name, for each owner's module-level ``NAME = "<file>"``."""
    out = {}
    for name, owner in OWNERS.items():
        for node in ast.parse((ROOT / owner).read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value == name:
                out.update({(_module(owner), t.id): name for t in node.targets if isinstance(t, ast.Name)})
    return out


def _is_read(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):       # json.load / json.loads / jsonfiles.read_json_object
        return f.attr in READS and not (f.attr in ("load",) and not (isinstance(f.value, ast.Name) and f.value.id == "json"))
    return isinstance(f, ast.Name) and f.id in READS - {"load", "loads"}


def _what_is_read(source: str, scope: ast.AST, read: ast.Call) -> str:
    """The text of the read's argument, with the assignments of the names in it (three deep):
    ``json.load(open(path))`` after ``path = out / "results.json"`` reads results.json."""
    if not read.args:
        return ""
    assigned: dict[str, list[ast.AST]] = {}
    for node in ast.walk(scope):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        assigned.setdefault(name.id, []).append(node.value)
    parts, todo, seen = [], list(read.args[:1]), set()
    for _ in range(4):
        nxt = []
        for node in todo:
            parts.append(ast.get_source_segment(source, node) or "")
            for name in ast.walk(node):
                if isinstance(name, ast.Name) and name.id not in seen:
                    seen.add(name.id)
                    nxt += assigned.get(name.id, [])
        todo = nxt
    return "\n".join(parts)


def raw_reads(source: str, constants: dict[tuple[str, str], str]) -> list[tuple[int, str]]:
    """(line, file name) of every JSON read of a file that has an owner, in ``source``: what the read
    opens (its argument, and what the names in it were assigned in its function) names the file
    or the owner's constant for it."""
    tree = ast.parse(source)
    imported = {alias.asname or alias.name: constants[(node.module, alias.name)]
                for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
                for alias in node.names if (node.module, alias.name) in constants}
    innermost = {}

    def visit(node: ast.AST, scope: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_read(child):
                innermost[child] = scope
            visit(child, child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope)
    visit(tree, tree)
    found = []
    for read, scope in innermost.items():
        text = _what_is_read(source, scope, read)
        named = {name for name in OWNERS if re.search(rf"(?<![\w-]){re.escape(name)}", text)}   # not model_config.json
        named |= {name for const, name in imported.items() if re.search(rf"\b{const}\b", text)}
        found += [(read.lineno, name) for name in sorted(named)]
    return sorted(found)


def test_every_owned_format_is_read_raw_by_its_owner_alone():
    constants = owner_constants()
    assert set(constants.values()) >= {"export.json", "manifest.json", "config.json"}, constants
    outside = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, name in raw_reads(path.read_text(encoding="utf-8"), constants):
                if OWNERS[name] != rel:
                    outside.append(f"{rel}:{line} reads {name} (its owner: {OWNERS[name]})")
    assert not outside, outside


def test_no_shell_script_reads_an_owned_format_as_json():
    """The scripts' shell lines that call Python (``python -c "...json.load..."``) go through the owners too."""
    bad = [f"{p.relative_to(ROOT)}:{i}" for top in SCANNED for p in sorted((ROOT / top).rglob("*.sh"))
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
           if re.search(r"json\.loads?\(", line) and any(name in line for name in OWNERS)]
    assert not bad, bad


def test_the_scan_sees_a_raw_read_and_lets_the_owners_reader_pass():
    constants = owner_constants()
    raw = ('import json\nfrom cll_scale.data.manifest import MANIFEST\n'
           'def a(run):\n    return json.loads((run / "config.json").read_text())["train"]\n'
           'def b(d):\n    return read_json_object(d / MANIFEST)\n'
           'def c(out):\n    path = out / "results.json"\n    return json.load(open(path))\n')
    assert raw_reads(raw, constants) == [(4, "config.json"), (6, "manifest.json"), (9, "results.json")]
    typed = ('from cll_scale.training.rundir import RunDir\nfrom cll_scale.evaluation.report import EvalReport\n'
             'def a(run):\n    return RunDir(run).config()["train"]\n'
             'def c(out):\n    return EvalReport.load(out / "results.json")\n')
    assert raw_reads(typed, constants) == []


def test_a_run_directory_reads_through_rundir_under_todays_names(tmp_path):
    """RunDir reads config.json with its settings' old names upgraded (a run of before the
    sections), its metrics, and which export its evaluation uses."""
    from cll_scale.training.rundir import BEST_EXPORT, RunDir
    run = RunDir(tmp_path)
    assert not run.has_config() and run.config() == {} and run.metrics() == []
    (tmp_path / "config.json").write_text('{"train": {"lr": 0.002, "max_steps": 7}, "data": {"max_tokens": 512}}')
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 3.5}\n{"step": 2, "valid_nll": 3.0}\n')
    config = run.config()
    assert config["optim"]["lr"] == 0.002 and "lr" not in config["train"] and config["train"]["max_steps"] == 7
    assert config["data"] == {"batch_tokens": 512}
    assert [row["step"] for row in run.metrics()] == [1, 2]
    assert run.export() == tmp_path / "export"
    (tmp_path / BEST_EXPORT).mkdir()
    (tmp_path / BEST_EXPORT / "export.json").write_text("{}")
    assert run.export() == tmp_path / BEST_EXPORT


def test_export_info_reads_export_json_with_its_upgrade_and_refuses_a_bad_one(tmp_path):
    import pytest
    from cll_scale.model.export import ExportError, ExportInfo
    assert not ExportInfo.exists(tmp_path)
    with pytest.raises(ExportError, match="no export.json"):
        ExportInfo.load(tmp_path)
    (tmp_path / "export.json").write_text('{"step": 40, "run_dir": "runs/a", "sha256": {"spm.model": "ab"}}')
    info = ExportInfo.load(tmp_path)          # an export of before lang_tag was recorded: trained with tags
    assert (info.step, info.run_dir, info.lang_tag, info.sha256, info.best, info.pretrain) == \
        (40, "runs/a", True, {"spm.model": "ab"}, {}, None)
    (tmp_path / "export.json").write_text('{"lang_tag": "no", "sha256": {}}')
    with pytest.raises(ExportError, match="lang_tag must be true or false"):
        ExportInfo.load(tmp_path)
