"""``docs/demo.png`` and ``docs/demo-why.png`` from real models: start ``cll-demo`` on the
exports, open it in the headless Chromium the demo's browser test uses, and save the page as it
opens (the first zero-shot test sentence translated by every model, each output's detected
language in colour, each model's measured zero-shot off-target rate from ``--results``). From the
models ``make quickstart`` trained:

    .venv/bin/python scripts/demo_screenshot.py \\
        --model baseline=runs/quickstart/runs/multi30k-triangle-quickstart-baseline/export-best \\
        --model fcll=runs/quickstart/runs/multi30k-triangle-quickstart-fcll/export-best \\
        --results runs/quickstart/results/triangle-quickstart --why-out docs/demo-why.png

``--why-out`` also saves the "Why this language?" tab for the last model (the CLL one) on the same
sentence. To show another sentence: ``--text`` with ``--direction``, or let it be chosen from the
hypotheses files that ``cll-eval`` / ``cll-repro`` wrote (nothing is decoded to choose it): the
first test sentence on which the first model answers in the wrong language and the others in the
requested one,

    .venv/bin/python scripts/demo_screenshot.py --model baseline=... --model fcll=... \\
        --hyps docs/results/triangle-seeds/hyps/test_2016_flickr --hyps-names baseline_seed1,fcll_seed1 \\
        --data runs/study/shards/multi30k-triangle --split test_2016_flickr --direction de-cs

The sentence shown and each model's output and its language are printed, so the caption under
the screenshot can say what it shows.
"""
from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cll_scale.core.cli import csv_list  # noqa: E402
from cll_scale.training.collectives import free_port  # noqa: E402
from cll_scale.evaluation.langid import Lingua, detect  # noqa: E402
from cll_scale.data.languages import Direction  # noqa: E402
from cll_scale.data.manifest import Manifest  # noqa: E402


def choose(models: list[str], hyps: Path, data: Path, split: str, direction: Direction,
           shortest: int, longest: int, stored: list[str] | None = None) -> tuple[str, dict[str, str]]:
    """The first source sentence (``shortest``..``longest`` characters) whose output from the first
    model is off-target and from every other model on target (langdetect restricted to the
    model's languages, the paper's measure), wholly: lingua finds no run of another language in
    it, so a code-switched output that langdetect happens to call on target is not shown as
    the phenomenon. ``stored``: the models' names in the hypotheses folder, where they differ
    from the names shown."""
    m = Manifest.load(data)
    sources = m.read_direction(data, split, direction, ["src_text"]).column("src_text").to_pylist()
    outputs = {name: (hyps / folder / "default" / f"{direction}.txt").read_text().splitlines()
               for name, folder in zip(models, stored or models)}
    first, *others = models
    lingua = Lingua(m.languages)
    for i, src in enumerate(sources[:min(map(len, outputs.values()))]):
        if not shortest <= len(src) <= longest:
            continue
        langs = {name: detect(outputs[name][i], m.languages) for name in models}
        if langs[first] != direction.tgt and all(langs[o] == direction.tgt for o in others) and \
                all({lang for lang, _ in lingua.spans(outputs[o][i])} == {direction.tgt} for o in others):
            return src, {name: f"{outputs[name][i]}  [{langs[name]}]" for name in models}
    raise SystemExit(f"no sentence of {split} {direction} is off-target for {first} and on target for "
                     f"{', '.join(others)}; pass --text")


def screenshot(models: list[str], args, text: str, direction: Direction) -> None:
    from playwright.sync_api import sync_playwright
    port = free_port()
    cmd = [sys.executable, "-m", "demo", "--port", str(port), "--max-chars", "300",
           *(a for spec in args.model for a in ("--model", spec)),
           *(a for path in args.results for a in ("--results", path))]
    if args.examples:
        cmd += ["--examples", args.examples]
    server = subprocess.Popen(cmd, cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}/"
        # The server listens once its models are loaded and the first example translated by each.
        deadline = time.monotonic() + args.wait
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if server.poll() is not None:
                raise SystemExit(f"cll-demo exited with {server.returncode}")
            if time.monotonic() > deadline:
                raise SystemExit(f"cll-demo did not listen within {args.wait} s (--wait)")
            time.sleep(0.5)
        chromium = shutil.which("chromium") or "/usr/bin/chromium"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(url, wait_until="networkidle")
            if text is not None:          # else the page as it opens: its first example, translated
                for label, lang in (("source language", direction.src), ("target language", direction.tgt)):
                    box = page.get_by_label(label).first
                    box.click()
                    box.fill(lang)
                    box.press("Enter")
                page.get_by_label("source text").first.fill(text)
                page.get_by_role("button", name="Translate", exact=True).click()
            for name in models:
                page.wait_for_function(f"document.querySelector('#out-{name} textarea')?.value.length > 0",
                                       timeout=300_000)
            # The outputs arrive before gradio drops its "pending" veil over them.
            page.wait_for_function("document.querySelectorAll('.pending').length == 0", timeout=60_000)
            page.wait_for_timeout(1000)
            page.screenshot(path=str(args.out), full_page=False)
            print(f"shown: {page.locator('#source-text textarea').input_value()}")
            for name in models:
                print(f"  {name}: {page.locator(f'#out-{name} textarea').input_value()}")
                print(f"    {page.locator(f'#info-{name}').inner_text()}")
                print(f"    {page.locator(f'#rate-{name}').inner_text()}")
            if args.why_out:
                why(page, models[-1], text, direction, args.why_out)
            browser.close()
    finally:
        server.terminate()
        server.wait()


