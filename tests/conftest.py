"""Shared fixtures. Tests never touch the network: the offline switches are set before any
Hugging Face / gradio import, and corpora come from ../shared/data or are written here."""
import ast
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import contextlib  # noqa: E402
import fcntl  # noqa: E402
import importlib  # noqa: E402
import io  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# `make test` runs the suite on two workers (pytest-xdist, `-n 2`): a worker is one of two processes
# on two cores, so it and everything it starts use one thread, as two DeepSpeed ranks sharing the
# cores do (docs/usage.md). A plain `pytest` is one process and keeps the machine's threads.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("CLL_SHARED_DATA", ROOT.parent / "shared" / "data"))
MULTI30K = SHARED_DATA / "multi30k"
OPUS_SAMPLE = SHARED_DATA / "opus100_format_samples"


def sigint_state() -> tuple:
    """Ctrl-C's handler in this process, and whether this thread blocks it."""
    return signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def pytest_configure(config):
    if WORKER:
        import torch
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def session_root(basetemp: Path) -> Path:
    """The folder every worker of this session shares: xdist gives worker gwN the basetemp
    <session's basetemp>/gwN; in one process it is the basetemp itself."""
    return Path(basetemp).parent if WORKER else Path(basetemp)


@contextlib.contextmanager
def machine_share(config, whole: bool):
    """A test marked `whole_machine` runs while no other test does: it takes an exclusive lock
    that every other test holds shared. The gate, held by a waiting exclusive test, keeps the other
    worker from starting test after test ahead of it."""
    root = session_root(config.option.basetemp)
    with open(root / "machine.gate", "a") as gate, open(root / "machine.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if whole else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.hookimpl(tryfirst=True)           # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """On workers, the `whole_machine` tests go last, as one xdist group (one worker runs them one
    after another while the other finishes its own): with `--dist loadgroup --no-loadscope-reorder`
    the work is handed out in this order, so no test waits long for the machine."""
    if not WORKER:
        return
    whole = [item for item in items if item.get_closest_marker("whole_machine")]
    for item in whole:
        item.add_marker(pytest.mark.xdist_group("whole_machine"))
    items[:] = [item for item in items if not item.get_closest_marker("whole_machine")] + whole


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of each test under the machine's lock (on workers only)."""
    if not WORKER:
        return (yield)
    with machine_share(item.config, item.get_closest_marker("whole_machine") is not None):
        return (yield)


def built_once(tmp_path_factory, name: str, build) -> Path:
    """``build(path)`` run once for the session, however many workers ask (the others wait for it,
    then read what it wrote); the fixtures that train a model or build shards use it, so two workers
    do not each spend the time. What is built here is read, never changed: a test that changes it
    works on a copy."""
    root = session_root(tmp_path_factory.getbasetemp()) / "built-once"
    root.mkdir(exist_ok=True)
    out, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)           # what a failed attempt left
            build(out)
            done.touch()
    return out


RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_world_left_in_the_environment():
    """A test whose in-process command leaves a one-process world's rendezvous variables in the
    environment fails, with the environment restored: every process a later test starts would
    inherit rank 0 of a world of 1 and a port that may still be listening (EADDRINUSE)."""
    before = {k: os.environ.get(k) for k in RENDEZVOUS}
    yield
    now = {k: os.environ.get(k) for k in RENDEZVOUS}
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    assert now == before, f"the test left the rendezvous variables {now} (before: {before})"


@pytest.fixture(autouse=True)
def ctrl_c_left_as_found():
    """A test that leaves Ctrl-C blocked or its handler changed in the test process fails, with the
    state restored: a later test (the Ctrl-C ones in test_std_streams.py) would otherwise fail for
    it, and a command that did the same would ignore Ctrl-C."""
    handler, blocked = before = sigint_state()
    yield
    now = sigint_state()
    signal.signal(signal.SIGINT, handler)
    signal.pthread_sigmask(signal.SIG_BLOCK if blocked else signal.SIG_UNBLOCK, {signal.SIGINT})
    assert now == before, f"the test left SIGINT {'blocked' if now[1] else 'unblocked'} with handler {now[0]!r}"


def run_cli(main, argv, capsys):
    """Run a console script's main(argv) in-process; return (exit code, stdout, stderr)."""
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# The console scripts by the module `python -m` runs (setup.py's entry points): the in-process
# tests name a command as the spawning ones do, so a test moves between the tiers unchanged.
COMMANDS = {
    "data_tools": "data_tools.cli",
    "cll_scale.train": "cll_scale.train",
    "cll_scale.translate": "cll_scale.translate",
    "cll_scale.evaluate": "cll_scale.evaluate",
    "cll_scale.repro": "cll_scale.repro.cli",
    "cll_scale.backtranslate": "cll_scale.backtranslate",
    "cll_scale.extend": "cll_scale.extend",
    "cll_scale.analyze": "cll_scale.analyze",
    "demo": "demo.app",
}


