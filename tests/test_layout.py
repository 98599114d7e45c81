"""The shape the orchestration keeps (issue 36): a Trainer that fits on a few screens, short
functions, cll-repro as a package of small modules, engine.py as DeepSpeed's door only, and no
module of ours importing DeepSpeed but engine.py. Static checks: nothing runs."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def test_the_trainer_is_small_and_every_function_is_short():
    trainer = next(n for n in _tree(ROOT / "cll_scale" / "run" / "trainer.py").body
                   if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    assert _lines(trainer) <= 160
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({_lines(node)} lines)"
            for path in sorted((ROOT / "cll_scale").rglob("*.py")) for node in ast.walk(_tree(path))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _lines(node) > 60]
    assert not long, long


def test_repro_is_a_package_of_small_modules_that_never_starts_an_engine():
    modules = sorted((ROOT / "cll_scale" / "repro").glob("*.py"))
    assert len(modules) >= 6
    for path in modules:
        assert len(path.read_text(encoding="utf-8").splitlines()) < 250, path.name
        imported = {node.module for node in ast.walk(_tree(path)) if isinstance(node, ast.ImportFrom)}
        assert "cll_scale.training.engine" not in imported and "cll_scale.run.trainer" not in imported, path.name


def test_deepspeed_is_reached_through_engine_py_alone_and_engine_py_keeps_no_checkpoint_protocol():
    for path in sorted((ROOT / "cll_scale").rglob("*.py")):
        names = {alias.name for node in ast.walk(_tree(path)) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module or "" for node in ast.walk(_tree(path)) if isinstance(node, ast.ImportFrom)}
        if any(n == "deepspeed" or n.startswith("deepspeed.") for n in names):
            assert path.relative_to(ROOT).as_posix() == "cll_scale/training/engine.py", path
    engine = (ROOT / "cll_scale" / "training" / "engine.py").read_text(encoding="utf-8")
    for protocol in ("cll_meta", "keep_last", "checkpoint_problem", "write_atomic", "resumable_tag"):
        assert protocol not in engine, protocol
