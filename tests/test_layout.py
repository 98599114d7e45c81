"""The package's architecture, written down once (here; the README's layout section shows the same
list): the folders of ``cll_scale`` are layers, and a module imports only from its own layer or the
ones below it. Checked twice: statically on every import of every module, including the imports
inside functions, and at run time, by importing each layer in a fresh interpreter and looking at
what ``sys.modules`` holds. Also the shape the orchestration keeps (issue 36): a Trainer that fits
on a few screens, short functions, cll-repro as small modules, one DeepSpeed door."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Bottom to top. A module may import its own layer and the layers above it in this list, never one
# below it. ``cll_scale`` stands for the modules at the package's top: the console scripts.
LAYERS = (
    ("cll_scale.core", "settings helpers, outputs, the error path, compatibility shims, hardware"),
    ("cll_scale.data", "languages, manifest, model input, stream, corpora, tokenizer, shards"),
    ("cll_scale.model", "ModelConfig and presets, the CLL Transformer, decoding, export, bf16"),
    ("cll_scale.evaluation", "Translator, test sets, scoring, language ID, evaluator, report, plots"),
    ("cll_scale.training", "engine (DeepSpeed), collectives, precision, optim, metrics, checkpoints, validator"),
    ("cll_scale.run", "the recipe layer above the components, build_run, the Trainer, the dry run"),
    ("cll_scale.loops", "fine-tuning, back-translation, new-language extension"),
    ("cll_scale.analysis", "paper §5: attribution and attention"),
    ("cll_scale.repro", "cll-repro's studies"),
    ("cll_scale", "the commands: cll-train, cll-translate, cll-eval, cll-bt, cll-extend, cll-analyze, cll-export"),
)
NAMES = [name for name, _ in LAYERS]

# The reaches up that no import shows: a module that starts another one as a process
# (``python -m target``). Each is drawn here, with why; any other is refused like an import up.
PROCESS_REACHES = {
    ("cll_scale.repro.scheduler", "data_tools"): "cll-repro builds a study's shards with cll-shards",
    ("cll_scale.repro.scheduler", "cll_scale.train"): "cll-repro trains each model with cll-train, in its own process",
}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The index in LAYERS of the innermost layer that holds ``module``."""
    return NAMES.index(max((name for name in NAMES if module == name or module.startswith(name + ".")), key=len))


def imports_of(path: Path) -> set[str]:
    """Every cll_scale / data_tools module ``path`` imports, anywhere in it (``from a import b``
    counts as a.b when a.b is a module)."""
    out = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (ROOT / (sub.replace(".", "/") + ".py")).is_file() or \
                    (ROOT / sub.replace(".", "/") / "__init__.py").is_file()
                out.add(sub if is_module else node.module)
        elif isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
    return {m for m in out if m.split(".")[0] in ("cll_scale", "data_tools", "demo")}


def package_modules(root: str = "cll_scale") -> list[Path]:
    return sorted((ROOT / root).rglob("*.py"))


def test_every_module_sits_in_a_layer_and_the_top_holds_only_commands():
    top = sorted(p.name for p in (ROOT / "cll_scale").glob("*.py"))
    assert top == ["__init__.py", "analyze.py", "backtranslate.py", "evaluate.py", "export.py", "extend.py",
                   "train.py", "translate.py"], top
    for path in (ROOT / "cll_scale").glob("*.py"):
        if path.name != "__init__.py":
            assert re.search(r"^def main\(argv", path.read_text(encoding="utf-8"), re.M), f"{path.name} has no main()"
    folders = sorted(p.name for p in (ROOT / "cll_scale").iterdir() if (p / "__init__.py").is_file())
    assert sorted(folders) == sorted(n.split(".")[1] for n in NAMES if n != "cll_scale")
    # the root package holds the version alone: it is loaded with any module, so it imports nothing
    assert imports_of(ROOT / "cll_scale" / "__init__.py") == set()


def test_no_import_runs_up_a_layer():
    """A module of layer i imports layers <= i only (the lazy imports inside functions too)."""
    up = [f"{path.relative_to(ROOT)} imports {target}" for path in package_modules()
          for target in imports_of(path) if target.startswith("cll_scale") and target != "cll_scale"
          and layer_of(target) > layer_of(_module(path))]
    assert not up, up


def started_modules(path: Path) -> set[str]:
    """The modules ``path`` starts as processes: each ``"-m", "<module>"`` pair in a list or tuple."""
    out = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            out |= {target for flag, target in zip(items, items[1:]) if flag == "-m" and isinstance(target, str)}
    return out


def looked_up_modules(path: Path) -> set[str]:
    """The modules ``path`` takes from ``sys.modules`` by name (an import that the import test
    cannot see)."""
    out = set()
    for node in ast.walk(_tree(path)):
        target = node.value if isinstance(node, ast.Subscript) else node.func.value \
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" else None
        key = node.slice if isinstance(node, ast.Subscript) else node.args[0] if target is not None and node.args else None
        if (isinstance(target, ast.Attribute) and target.attr == "modules" and isinstance(target.value, ast.Name)
                and target.value.id == "sys" and isinstance(key, ast.Constant) and isinstance(key.value, str)):
            out.add(key.value)
    return out