def command(module: str, *argv, stdin: str | bytes | None = None) -> subprocess.CompletedProcess:
    """``python -m module argv`` run in this process, as the finished process it would be: the exit
    code (argparse's and sys.exit's SystemExit included: a usage error is 2), and what the command
    wrote to sys.stdout and sys.stderr (text), ``stdin`` its standard input. What it writes through
    a stream it bound before the call (a logging handler) is not there: a test of that is an
    integration test."""
    main = importlib.import_module(COMMANDS[module]).main
    argv = [str(a) for a in argv]
    out, err, before = io.StringIO(), io.StringIO(), sys.stdin
    if stdin is not None:          # with its bytes underneath, as a real one has (sys.stdin.buffer)
        raw = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        sys.stdin = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as stop:
                if isinstance(stop.code, str):    # sys.exit("text"): the interpreter prints it and exits 1
                    print(stop.code, file=sys.stderr)
                    code = 1
                else:
                    code = stop.code
    finally:
        sys.stdin = before
    return subprocess.CompletedProcess([module, *argv], code or 0, out.getvalue(), err.getvalue())


@pytest.fixture()
def cmd():
    """:func:`command`, for a test that runs console commands in process: ``cmd(module, *argv,
    stdin=text)``."""
    return command


@pytest.fixture(scope="session")
def multi30k() -> Path:
    if not (MULTI30K / "train.en").is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K} (set CLL_SHARED_DATA)")
    return MULTI30K


@pytest.fixture(scope="session")
def m30k_centered(multi30k, tmp_path_factory) -> Path:
    """Real Multi30k, centered on English: the shard directory most tests read."""
    from cll_scale.data.shards import BuildConfig, build_shards
    from cll_scale.data.corpora import read_multiway
    return built_once(tmp_path_factory, "m30k-centered",
                      lambda out: build_shards(read_multiway(multi30k, "centered"), BuildConfig(out_dir=str(out))))


def head_corpus(multi30k: Path, out: Path, keep, lines: int = 300) -> Path:
    """The first ``lines`` lines of the Multi30k files for which ``keep(file_name)`` holds."""
    out.mkdir(parents=True)
    for f in multi30k.iterdir():
        if keep(f.name):
            head = f.read_text(encoding="utf-8").splitlines()[:lines]
            (out / f.name).write_text("\n".join(head) + "\n", encoding="utf-8")
    return out


@pytest.fixture()
def small_multiway(multi30k, tmp_path) -> Path:
    """The first 300 lines of each Multi30k file: real text, quick to build."""
    return head_corpus(multi30k, tmp_path / "small", lambda name: name.startswith(("train.", "val.")))


sys.path.insert(0, str(ROOT))


def train_in_process(*argv) -> None:
    """cll-train in this process, for a fixture's model. The training makes a one-process world and
    takes it, and its variables, down again."""
    res = command("cll_scale.train", *argv)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.fixture(scope="session")
def tiny_export(m30k_centered, tmp_path_factory) -> Path:
    """A `tiny` FCLL model trained for a few steps through cll-train (in process) and exported."""
    def train(run):
        train_in_process("--data", m30k_centered, "--preset", "tiny", "--run-dir", run, "--max-steps", "15",
                         "--ds-config", "cpu_fp32.json", "--set", "valid.every=1000",
                         "--set", "data.batch_tokens=1024", "--set", "optim.lr=3e-3", "--set", "optim.warmup_steps=5")
    return built_once(tmp_path_factory, "tiny", train) / "export"


@pytest.fixture(scope="session")
def triangle_export(multi30k, tmp_path_factory) -> tuple[Path, Path]:
    """A second real model, on other languages (de, fr, cs) than `tiny_export` (en, de, fr, cs),
    and its shards; trained once for the session, in process (the misuse and demo tests share it)."""
    from cll_scale.data.shards import BuildConfig, build_shards
    from cll_scale.data.corpora import read_multiway

    def build(root):
        corpus = head_corpus(multi30k, root / "corpus", lambda name: name.split(".")[-1] in ("de", "fr", "cs"))
        build_shards(read_multiway(corpus, "triangle", ["de", "fr", "cs"]),
                     BuildConfig(out_dir=str(root / "shards"), vocab_size=800))
        train_in_process("--data", root / "shards", "--preset", "tiny", "--run-dir", root / "run", "--max-steps", "3",
                         "--ds-config", "cpu_fp32.json", "--set", "log.every=1", "--set", "valid.every=1000",
                         "--set", "data.batch_tokens=1024", "--set", "optim.lr=3e-3", "--set", "optim.warmup_steps=10")
    root = built_once(tmp_path_factory, "tri", build)
    return root / "run" / "export", root / "shards"


def console_scripts() -> dict[str, str]:
    """name -> module, as setup.py declares them."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    entry = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "entry_points"))
    return {line.split("=")[0]: line.split("=")[1].split(":")[0] for line in entry["console_scripts"]}
