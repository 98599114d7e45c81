"""The Gradio app of ``cll-demo`` (the command, its flags and its usage: :mod:`demo.cli`): Baseline
and CLL models side by side on zero-shot directions, and the "Why this language?" view."""
from __future__ import annotations

import os

# Before gradio is imported, or it (and huggingface_hub) contact outside hosts at import and launch.
for _key, _value in (("GRADIO_ANALYTICS_ENABLED", "False"), ("HF_HUB_OFFLINE", "1"),
                     ("HF_HUB_DISABLE_TELEMETRY", "1"), ("HF_DATASETS_OFFLINE", "1")):
    os.environ.setdefault(_key, _value)

import copy  # noqa: E402
import csv  # noqa: E402
import hashlib  # noqa: E402
import html  # noqa: E402
import threading  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from functools import lru_cache  # noqa: E402
from pathlib import Path  # noqa: E402

import sacrebleu  # noqa: E402

from cll_scale.core.cli import parse_models, pick_device  # noqa: E402
from cll_scale.core.jsonfiles import read_json_object  # noqa: E402
from cll_scale.evaluation.langid import Lingua, detect  # noqa: E402
from cll_scale.data.languages import Direction  # noqa: E402
from cll_scale.data.manifest import UNSEEN  # noqa: E402
from cll_scale.evaluation.evaluator import LSL_OFF, TAG_OMITTED  # noqa: E402
from cll_scale.evaluation.report import EvalReport, ModelEntry  # noqa: E402
from cll_scale.evaluation.translator import Translator  # noqa: E402
from demo.cli import MAX_CHARS  # noqa: E402

# Integration steps of the "why" view: 12 keeps a `small` model's answer to a few seconds on
# a CPU thread, with a convergence delta around 0.02 nats; the slider allows up to 32.
WHY_STEPS, MAX_WHY_STEPS = 12, 32
WHY_COMPONENTS = ("ffn2", "lsl2")      # the FFN's and the LSL's whole outputs: Fig. 5's two rows


def direction_kind(translator: Translator, src: str, tgt: str) -> str:
    kind = translator.manifest.kind(Direction(src, tgt))
    return "unseen in training" if kind == UNSEEN else kind


def cannot_translate(name: str, translator: Translator, tgt: str) -> str | None:
    """Why model ``name`` has no output in ``tgt``, or None when it knows ``tgt``: the one wording of
    every tab (Translate, Why, Batch) and of the Batch tab's TSV, which is why it is plain text."""
    if tgt in translator.languages:
        return None
    return f"{name} cannot translate into {tgt} (it knows {', '.join(translator.languages)})"


@lru_cache(maxsize=8)
def lingua_for(languages: tuple[str, ...]) -> Lingua:
    return Lingua(list(languages))


# The detected language's colour: the same green and red as the "why" view's bars. The class
# names are what the browser test and a stylesheet find; the inline colour needs no stylesheet.
ON_TARGET, OFF_TARGET = ("lang-on", "#2e7d32"), ("lang-off", "#c62828")


def coloured(text: str, kind: tuple[str, str]) -> str:
    css_class, colour = kind
    return f'<span class="{css_class}" style="color:{colour};font-weight:600">{text}</span>'


def describe(translator: Translator, output: str, src: str, tgt: str) -> str:
    """The line under each output: detected language, green on target and red off target
    (langdetect decides, restricted to the model's languages; lingua's verdict beside it), and
    the training badge."""
    kind = direction_kind(translator, src, tgt)
    badge = f"**{src}→{tgt}: {kind}** in this model's training data"
    if not output:
        return f"{badge} · (empty output)"
    lang = detect(output, translator.languages)
    second = f"lingua: `{lingua_for(tuple(translator.languages)).detect_many([output])[0]}`"
    if lang is None:                # no letters to judge: not the requested language either
        return (coloured("OFF-TARGET: no language detected in the output", OFF_TARGET)
                + f" ({second}), `{tgt}` was requested · {badge}")
    if lang != tgt:
        return (coloured(f"OFF-TARGET: output detected as `{lang}`", OFF_TARGET)
                + f" ({second}), `{tgt}` was requested · {badge}")
    return coloured(f"on target: detected `{lang}`", ON_TARGET) + f" ({second}) · {badge}"


