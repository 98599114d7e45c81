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
def measured_report(tiny_export, m30k_centered, tmp_path_factory) -> Path:
    """A cll-repro report directory that holds the tiny model's cached evaluation (three sentences a
    direction, greedy), written by cll-repro's own evaluation step on a run whose export is a copy
    of ``tiny_export``: the demo finds it by the export, not by where it lies."""
    from cll_scale.repro.evaluations import EvalSettings, Evaluations
    root = tmp_path_factory.mktemp("study")
    shutil.copytree(tiny_export, root / "run" / "export")
    Evaluations(EvalSettings(("test_2016_flickr",), beam=1, max_sentences=3), m30k_centered, root / "report", None
                ).of("tiny", root / "run")
    return root / "report"


def cached_entry(report: Path, name: str = "tiny"):
    """The entry of ``name`` in the report's cached evaluation, read as cll-repro reads it."""
    from cll_scale.evaluation.report import ModelEntry
    from cll_scale.repro.evaluations import cached_evaluation
    return ModelEntry.from_json(cached_evaluation(report, name, "test_2016_flickr")["entries"][name])


@pytest.fixture(scope="module")
def server(tiny_export, multi30k, measured_report):
    from demo.app import launch
    from demo.cli import build_parser
    port = free_port()
    args = build_parser().parse_args(["--model", f"baseline={tiny_export}", "--model", f"fcll={tiny_export}",
                                      "--examples", str(multi30k), "--port", str(port), "--max-chars", "300",
                                      "--concurrency", "2", "--results", str(measured_report)])
    app = launch(args, block=False)
    yield f"http://127.0.0.1:{port}/", app
    app.close()


def component(app, elem_id: str):
    return next(b for b in app.blocks.values() if getattr(b, "elem_id", None) == elem_id)


def first_example(multi30k: Path, translator) -> list[str]:
    from demo.app import load_examples
    return load_examples(str(multi30k), translator.languages, translator.manifest.zero_shot)[0]


def test_the_page_opens_on_the_first_example_translated_with_each_models_measured_rate(server, tiny_export, multi30k,
                                                                                      measured_report):
    """Before any click the Translate tab holds the first zero-shot example, every model's output
    of it (the Translator's), the line with its detected language in colour, and under it the
    zero-shot off-target rate of the model's cached cll-repro evaluation, found by its export."""
    from cll_scale.evaluation.translator import Translator
    _, app = server
    t = Translator.load(tiny_export)
    text, src, tgt = first_example(multi30k, t)
    assert component(app, "source-text").value == text
    hyp = t.translate([text], tgt)[0]
    off = detect(hyp, t.languages) != tgt
    entry = cached_entry(measured_report)
    for name in ("baseline", "fcll"):
        assert component(app, f"out-{name}").value == hyp
        info = component(app, f"info-{name}").value
        assert f"{src}→{tgt}: zero-shot" in info and ('class="lang-off"' in info) == off
        assert ('class="lang-on"' in info) == (not off)
        rate = component(app, f"rate-{name}").value
        assert f"{entry.average('zero-shot', 'off_target'):.1f}%" in rate, rate
        assert f"{entry.average('zero-shot', 'off_target_restricted'):.1f}% restricted" in rate
        zero = [d for d in entry.directions if d.kind == "zero-shot"]
        assert f"{sum(d.n for d in zero):,} sentences in {len(zero)} zero-shot directions, beam 1" in rate
        assert "matched by its export" in rate