def test_no_process_or_module_lookup_reaches_up_a_layer_unless_drawn():
    """``python -m`` and ``sys.modules[...]`` reach a module without importing it: each one up a
    layer, or into data_tools, is either in PROCESS_REACHES or refused; and each drawn reach is
    still there (a list that outlives its code would hide the next one)."""
    found = set()
    for path in package_modules():
        module = _module(path)
        for target in started_modules(path) | looked_up_modules(path):
            ours = target.split(".")[0] in ("cll_scale", "data_tools", "demo")
            up = ours and (not target.startswith("cll_scale") or layer_of(target) > layer_of(module))
            if up:
                found.add((module, target))
    assert found == set(PROCESS_REACHES), found ^ set(PROCESS_REACHES)


def test_the_reach_detectors_see_what_they_look_for(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('import sys\ncmd = [sys.executable, "-m", "data_tools", "build"]\n'
                     'm = sys.modules.get("cll_scale.training.collectives")\nn = sys.modules["cll_scale.run"]\n')
    assert started_modules(probe) == {"data_tools"}
    assert looked_up_modules(probe) == {"cll_scale.training.collectives", "cll_scale.run"}


def test_the_settings_helpers_are_a_leaf_and_cll_scale_never_imports_data_tools_or_demo():
    assert imports_of(ROOT / "cll_scale" / "core" / "settings.py") == set()
    assert imports_of(ROOT / "cll_scale" / "core" / "compat.py") == set()
    back = [f"{p.relative_to(ROOT)} imports {t}" for p in package_modules() for t in imports_of(p)
            if t.split(".")[0] in ("data_tools", "demo")]
    assert not back, back


def test_the_modules_import_each_other_without_a_circle():
    graph = {_module(p): {t for t in imports_of(p) if t.startswith("cll_scale")} for p in package_modules()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in state and (cycle := visit(nxt, path + [node])):
                return cycle
        state[node] = 2
        return None
    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            assert cycle is None, " -> ".join(cycle[cycle.index(cycle[-1]):])


_PROBE = """
import importlib, json, pkgutil, sys
layer = sys.argv[1]
pkg = importlib.import_module(layer)
names = [layer + "." + m.name for m in pkgutil.iter_modules(pkg.__path__)
         if m.name != "__main__" and (layer != "cll_scale" or not m.ispkg)]
for name in names:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by(layer: str) -> set[str]:
    """What importing every module of ``layer`` loads, in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", _PROBE, layer], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.integration
@pytest.mark.parametrize("layer", [name for name in NAMES if name != "cll_scale"])
def test_importing_a_layer_loads_nothing_above_it(layer):
    """The static test sees imports; this one sees what they pull in at run time, through every
    chain of modules: nothing of a higher layer, and below the training layer neither DeepSpeed nor
    the engine (the repro layer neither: a study plans and reads runs, cll-train trains them)."""
    modules = loaded_by(layer)
    ours = {m for m in modules if m.startswith("cll_scale.") and m not in NAMES}
    above = sorted(m for m in ours if layer_of(m) > NAMES.index(layer))
    assert not above, above
    if layer_of(layer) < NAMES.index("cll_scale.training") or layer == "cll_scale.repro":
        assert not [m for m in modules if m.split(".")[0] == "deepspeed" or m == "cll_scale.training.engine"], layer


def test_the_trainer_is_small_and_every_function_is_short():
    trainer = next(n for n in _tree(ROOT / "cll_scale" / "run" / "trainer.py").body
                   if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    assert _lines(trainer) <= 160
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({_lines(node)} lines)"
            for path in package_modules() for node in ast.walk(_tree(path))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _lines(node) > 60]
    assert not long, long


def test_repro_is_a_package_of_small_modules():
    modules = sorted((ROOT / "cll_scale" / "repro").glob("*.py"))
    assert len(modules) >= 6
    for path in modules:
        assert len(path.read_text(encoding="utf-8").splitlines()) < 250, path.name


def test_deepspeed_is_reached_through_the_engine_alone_and_the_engine_keeps_no_checkpoint_protocol():
    for path in package_modules():
        names = {alias.name for node in ast.walk(_tree(path)) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module or "" for node in ast.walk(_tree(path)) if isinstance(node, ast.ImportFrom)}
        if any(n == "deepspeed" or n.startswith("deepspeed.") for n in names):
            assert path.relative_to(ROOT).as_posix() == "cll_scale/training/engine.py", path
    engine = (ROOT / "cll_scale" / "training" / "engine.py").read_text(encoding="utf-8")
    for protocol in ("cll_meta", "keep_last", "checkpoint_problem", "write_atomic", "resumable_tag",
                     "host_all_reduce", "on_rank0"):
        assert protocol not in engine, protocol


def test_the_readme_draws_the_same_layers():
    """The README's layout section lists the layers in this order, so the two never disagree."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Layout"):]
    section = section[:section.index("\n## ", 4)]
    drawn = re.findall(r"^\s*cll_scale/(\w+)/", section, re.M)
    assert drawn == [n.split(".")[1] for n in NAMES if n != "cll_scale"][::-1], drawn