@dataclass(frozen=True)
class Measured:
    """A model's zero-shot off-target rate in one evaluation, and where it was read."""
    test_set: str
    off_target: float           # % of zero-shot outputs not in the target language, plain langdetect (the paper's)
    restricted: float           # % with the decision restricted to the model's languages
    sentences: int
    directions: int
    beam: int
    source: str                 # the file it was read from
    matched: str                # how the model was found in it: "its export" or "its name"

    def line(self) -> str:
        return (f"**measured zero-shot off-target: {self.off_target:.1f}%** (langdetect, the paper's measure; "
                f"{self.restricted:.1f}% restricted to its languages) on {self.test_set}, {self.sentences:,} "
                f"sentences in {self.directions} zero-shot direction{'s' * (self.directions != 1)}, beam {self.beam} · "
                f"`{self.source}`, "
                f"matched by {self.matched}")


def measured_of(entry: ModelEntry, test_set: str, beam: int, source: Path, matched: str) -> Measured | None:
    """The zero-shot figures of a report entry (None when it scored no zero-shot direction)."""
    zero = [d for d in entry.directions if d.kind == "zero-shot"]
    off, restricted = entry.average("zero-shot", "off_target"), entry.average("zero-shot", "off_target_restricted")
    if not zero or off is None or restricted is None:
        return None
    return Measured(test_set, off, restricted, sum(d.n for d in zero), len(zero), beam, str(source), matched)


def default_entry(entries: dict[str, ModelEntry]) -> ModelEntry | None:
    """The entry of the model as trained: not the LSLs-off or tag-omitted one beside it."""
    return next((e for key, e in entries.items() if not key.endswith((LSL_OFF, TAG_OMITTED))), None)


def export_identity(export: Path) -> str | None:
    """The identity cll-repro records for an export it evaluated, the sha256 of its export.json
    (which holds every file's sha256; :func:`cll_scale.repro.records.export_id`), wherever the
    export lies now; None when there is none to read."""
    manifest = export / "export.json"
    return hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None


def read_measured(results: list[str], models: dict[str, str]) -> dict[str, list[Measured]]:
    """Each model's measured zero-shot off-target rates, from every ``--results`` path:
    a cll-repro report directory, whose cached evaluations (``evaluated/<split>/<model>.json``,
    :mod:`cll_scale.repro.evaluations`) record the export they scored, so a model is found by its
    export whatever it is called; or a cll-eval ``--out`` directory or any evaluation report JSON
    (:class:`EvalReport`), whose entries are found by the model's ``--model`` name."""
    found: dict[str, list[Measured]] = {name: [] for name in models}
    ids = {name: export_identity(Path(path)) for name, path in models.items()}
    for given in map(Path, results):
        if (given / "evaluated").is_dir():
            for cached in sorted((given / "evaluated").glob("*/*.json")):
                record = read_json_object(cached)
                entry = default_entry({k: ModelEntry.from_json(v) for k, v in record.get("entries", {}).items()})
                settings = record.get("settings", {})
                for name in models:
                    if entry is not None and ids[name] is not None and settings.get("export") == ids[name]:
                        m = measured_of(entry, cached.parent.name, settings.get("beam"), cached, "its export")
                        found[name] += [m] if m else []
            continue
        path = given / "results.json" if given.is_dir() else given
        if not path.is_file():
            raise FileNotFoundError(2, "--results: neither a cll-repro report directory (with evaluated/) nor "
                                       "a cll-eval output (results.json)", str(given))
        report = EvalReport.load(path)
        for name in models:
            if name in report.models:
                m = measured_of(report.models[name], report.test_set, report.beam, path, "its name")
                found[name] += [m] if m else []
    return found