def test_measured_rates_are_found_by_export_or_by_name_and_otherwise_not_measured(
        tiny_export, triangle_export, measured_report, m30k_centered, tmp_path, capsys):
    """A cll-repro report gives the rate of the export it evaluated, whatever the model is called
    here, and none to another export; a cll-eval output gives the rate of the entry named as the
    model; a model no --results holds is "not measured"; a --results that is neither is refused
    before any model loads."""
    from cll_scale.evaluate import main as cll_eval
    from cll_scale.evaluation.report import EvalReport
    from demo.app import measured_text, read_measured
    from demo.cli import main
    found = read_measured([str(measured_report)], {"any name": str(tiny_export), "tri": str(triangle_export[0])})
    entry = cached_entry(measured_report)
    assert [m.off_target for m in found["any name"]] == [entry.average("zero-shot", "off_target")]
    assert found["tri"] == [] and "not measured" in measured_text(found["tri"])
    out = tmp_path / "eval"
    assert cll_eval(["--model", f"cbase={tiny_export}", "--data", str(m30k_centered), "--split", "test_2016_flickr",
                     "--directions", "de-fr,fr-de,en-de", "--max-sentences", "2", "--beam", "1",
                     "--lid-workers", "0", "--out", str(out)]) == 0
    report = EvalReport.load(out / "results.json")
    found = read_measured([str(out)], {"cbase": str(tiny_export), "other": str(tiny_export)})
    (m,) = found["cbase"]
    assert (m.off_target, m.restricted, m.sentences, m.directions, m.matched) == (
        report.models["cbase"].average("zero-shot", "off_target"),
        report.models["cbase"].average("zero-shot", "off_target_restricted"), 4, 2, "its name")
    assert found["other"] == [] and f"{m.off_target:.1f}%" in measured_text(found["cbase"])
    capsys.readouterr()
    assert main(["--model", f"fcll={tiny_export}", "--results", str(tmp_path / "nothing"),
                 "--port", str(free_port())]) != 0
    assert "--results" in capsys.readouterr().err


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
        assert ('class="lang-off"' in info) == off and ('class="lang-on"' in info) == (not off)   # its colour too
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
def test_real_browser_translates_and_stays_local(server, multi30k, tiny_export, measured_report, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"Chromium not installed at {CHROMIUM} (.ci/run installs Debian's chromium)")
    from playwright.sync_api import sync_playwright
    from cll_scale.evaluation.translator import Translator
    t = Translator.load(tiny_export)
    text, _, tgt = first_example(multi30k, t)
    hyp = t.translate([text], tgt)[0]
    colour = "rgb(198, 40, 40)" if detect(hyp, t.languages) != tgt else "rgb(46, 125, 50)"     # red off, green on
    rate = f"{cached_entry(measured_report).average('zero-shot', 'off_target'):.1f}%"
    requests = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run"])  # playwright makes a fresh profile dir
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("request", lambda r: requests.append(r.url))
        page.goto(server[0], wait_until="networkidle")
        # The page opens on the first zero-shot example with both outputs there, no click: each
        # with its detected language in colour, and the model's measured rate under it.
        assert page.locator("#source-text textarea").input_value() == text
        for name in ("baseline", "fcll"):
            assert page.locator(f"#out-{name} textarea").input_value() == hyp
            lang = page.locator(f"#info-{name} .lang-on, #info-{name} .lang-off")
            assert lang.count() == 1 and lang.evaluate("e => getComputedStyle(e).color") == colour
            assert f"measured zero-shot off-target: {rate}" in page.locator(f"#rate-{name}").inner_text()
        page.screenshot(path=str(tmp_path / "opening.png"))
        # Another sentence and target: each output becomes the Translator's for them.
        target = page.get_by_label("target language").first
        target.click()
        target.fill("de")
        target.press("Enter")
        page.get_by_label("source text").first.fill("Un homme fait du vélo.")
        page.get_by_role("button", name="Translate", exact=True).click()
        expected = t.translate(["Un homme fait du vélo."], "de")[0]
        for name in ("baseline", "fcll"):
            page.wait_for_function("a => document.querySelector(a[0])?.value === a[1]",
                                   arg=[f"#out-{name} textarea", expected], timeout=120_000)
        page.wait_for_function("document.querySelector('#info-fcll')?.innerText.includes('→de')", timeout=60_000)
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
    assert all((tmp_path / f).stat().st_size > 10_000 for f in ("opening.png", "demo.png", "why.png"))
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
    from demo.cli import build_parser
    port = int(server[0].rstrip("/").rsplit(":", 1)[1])
    listening = [c.laddr for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    assert build_parser().parse_args(["--model", "m=x"]).host == "127.0.0.1"


def test_tampered_model_is_refused_and_nothing_is_pickled(tiny_export, tmp_path, capsys):
    from demo.cli import main
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
