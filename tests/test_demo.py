"""The Gradio demo, driven through gradio_client and a real headless Chromium."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cll_scale.evaluation.langid import Lingua, detect
from cll_scale.training.collectives import free_port
from tests.conftest import ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


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


@pytest.mark.integration
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
    out = client.predict("Ein Mann fährt Fahrrad.", "de", "fr", False, False, api_name="/translate")
    assert len(out) == 4                                        # (output, info) × 2 models
    for hyp, info in (out[0:2], out[2:4]):
        assert "de→fr: zero-shot" in info
        off = detect(hyp, ["en", "cs", "de", "fr"]) != "fr"
        assert ("OFF-TARGET" in info) == off                     # the flag follows the detector
        assert f"lingua: `{Lingua(['en', 'cs', 'de', 'fr']).detect_many([hyp])[0]}`" in info   # and lingua's beside
    sup = client.predict("A man rides a bike.", "en", "de", False, False, api_name="/translate")
    assert "en→de: supervised" in sup[1]
    long = client.predict("x" * 301, "de", "fr", False, False, api_name="/translate")
    assert long[0] == "" and "Input too long" in long[1] and "300" in long[1]


def test_omitting_the_tag_feeds_the_model_without_it(server, tiny_export):
    """The Table 8 switch: the demo's output is the Translator's with the tag omitted, the line
    under it says so, and the input ids really lose the tag."""
    from gradio_client import Client
    from cll_scale.evaluation.translator import Translator
    t = Translator.load(tiny_export)
    text = "Ein Mann fährt Fahrrad."
    assert t.encode(text, "fr", omit_tag=True) == t.encode(text, "fr")[1:]
    out = Client(server[0], verbose=False).predict(text, "de", "fr", False, True, api_name="/translate")
    assert out[0] == t.translate([text], "fr", omit_tag=True)[0]
    assert "language tag omitted" in out[1] and "language tag omitted" in out[3]


def why_rows(table: str) -> list[tuple[str, float, float | None]]:
    import re
    rows = []
    for row in re.findall(r'<tr class="why-row">(.*?)</tr>', table):
        token = re.search(r'<td class="why-token">(.*?)</td>', row).group(1)
        values = [None if v == "–" else float(v) for v in re.findall(r'<td class="why-value">([^ <]+)', row)]
        rows.append((token, *values))
    return rows


def test_why_view_gives_each_tokens_ffn_and_lsl_attribution(server, tiny_export):
    """The "why this language?" view shows, per output token, the FFN's and the LSL's
    attribution summed over the layers: the numbers of cll_scale.analysis.attribution on the same model and
    steps; the central language (en) has no LSL and says so; bad requests get a message."""
    from gradio_client import Client
    from cll_scale.analysis.attribution import attribute, prepare
    from cll_scale.evaluation.translator import Translator
    client = Client(server[0], verbose=False)
    text = "Ein Mann fährt Fahrrad."
    info, table = client.predict(text, "de", "fr", "fcll", 6, False, api_name="/why")
    t = Translator.load(tiny_export)
    expected = attribute(t.model, prepare(t, text, "fr"), n_steps=6, components=("ffn2", "lsl2"))
    rows = why_rows(table)
    assert len(rows) == len(expected.example.tgt_pieces)
    assert [r[1] for r in rows] == pytest.approx(expected.per_token("ffn2"), abs=2e-3)
    assert [r[2] for r in rows] == pytest.approx(expected.per_token("lsl2"), abs=2e-3)
    assert expected.example.tgt_text in info and f"{expected.max_abs_delta():.3f}" in info
    raised = sum(v > 0 for v in expected.per_token("lsl2"))
    assert f"The LSLs raised {raised} of {len(rows)} tokens" in info
    _, central = client.predict(text, "de", "en", "fcll", 4, False, api_name="/why")
    assert all(r[2] is None for r in why_rows(central))
    info, table = client.predict("x" * 301, "de", "fr", "fcll", 4, False, api_name="/why")
    assert "Input too long" in info and table == ""
    with pytest.raises(Exception, match="less than minimum value 2"):     # the slider's own bound
        client.predict(text, "de", "fr", "fcll", 1, False, api_name="/why")


def test_fifty_concurrent_requests_are_all_answered(server):
    from gradio_client import Client
    client = Client(server[0], verbose=False)
    jobs = [client.submit(f"Ein Hund Nummer {i}.", "de", "en", False, False, api_name="/translate") for i in range(50)]
    results = [job.result(timeout=300) for job in jobs]
    assert len(results) == 50 and all(len(r) == 4 for r in results)
    for r in results:                 # each request got both models' translations and their lines
        assert r[0].strip() and r[2].strip() and "de→en" in r[1] and "de→en" in r[3], r


@pytest.mark.integration
def test_real_browser_translates_and_stays_local(server, multi30k, tmp_path):
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
        # make demo opens on a zero-shot example, filled in (issue 52): one click shows the problem
        firsts = {(multi30k / f"test_2016_flickr.{x}").read_text(encoding="utf-8").splitlines()[0]
                  for x in ("de", "fr", "cs", "en")}
        assert page.locator("#source-text textarea").input_value() in firsts
        page.get_by_role("button", name="Translate", exact=True).click()
        page.wait_for_function("document.querySelector('#info-fcll')?.innerText.includes('zero-shot')",
                               timeout=120_000)
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
        # The "why this language?" view: one table row per output token, FFN and LSL numbers.
        page.get_by_role("tab", name="Why this language?").click()
        page.get_by_label("sentence to explain").fill("Un homme fait du vélo.")
        page.get_by_role("button", name="Explain", exact=True).click()
        page.wait_for_function("document.querySelectorAll('#why-table .why-row').length > 0", timeout=120_000)
        assert "LSLs raised" in page.locator("#why-info").inner_text()
        cells = page.locator("#why-table .why-row").first.locator(".why-value").all_inner_texts()
        assert len([float(c.split()[0]) for c in cells]) == 2          # FFN and LSL (de has one), both numbers
        page.screenshot(path=str(tmp_path / "why.png"), full_page=True)
        browser.close()
    assert (tmp_path / "demo.png").stat().st_size > 10_000 and (tmp_path / "why.png").stat().st_size > 10_000
    hosts = {r.split("/")[2] for r in requests if r.startswith("http")}
    assert hosts == {server[0].split("/")[2]}, hosts              # nothing outside 127.0.0.1


def test_hostile_text_through_the_demo(server):
    """Reliability item 7 for the demo: every input gets an answer or a message."""
    from gradio_client import Client
    from tests.test_reliability import HOSTILE
    client = Client(server[0], verbose=False)
    for text in HOSTILE:
        out = client.predict(text, "de", "fr", False, False, api_name="/translate")
        assert len(out) == 4 and all(isinstance(x, str) for x in out), repr(text)
        if len(text) > 300:
            assert out[0] == "" and "Input too long" in out[1]
        elif not text.strip():
            assert out[0] == "" and out[2] == "" and "(empty output)" in out[1]
        else:                         # an answer line under each model, whatever it wrote
            assert "de→fr" in out[1] and "de→fr" in out[3], (repr(text), out)


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


# -- issue 51, class E: the Batch tab ---------------------------------------------------------------

@pytest.fixture(scope="module")
def two_conditions(tiny_export, triangle_export):
    """The demo of the issue: `fcll` trained on the triangle (de, fr, cs), `cbase` centered on en."""
    from demo.app import Demo
    return Demo({"fcll": str(triangle_export[0]), "cbase": str(tiny_export)})


def batch_file(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def read_tsv(path: str) -> list[list[str]]:
    import csv
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.reader(f, delimiter="\t"))


def test_batch_says_per_model_which_cannot_translate_into_the_target(two_conditions, tmp_path):
    """Issue 51 #26: target `en`, which `fcll` lacks. The batch is not lost: `cbase` is translated
    as always, and `fcll`'s row and TSV column say, naming the model and the language, that it
    cannot translate into `en`, in the words of the Translate tab."""
    demo = two_conditions
    fcll, cbase = demo.translators["fcll"], demo.translators["cbase"]
    assert "en" not in fcll.languages and "en" in cbase.languages
    lacks = f"fcll cannot translate into en (it knows {', '.join(fcll.languages)})"
    lines = ["Ein Hund rennt.", "Eine Katze schläft auf dem Sofa."]
    table, path = demo.batch(batch_file(tmp_path / "src.txt", lines), None, "en")
    assert "| fcll | – | – |" in table and f"**{lacks}**" in table
    assert any(row.startswith("| cbase | ") and "%" in row for row in table.splitlines())
    assert read_tsv(path) == [["source", "fcll", "cbase"],
                              *([line, lacks, hyp] for line, hyp in zip(lines, cbase.translate(lines, "en")))]
    translated = demo.translate(lines[0], "de", "en")        # the Translate tab: the same words
    assert translated[:2] == ["", f"**{lacks}**"] and "de→en" in translated[3]


def test_batch_tsv_reads_back_exactly_whatever_the_lines_hold(two_conditions, tmp_path):
    """Issue 51 #27: a line with a tab (or a quote) stays one field: a `csv.reader` with
    delimiter tab gets back each input line and each model's output, three fields a row."""
    demo = two_conditions
    lines = ["Ein Hund\trennt.", 'Er sagt "Hallo".', '"', "Eine Katze."]
    _, path = demo.batch(batch_file(tmp_path / "src.txt", lines), None, "fr")
    outputs = {name: t.translate(lines, "fr") for name, t in demo.translators.items()}
    assert read_tsv(path) == [["source", "fcll", "cbase"],
                              *([line, outputs["fcll"][i], outputs["cbase"][i]] for i, line in enumerate(lines))]


def test_why_without_steps_takes_the_default(tiny_export):
    """Issue 66: `why(..., steps=None)` (a cleared steps box sends None) raised TypeError; it now
    integrates with the default steps, and a step count that is no number gets a message."""
    from demo.app import WHY_STEPS, Demo
    demo = Demo({"fcll": str(tiny_export)})
    info, table = demo.why("Ein Mann fährt Fahrrad.", "de", "fr", "fcll", steps=None)
    assert f"{WHY_STEPS} steps" in info and 'class="why-row"' in table
    info, table = demo.why("Ein Mann fährt Fahrrad.", "de", "fr", "fcll", steps="many")
    assert "integration steps must be a whole number" in info and table == ""
