"""The Gradio demo, driven through gradio_client and a real headless Chromium."""
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cll_scale.langid import Lingua, detect
from tests.conftest import ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_export, multi30k):
    from demo.app import build_parser, launch
    port = free_port()
    args = build_parser().parse_args(["--model", f"baseline={tiny_export}", "--model", f"fcll={tiny_export}",
                                      "--examples", str(multi30k), "--port", str(port), "--max-chars", "300",
                                      "--concurrency", "2"])
    app = launch(args, block=False)
    yield f"http://127.0.0.1:{port}/", app
    app.close()


def test_demo_environment_and_binding(server):
    """The app itself switches gradio's and the hub's outside calls off (checked in a process
    whose environment has none of these variables), and the running server is on loopback with
    no share link (as gradio reports them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADIO_", "HF_"))}
    res = subprocess.run([sys.executable, "-c", "import os, demo.app; print(os.environ['GRADIO_ANALYTICS_ENABLED'], "
                          "os.environ['HF_HUB_OFFLINE'], os.environ['HF_HUB_DISABLE_TELEMETRY'])"],
                         cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.split() == ["False", "1", "1"], res.stderr[-2000:]
    _, app = server
    from urllib.parse import urlparse
    assert urlparse(app.local_url).hostname == "127.0.0.1" and not getattr(app, "share_url", None)


def test_translate_gives_one_output_per_model_with_right_flags(server):
    from gradio_client import Client
    client = Client(server[0], verbose=False)
    out = client.predict("Ein Mann fährt Fahrrad.", "de", "fr", False, api_name="/translate")
    assert len(out) == 4                                        # (output, info) × 2 models
    for hyp, info in (out[0:2], out[2:4]):
        assert "de→fr: zero-shot" in info
        off = detect(hyp, ["en", "cs", "de", "fr"]) != "fr"
        assert ("OFF-TARGET" in info) == off                     # the flag follows the detector
        assert f"lingua: `{Lingua(['en', 'cs', 'de', 'fr']).detect_many([hyp])[0]}`" in info   # and lingua's beside
    sup = client.predict("A man rides a bike.", "en", "de", False, api_name="/translate")
    assert "en→de: supervised" in sup[1]
    long = client.predict("x" * 301, "de", "fr", False, api_name="/translate")
    assert long[0] == "" and "Input too long" in long[1] and "300" in long[1]


def test_fifty_concurrent_requests_are_all_answered(server):
    from gradio_client import Client
    client = Client(server[0], verbose=False)
    jobs = [client.submit(f"Ein Hund Nummer {i}.", "de", "en", False, api_name="/translate") for i in range(50)]
    results = [job.result(timeout=300) for job in jobs]
    assert len(results) == 50 and all(len(r) == 4 for r in results)


def test_real_browser_translates_and_stays_local(server, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"Chromium not installed at {CHROMIUM} (.ci/run installs Debian's chromium)")
    from playwright.sync_api import sync_playwright
    requests = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run"])  # playwright makes a fresh profile dir
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("request", lambda r: requests.append(r.url))
        page.goto(server[0], wait_until="networkidle")
        target = page.get_by_label("target language").first
        target.click()
        target.fill("de")
        target.press("Enter")
        page.get_by_label("source text").first.fill("Un homme fait du vélo.")
        page.get_by_role("button", name="Translate", exact=True).click()
        for name in ("baseline", "fcll"):
            page.wait_for_function(f"document.querySelector('#out-{name} textarea')?.value.length > 0", timeout=120_000)
            assert page.locator(f"#out-{name} textarea").input_value().strip()
        info = page.locator("#info-fcll").inner_text()
        assert "fr→de" in info or "→de" in info
        page.screenshot(path=str(tmp_path / "demo.png"), full_page=True)
        browser.close()
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    hosts = {r.split("/")[2] for r in requests if r.startswith("http")}
    assert hosts == {server[0].split("/")[2]}, hosts              # nothing outside 127.0.0.1


def test_hostile_text_through_the_demo(server):
    """Reliability item 7 for the demo: every input gets an answer or a message."""
    from gradio_client import Client
    from tests.test_reliability import HOSTILE
    client = Client(server[0], verbose=False)
    for text in HOSTILE:
        out = client.predict(text, "de", "fr", False, api_name="/translate")
        assert len(out) == 4 and all(isinstance(x, str) for x in out), repr(text)
        if len(text) > 300:
            assert out[0] == "" and "Input too long" in out[1]
        elif not text.strip():
            assert out[0] == "" and out[2] == ""


def test_listens_on_loopback_only_by_default(server):
    """Reliability item 8: the socket itself is bound to 127.0.0.1, not just the printed URL."""
    import psutil
    from demo.app import build_parser
    port = int(server[0].rstrip("/").rsplit(":", 1)[1])
    listening = [c.laddr for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    assert build_parser().parse_args(["--model", "m=x"]).host == "127.0.0.1"


def test_tampered_model_is_refused_and_nothing_is_pickled(tiny_export, tmp_path, capsys):
    from demo.app import main
    assert sorted(p.name for p in tiny_export.iterdir()) == [
        "export.json", "manifest.json", "model.safetensors", "model_config.json", "spm.model"]
    bad = tmp_path / "export"
    shutil.copytree(tiny_export, bad)
    weights = bytearray((bad / "model.safetensors").read_bytes())
    weights[-7] ^= 0x01
    (bad / "model.safetensors").write_bytes(bytes(weights))
    assert main(["--model", f"fcll={bad}", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "refusing to load" in err