def measured_text(measured: list[Measured]) -> str:
    """The lines under a model's output: each measured rate, or "not measured"."""
    if not measured:
        return ("**measured zero-shot off-target: not measured** (no evaluation of this model was given: "
                "`--results`)")
    return "\n\n".join(m.line() for m in measured)


def load_examples(path: str | None, languages: list[str], zero_shot: list[str], n: int = 2) -> list[list[str]]:
    """A few test sentences of each zero-shot direction from a multi-way directory."""
    if not path:
        return []
    out = []
    for d in zero_shot:
        src, tgt = Direction.parse(d)
        f = Path(path) / f"test_2016_flickr.{src}"
        if f.is_file() and src in languages and tgt in languages:
            for line in f.read_text(encoding="utf-8").splitlines()[:n]:
                out.append([line, src, tgt])
    return out


class Demo:
    def __init__(self, models: dict[str, str], device: str = "cpu", max_chars: int = MAX_CHARS,
                 results: list[str] = ()):
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, not {max_chars}: every request would be refused")
        # Read before any model loads: a bad --results path fails in a second, not after the loading.
        self.measured = read_measured(list(results), models)
        from cll_scale.model.decode_config import DecodeConfig
        from cll_scale.evaluation.translator import TranslateConfig
        self.translators = {name: Translator.load(path, device, TranslateConfig(DecodeConfig()))
                            for name, path in models.items()}
        self.max_chars = max_chars
        langs: list[str] = []
        for t in self.translators.values():
            langs += [x for x in t.languages if x not in langs]
        self.languages = langs

        # The "why" view attributes on its own copy of each model, one request at a time per
        # model: Captum's hooks on the copy never reach a translation running beside it.
        self._why_models: dict[str, object] = {}
        self._why_locks = {name: threading.Lock() for name in self.translators}

    def too_long(self, text: str) -> str | None:
        if len(text) > self.max_chars:
            return f"**Input too long**: {len(text):,} characters; the demo accepts at most {self.max_chars:,}."
        return None

    def translate(self, text: str, src: str, tgt: str, lsl_off: bool = False, omit_tag: bool = False) -> list[str]:
        """Flat list: output and description for each model, in order. ``omit_tag`` removes the
        language tag from the input of the models trained with it (paper Table 8); a model
        trained without tags is fed as always, and the line under its output says so."""
        text = text or ""
        if msg := self.too_long(text):
            return [item for _ in self.translators for item in ("", msg)]
        out = []
        for name, t in self.translators.items():
            if lacks := cannot_translate(name, t, tgt):
                out += ["", f"**{lacks}**"]
                continue
            hyp = t.translate([text], tgt, use_lsl=not lsl_off, omit_tag=omit_tag and t.lang_tag)[0]
            note = ""
            if omit_tag:
                note = (" · language tag omitted from the input" if t.lang_tag
                        else " · trained without language tags: its input never has one")
            out += [hyp, describe(t, hyp, src, tgt) + note]
        return out

    def why(self, text: str, src: str, tgt: str, name: str, steps: int | None = WHY_STEPS,
            omit_tag: bool = False) -> tuple[str, str]:
        """The "why this language?" view: the model ``name`` translates ``text`` into ``tgt``,
        then integrated gradients (paper Fig. 5; :func:`cll_scale.analysis.attribution.attribute`) give, per
        output token, how much the FFNs' and the LSLs' outputs (``ffn2``, ``lsl2``, summed over
        the decoder layers) raised or lowered that token's log-probability. Returns a markdown
        summary and an HTML table, one row per output token."""
        from cll_scale.analysis.attribution import attribute, prepare
        text = (text or "").strip()
        if msg := self.too_long(text):
            return msg, ""
        if name not in self.translators:
            return f"**unknown model `{name}`**; choose one of {', '.join(self.translators)}", ""
        t = self.translators[name]
        if lacks := cannot_translate(name, t, tgt):
            return f"**{lacks}**", ""
        if not text:
            return "Type a sentence to explain.", ""
        try:           # a cleared slider or number box sends None or "": the default then
            steps = WHY_STEPS if steps in (None, "") else int(steps)
        except (TypeError, ValueError):
            return f"**integration steps must be a whole number 2-{MAX_WHY_STEPS}**, not {steps!r}", ""
        if not 2 <= steps <= MAX_WHY_STEPS:
            return f"**integration steps must be 2-{MAX_WHY_STEPS}**, not {steps}", ""
        with self._why_locks[name]:
            model = self._why_models.get(name)
            if model is None:
                model = self._why_models[name] = copy.deepcopy(t.model).float()
            ex = prepare(t, text, tgt, omit_tag=omit_tag and t.lang_tag)
            result = attribute(model, ex, n_steps=steps, components=WHY_COMPONENTS)
        return why_summary(name, t, result, src, steps), why_table(result)

    def batch(self, file, refs, tgt: str, lsl_off: bool = False) -> tuple[str, str | None]:
        """Translate an uploaded file with every model; off-target rate and, with references, BLEU.
        A model that lacks ``tgt`` says so in its row and its column, as on the Translate tab; the
        others are still translated. The TSV beside the upload is written by ``csv`` (excel-tab):
        a tab, quote or line break inside a sentence or an output is quoted, not a new column."""
        if file is None:
            return "Upload a text file (one sentence per line).", None
        lines = Path(file).read_text(encoding="utf-8", errors="replace").split("\n")
        lines = lines[:-1] if lines and lines[-1] == "" else lines
        too_long = [i + 1 for i, x in enumerate(lines) if len(x) > self.max_chars]
        if too_long:
            return f"**Lines too long**: {too_long[:5]} exceed {self.max_chars:,} characters.", None
        references = None
        if refs:
            references = Path(refs).read_text(encoding="utf-8", errors="replace").split("\n")
            references = references[:-1] if references and references[-1] == "" else references
            if len(references) != len(lines):     # a BLEU over misaligned lines would be meaningless
                return (f"**References do not match the sentences**: {len(lines):,} sentence lines but "
                        f"{len(references):,} reference lines; upload files with one line per sentence each."), None
        rows = ["| model | off-target | BLEU |", "|---|---:|---:|"]
        notes, columns = [], {}
        for name, t in self.translators.items():
            if lacks := cannot_translate(name, t, tgt):
                rows.append(f"| {name} | – | – |")
                notes.append(f"**{lacks}**")
                columns[name] = [lacks] * len(lines)
                continue
            hyps = t.translate(lines, tgt, use_lsl=not lsl_off)
            off = sum(detect(h, t.languages) != tgt for h in hyps if h) / max(1, sum(1 for h in hyps if h))
            bleu = f"{sacrebleu.corpus_bleu(hyps, [references]).score:.2f}" if references else "– (no references)"
            rows.append(f"| {name} | {100 * off:.1f}% | {bleu} |")
            columns[name] = hyps
        out = Path(file).with_suffix(".translations.tsv")
        with out.open("w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, dialect="excel-tab")    # its \r\n ends rows, so a lone \r is quoted too
            writer.writerow(["source", *columns])
            writer.writerows([src, *(columns[n][i] for n in columns)] for i, src in enumerate(lines))
        return "\n\n".join(["\n".join(rows), *notes]), str(out)

    def t_plot(self):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        weights = {n: t.model.t_weights() for n, t in self.translators.items() if t.model.cfg.cll_layers}
        fig, ax = plt.subplots(figsize=(5, 3))
        for name, per_lang in weights.items():
            for lang, values in per_lang.items():
                ax.plot(range(1, len(values) + 1), values, "o-", label=f"{name}: {lang}")
        ax.set_xlabel("CLL layer")
        ax.set_ylabel("learned t_l")
        if weights:
            ax.legend(fontsize=7)
        fig.tight_layout()
        return fig


def why_summary(name: str, translator: Translator, result, src: str, steps: int) -> str:
    """The lines above the "why" table: the output, what the numbers mean, and how many tokens
    the LSLs raised, and against the FFN."""
    ex = result.example
    ffn, lsl = result.per_token("ffn2"), result.per_token("lsl2")
    lines = [f"**{name}**, {src}→{ex.tgt_lang} ({direction_kind(translator, src, ex.tgt_lang)}): {ex.tgt_text}",
             "Per output token, summed over the decoder layers: how much the FFN and the LSL raised (> 0) or "
             "lowered (< 0) the log-probability of the token the model wrote (integrated gradients, paper "
             f"Fig. 5; {steps} steps, largest convergence delta {result.max_abs_delta():.3f} nats)."]
    if lsl is None:
        why_not = ("it has no CLL layers" if not translator.model.cfg.cll_layers
                   else f"`{ex.tgt_lang}` is its central language, which has no LSL")
        lines.append(f"No LSL acts here: {why_not}; only the FFN's share is shown.")
    else:
        raised = sum(v > 0 for v in lsl)
        against = sum(a * b < 0 for a, b in zip(ffn, lsl))
        lines.append(f"The LSLs raised {raised} of {len(lsl)} tokens; on {against} their sign is opposite to the FFN's.")
    if not ex.lang_tag:
        lines.append("The input has no language tag" + (" (omitted)." if translator.lang_tag else
                                                        " (the model was trained without tags)."))
    return "\n\n".join(lines)


def why_table(result) -> str:
    """One row per output token: the piece, the FFN's and the LSL's attribution, each with a bar
    (green raises, red lowers) scaled to the largest value of the sentence."""
    ffn, lsl = result.per_token("ffn2"), result.per_token("lsl2")
    pieces = result.example.tgt_pieces
    scale = max((abs(v) for v in [*ffn, *(lsl or [])]), default=0.0) or 1.0

    def cell(value: float | None) -> str:
        if value is None:
            return '<td class="why-value">–</td>'
        width = round(60 * abs(value) / scale)
        colour = "#2e7d32" if value >= 0 else "#c62828"
        return (f'<td class="why-value">{value:+.3f} <span style="display:inline-block;width:{width}px;'
                f'height:0.7em;background:{colour}"></span></td>')

    rows = [f'<tr class="why-row"><td class="why-token">{html.escape(piece.replace(chr(0x2581), " ").strip() or piece)}'
            f"</td>{cell(f)}{cell(None if lsl is None else lsl[i])}</tr>" for i, (piece, f) in enumerate(zip(pieces, ffn))]
    return ('<table id="why-table"><thead><tr><th>output token</th><th>FFN</th><th>LSL</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def build_app(demo: Demo, examples_dir: str | None = None):
    import gradio as gr
    first = next(iter(demo.translators.values()))
    zero_shot = first.manifest.zero_shot
    examples = load_examples(examples_dir, demo.languages, zero_shot)
    # The page opens on the first zero-shot example, already translated by every model (once, here):
    # the contrast is there before any click.
    if examples:
        default = examples[0][1:]
        opening = demo.translate(examples[0][0], *default)
    else:
        default = list(Direction.parse(zero_shot[0])) if zero_shot else demo.languages[:2]
        opening = [""] * (2 * len(demo.translators))
    with gr.Blocks(title="cll-scale: Baseline vs CLL") as app:
        gr.Markdown("# cll-scale: zero-shot translation, Baseline vs Central Language-aware Layers\n"
                    "On a **zero-shot** direction (no parallel data in training) a Baseline often answers in the "
                    "wrong language (*off-target*). Below, a zero-shot test sentence as each model translated it, "
                    "the language detected in each output (green: the one requested; red: another), and each "
                    "model's off-target rate measured on the whole test set. Pick another sentence or direction "
                    "and press Translate.")
        with gr.Tab("Translate"):
            with gr.Row():
                src = gr.Dropdown(demo.languages, value=default[0], label="source language")
                tgt = gr.Dropdown(demo.languages, value=default[1], label="target language")
                lsl_off = gr.Checkbox(False, label="switch off LSL (paper Table 10 ablation)")
                omit_tag = gr.Checkbox(False, label="omit the language tag (paper Table 8)")
            text = gr.Textbox(examples[0][0] if examples else "", lines=3, elem_id="source-text",
                              label=f"source text (at most {demo.max_chars:,} characters)")
            button = gr.Button("Translate", variant="primary")
            outputs = []
            with gr.Row():
                for i, name in enumerate(demo.translators):
                    with gr.Column():
                        outputs.append(gr.Textbox(opening[2 * i], label=name, interactive=False,
                                                  elem_id=f"out-{name}"))
                        outputs.append(gr.Markdown(opening[2 * i + 1], elem_id=f"info-{name}"))
                        gr.Markdown(measured_text(demo.measured[name]), elem_id=f"rate-{name}")
            if examples:
                gr.Examples(examples, [text, src, tgt], label="zero-shot examples from test_2016_flickr")
            button.click(demo.translate, [text, src, tgt, lsl_off, omit_tag], outputs, api_name="translate")
            gr.Plot(demo.t_plot, label="learned t_l per language and layer (paper Fig. 6)")
        with gr.Tab("Why this language?"):
            gr.Markdown("Per output token, how much the **LSLs** pushed the model toward the token it wrote in the "
                        "requested language, against the **FFN** (integrated gradients, paper Fig. 5). "
                        "A few seconds on a CPU.")
            names = list(demo.translators)
            cll = [n for n, t in demo.translators.items() if t.model.cfg.cll_layers]
            with gr.Row():
                why_model = gr.Dropdown(names, value=(cll or names)[0], label="model to explain")
                why_src = gr.Dropdown(demo.languages, value=default[0], label="language of the sentence")
                why_tgt = gr.Dropdown(demo.languages, value=default[1], label="language to translate into")
                why_omit = gr.Checkbox(False, label="omit the language tag")
            why_text = gr.Textbox(examples[0][0] if examples else "", lines=2,
                                  label=f"sentence to explain (at most {demo.max_chars:,} characters)")
            why_steps = gr.Slider(2, MAX_WHY_STEPS, value=WHY_STEPS, step=1, label="integration steps")
            explain = gr.Button("Explain", variant="primary")
            why_info = gr.Markdown(elem_id="why-info")
            why_out = gr.HTML(elem_id="why-out")
            explain.click(demo.why, [why_text, why_src, why_tgt, why_model, why_steps, why_omit],
                          [why_info, why_out], api_name="why")
        with gr.Tab("Batch"):
            upload = gr.File(label="sentences (one per line)", type="filepath")
            references = gr.File(label="references (optional)", type="filepath")
            batch_tgt = gr.Dropdown(demo.languages, value=default[1], label="target language")
            batch_off = gr.Checkbox(False, label="switch off LSL")
            go = gr.Button("Translate file")
            table = gr.Markdown()
            result = gr.File(label="translations (TSV)")
            go.click(demo.batch, [upload, references, batch_tgt, batch_off], [table, result], api_name="batch")
    return app


def check_host(host: str) -> None:
    """An address this machine cannot serve on is named as such: gradio would report it as
    "cannot find an empty port"."""
    import socket
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise ValueError(f"--host {host}: not an address or a known host name ({err})") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind((address[0], 0))
                return
            except OSError as err:
                problem = err
    raise ValueError(f"--host {host}: this machine cannot serve on that address ({problem.strerror})")


def launch(args, block: bool = True):
    check_host(args.host)
    if args.examples and not Path(args.examples).is_dir():
        raise FileNotFoundError(2, "--examples: no such directory (a multi-way test directory, e.g. Multi30k)",
                                args.examples)
    demo = Demo(parse_models(args.model), pick_device(args.device), args.max_chars, args.results)
    app = build_app(demo, args.examples)
    app.queue(default_concurrency_limit=args.concurrency, max_size=256)
    app.launch(server_name=args.host, server_port=args.port, share=False, prevent_thread_lock=not block,
               quiet=True, show_error=True)
    return app