def why(page, model: str, text: str | None, direction: Direction | None, out: Path) -> None:
    """The "Why this language?" tab for ``model`` (the last one, the CLL model) on the same sentence
    (the tab opens on the first example, as the Translate tab does)."""
    page.get_by_role("tab", name="Why this language?").click()
    fields = [("model to explain", model)]
    if text is not None:
        fields += [("language of the sentence", direction.src), ("language to translate into", direction.tgt)]
    for label, value in fields:
        box = page.get_by_label(label).first
        box.click()
        box.fill(value)
        box.press("Enter")
    if text is not None:
        page.get_by_label("sentence to explain").fill(text)
    page.get_by_role("button", name="Explain", exact=True).click()
    page.wait_for_function("document.querySelectorAll('#why-table .why-row').length > 0", timeout=300_000)
    page.wait_for_function("document.querySelectorAll('.pending').length == 0", timeout=60_000)
    page.wait_for_timeout(1000)
    page.screenshot(path=str(out), full_page=True)
    print(f"wrote {out}: {page.locator('#why-info').inner_text()}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, metavar="NAME=EXPORT_DIR",
                   help="the first one is the model shown off-target (the Baseline)")
    p.add_argument("--direction", type=Direction.parse,
                   help="a zero-shot direction, e.g. de-cs, for --text or --hyps; without them the page as it "
                        "opens, on the first zero-shot example")
    p.add_argument("--results", action="append", default=[], metavar="PATH",
                   help="cll-demo --results: where the models' zero-shot off-target rates were measured "
                        "(e.g. runs/quickstart/results/triangle-quickstart)")
    p.add_argument("--text", help="the sentence to type; otherwise chosen from --hyps, or the page's first example")
    p.add_argument("--hyps", type=Path, help="hyps/<split> directory that cll-eval or cll-repro wrote")
    p.add_argument("--data", type=Path, help="the shard directory the hypotheses were decoded from")
    p.add_argument("--hyps-names", type=csv_list,
                   help="the models' folders under --hyps, in --model order, where they are not the names "
                        "shown (cll-repro --seeds stores 'baseline seed1' as baseline_seed1)")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--chars", type=int, nargs=2, default=(40, 90), metavar=("MIN", "MAX"),
                   help="length of the sentence chosen, in characters")
    p.add_argument("--examples", default=str(ROOT.parent / "shared" / "data" / "multi30k"),
                   help="cll-demo --examples (empty: none)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "demo.png")
    p.add_argument("--wait", type=int, default=900, help="seconds to wait for cll-demo to start listening")
    p.add_argument("--why-out", type=Path, help="also the 'Why this language?' tab for the last model "
                                                "(e.g. docs/demo-why.png)")
    args = p.parse_args(argv)
    models = [spec.split("=", 1)[0] for spec in args.model]
    if (args.text is not None or args.hyps is not None) and args.direction is None:
        p.error("--text and --hyps need --direction")
    if args.text is None and args.hyps is not None:
        if args.data is None:
            p.error("--hyps needs --data, the shard directory the hypotheses were decoded from")
        if args.hyps_names and len(args.hyps_names) != len(models):
            p.error(f"--hyps-names names {len(args.hyps_names)} folders for {len(models)} models")
        args.text, outputs = choose(models, args.hyps, args.data, args.split, args.direction, *args.chars,
                                    stored=args.hyps_names)
        print(f"chosen: {args.text}")
        for name, out in outputs.items():
            print(f"  {name}: {out}")
    screenshot(models, args, args.text, args.direction)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
