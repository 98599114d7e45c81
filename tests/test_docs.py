"""The README is a five-minute page, and every link in it and in docs/ leads somewhere inside the
repository (issue 52).

Checked: README.md, the pages at the top of docs/ and docs/results/*.md. The reports that
cll-repro and cll-eval write into folders under docs/results/ (records, hypotheses) are not
checked. The checks are plain functions of a repository root, so the last tests run them on a
small made-up repository where each one has something to find.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250

# The one place outside the repository the docs may point at: the data directory that
# `make quickstart` reads (../shared/data/multi30k, seen from the repository root).
DATA_DIR = ("..", "shared", "data")
# Outside paths that are facts about what the code writes, not places a reader is sent to.
OUTSIDE_PATHS_STATED = {
    "~/.cache/cll-scale/",  # where `--ds-config auto` caches its bf16 probe, per CPU model
}
# A generated report's `Command:` and `Test set:` lines say how it was made, on the machine that
# made it: history, left as written.
HISTORY_LINE = re.compile(r"^(Command|Test set):")
# Links to files that a named piece of work will produce; each entry must still be missing (the
# test fails once the file exists, so the entry is removed then).
PENDING: dict[str, str] = {}       # a path the docs link before it exists -> the issue that produces it

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
# [text](target "title") and ![alt](target); the text may hold `code` and one level of [..].
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HTML_SRC = re.compile(r"<(?:img|a)\b[^>]*\b(?:src|href)=\"([^\"]+)\"", re.I)
# Paths in text and code: ../x, ~/x, and absolute /a/b (not a/b/c, <out>/x, </s>, "1.08 / 1.07").
OUTSIDE_TOKEN = re.compile(
    r"(?<![\w.~/<>\-])((?:\.\./|~/|/[A-Za-z_][\w.\-]*/)[^\s`'\"()\[\]<>,;|]*)")
LINK_TARGET = re.compile(r"(\]\()[^)]*(\))|(\b(?:src|href)=\")[^\"]*(\")|^( {0,3}\[[^\]]+\]:).*$")


def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md")),
            *sorted((root / "docs" / "results").glob("*.md"))]


def links(text: str) -> list[str]:
    prose = FENCE.sub("", text)
    return ([m.group(1) for m in INLINE_LINK.finditer(prose)]
            + [m.group(1) for m in REF_DEF.finditer(prose)]
            + [m.group(1) for m in HTML_SRC.finditer(prose)])


def is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) is not None  # http:, https:, mailto:


def inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def allowed_outside(path: Path, root: Path) -> bool:
    data = root.joinpath(*DATA_DIR).resolve()
    return path == data or data in path.parents


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text))


def anchors(text: str) -> set[str]:
    found, seen = set(), {}
    for m in re.finditer(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$", FENCE.sub("", text), re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    found |= set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return found


def readme_too_long(root: Path) -> list[str]:
    n = len((root / "README.md").read_text(encoding="utf-8").splitlines())
    return [f"README.md has {n} lines (at most {README_MAX_LINES})"] if n > README_MAX_LINES else []


def broken_links(root: Path, pending: dict[str, str]) -> list[str]:
    bad = []
    for doc in doc_files(root):
        for target in links(doc.read_text(encoding="utf-8")):
            if is_external(target):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            name = dest.relative_to(root).as_posix() if inside(dest, root) else str(dest)
            if not dest.exists():
                if name not in pending:
                    bad.append(f"{doc.relative_to(root)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
                bad.append(f"{doc.relative_to(root)}: {target} (no heading with that anchor)")
    return bad


def pending_produced(root: Path, pending: dict[str, str]) -> list[str]:
    return [f"{p} exists now: drop it from PENDING ({why})" for p, why in pending.items()
            if (root / p).exists()]


def outside_pointers(root: Path) -> list[str]:
    bad = []
    for doc in doc_files(root):
        text = doc.read_text(encoding="utf-8")
        for target in links(text):  # a link is read from the page's own folder
            if is_external(target):
                continue
            dest = (doc.parent / target.partition("#")[0]).resolve()
            if not inside(dest, root) and not allowed_outside(dest, root):
                bad.append(f"{doc.relative_to(root)}: link {target}")
        for line in text.splitlines():  # a path in text or a command is read from the root
            if HISTORY_LINE.match(line):
                continue
            line = LINK_TARGET.sub(lambda m: "".join(g or "" for g in m.groups()), line)
            for token in OUTSIDE_TOKEN.findall(line):
                if token in OUTSIDE_PATHS_STATED:
                    continue
                dest = (root / token).resolve() if token.startswith("../") else None
                if dest is None or not (inside(dest, root) or allowed_outside(dest, root)):
                    bad.append(f"{doc.relative_to(root)}: {token}")
    return bad


def test_the_readme_is_a_five_minute_page():
    assert readme_too_long(ROOT) == []


def test_every_relative_link_and_image_leads_to_a_file_and_heading_that_exist():
    assert broken_links(ROOT, PENDING) == []
    assert pending_produced(ROOT, PENDING) == []


def test_nothing_points_outside_the_repository_but_the_data_directory():
    assert outside_pointers(ROOT) == []


# The checks above, on a made-up repository where each one has something to find.

@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "docs" / "results" / "study").mkdir(parents=True)
    (root / "docs" / "pic.png").write_bytes(b"png")
    (root / "docs" / "usage.md").write_text(
        "# Usage\n\n## The model and training: `cll-train`\n\n![pic](pic.png) [top](../README.md)\n"
        "```bash\ncll-shards build --corpus ../shared/data/multi30k\n```\n", encoding="utf-8")
    (root / "docs" / "results" / "README.md").write_text(
        "[study](study/) [usage](../usage.md#the-model-and-training-cll-train)\n", encoding="utf-8")
    (root / "README.md").write_text(
        "# r\n\n[usage](docs/usage.md#the-model-and-training-cll-train) ![chart](docs/chart.png) "
        "[web](https://example.org/x)\n", encoding="utf-8")
    return root


def write(path: Path, extra: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + extra, encoding="utf-8")


def test_the_checks_pass_a_clean_repository(repo):
    pending = {"docs/chart.png": "to be drawn"}
    assert readme_too_long(repo) == []
    assert broken_links(repo, pending) == [] and pending_produced(repo, pending) == []
    assert outside_pointers(repo) == []


def test_a_long_readme_is_caught(repo):
    write(repo / "README.md", "line\n" * README_MAX_LINES)
    assert readme_too_long(repo)


@pytest.mark.parametrize("extra", [
    "[gone](docs/gone.md)\n",                      # a file that does not exist
    "![gone](docs/results/gone.png)\n",             # an image that does not exist
    "[usage](docs/usage.md#the-training-stream)\n",  # a heading that does not exist
    "[ref]: docs/gone.md\n",                        # a reference-style definition
])
def test_a_broken_link_in_the_readme_is_caught(repo, extra):
    write(repo / "README.md", extra)
    assert broken_links(repo, {"docs/chart.png": "to be drawn"})


def test_a_broken_link_in_docs_results_is_caught_and_a_produced_pending_file_too(repo):
    write(repo / "docs" / "results" / "README.md", "[t](triangle.md)\n")
    assert broken_links(repo, {"docs/chart.png": "to be drawn"})
    (repo / "docs" / "chart.png").write_bytes(b"png")
    assert pending_produced(repo, {"docs/chart.png": "to be drawn"})


@pytest.mark.parametrize("page, extra", [
    ("README.md", "See `../shared/DESIGN.md` for the method.\n"),
    ("README.md", "[design](../shared/DESIGN.md)\n"),
    ("docs/usage.md", "[design](../../shared/DESIGN.md)\n"),
    ("docs/usage.md", "cached in /work/cll-runs/shards\n"),
    ("docs/results/README.md", "```\ncll-eval --corpus /home/me/multi30k\n```\n"),
    ("docs/results/README.md", "a copy in ~/notes.md\n"),
])
def test_a_pointer_outside_the_repository_is_caught(repo, page, extra):
    write(repo / page, extra)
    assert outside_pointers(repo)


def test_the_data_directory_and_a_reports_command_line_are_allowed(repo):
    write(repo / "docs" / "results" / "README.md",
          "Command: `cll-repro --multi30k /work/shared/data/multi30k`\n"
          "`make quickstart` reads `../shared/data/multi30k`; the probe caches under `~/.cache/cll-scale/`.\n")
    assert outside_pointers(repo) == []


# The README and docs/benchmarks.md state today: no issue numbers (history is CHANGELOG.md's), and
# every figure of the README's Results section is one of the page it links, as that page gives it.

TODAY_PAGES = ("README.md", "docs/benchmarks.md")
ISSUE = re.compile(r"\bissues? #?\d+", re.I)
NUMBER = re.compile(r"(?<![\w.,+-])[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.,+-])[+-]?\d+(?:\.\d+)?(?![\w])")


def issue_numbers(root: Path) -> list[str]:
    return [f"{page}:{i}: {m.group(0)}" for page in TODAY_PAGES if (root / page).is_file()
            for i, line in enumerate((root / page).read_text(encoding="utf-8").splitlines(), 1)
            for m in ISSUE.finditer(line)]


def _figures(text: str) -> list[str]:
    """The numbers a text states, as written (a link's target and inline code left out)."""
    text = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", text))
    return [m.group(0).lstrip("+-") for m in NUMBER.finditer(text)]


def _as_given(figure: str, page_figures: set[str]) -> bool:
    """``figure`` is a figure of the page, or one rounded to as many decimals as it shows."""
    plain = figure.replace(",", "")
    decimals = len(plain.partition(".")[2])
    return any(f"{float(p):.{decimals}f}" == plain for p in page_figures)


RESULTS_PAGE = re.compile(r"\]\((docs/results/[^)#]+\.md)(?:#([^)]+))?\)")
TABLE_ROW = re.compile(r"^\|(.*)\|\s*$")


def results_section(root: Path) -> str:
    readme = (root / "README.md").read_text(encoding="utf-8")
    start = readme.index("\n## Results")
    return readme[start:readme.index("\n## ", start + 1)]


def results_rows(section: str) -> list[dict[str, str]]:
    """The rows of the Results section's table, as {column: cell}; an empty cell reads as the
    cell above it (a group's budget and page are written on its first row)."""
    lines = [m.group(1) for m in map(TABLE_ROW.match, section.splitlines()) if m]
    if len(lines) < 2:
        return []
    head = [c.strip() for c in lines[0].split("|")]
    rows, above = [], {}
    for line in lines[2:]:
        cells = dict(zip(head, (c.strip() for c in line.split("|"))))
        row = {k: v or above.get(k, "") for k, v in cells.items()}
        rows.append(row)
        above = row
    return rows


def unbacked_results(root: Path) -> list[str]:
    """The README's Results section is prose and one table. Each table row links (or inherits
    from its group's first row) the docs/results/ pages it reports, and each paragraph with a
    figure links its pages; a figure that none of them holds is returned (with where it stands)."""
    section = results_section(root)
    rows = results_rows(section)
    found = [] if rows else ["README.md: the Results section has no table"]
    prose = [p for p in re.split(r"\n\s*\n", section) if p.strip() and not p.lstrip().startswith(("|", "#"))]
    pieces = [(" | ".join(row.values()), " | ".join(v for k, v in row.items() if k != "page")) for row in rows]
    pieces += [(paragraph, paragraph) for paragraph in prose]
    for where, text in pieces:
        pages = set(RESULTS_PAGE.findall(where))
        figures = _figures(text)
        if not pages:
            if figures:
                found.append(f"links no docs/results page: {text[:60]}")
            continue
        held = {p.replace(",", "") for page, anchor in pages if (root / page).is_file()
                for p in _figures(page_part((root / page).read_text(encoding="utf-8"), anchor))}
        found += [f"{figure} is in none of {sorted(page + (f'#{a}' if a else '') for page, a in pages)}: {text[:60]}"
                  for figure in figures if not _as_given(figure, held)]
    return found


def page_part(text: str, anchor: str) -> str:
    """The part of a page a link points at: the section under the heading ``anchor`` (to the next
    heading of its level or above), or the whole page without an anchor."""
    if not anchor:
        return text
    headings = list(re.finditer(r"^(#{1,6})[ \t]+(.*?)[ \t#]*$", text, re.M))
    for i, m in enumerate(headings):
        if slug(m.group(2)) == anchor:
            end = next((h.start() for h in headings[i + 1:] if len(h.group(1)) <= len(m.group(1))), len(text))
            return text[m.start():end]
    return ""


def rows_without_budget(root: Path) -> list[str]:
    """Each number of the table names its budget: every row's budget cell (its own or its
    group's) gives steps, tokens and seeds."""
    rows = results_rows(results_section(root))
    budget = next((k for k in (rows[0] if rows else {}) if k.startswith("budget")), None)
    if rows and budget is None:
        return ["README.md: the Results table has no budget column"]
    return [f"{row.get('model', '?')}: budget {row[budget]!r} lacks {', '.join(missing)}" for row in rows
            if (missing := [w for w, pattern in (("steps", r"\d steps|\d,?\d* ×"), ("tokens", r"tokens"),
                                                    ("seeds", r"\bseeds? \d")) if not re.search(pattern, row[budget])])]


def test_the_readme_and_benchmarks_name_no_issue_number():
    assert issue_numbers(ROOT) == []


def test_every_figure_of_the_readmes_results_is_in_the_page_it_links():
    assert unbacked_results(ROOT) == []


def test_every_row_of_the_readmes_results_names_its_budget():
    assert rows_without_budget(ROOT) == []


def test_an_issue_number_a_figure_the_linked_page_lacks_and_a_row_without_budget_are_caught(repo):
    (repo / "docs" / "results" / "tri.md").write_text("| Baseline | 91.83% | 51.70% | 4,200 steps of 4,096 tokens, "
                                                      "seed 1 |\n", encoding="utf-8")
    head = "| condition | model | budget: steps × tokens a step, seeds | off-target | page |\n|---|---|---|---:|---|\n"
    readme = (repo / "README.md").read_text(encoding="utf-8")
    write(repo / "README.md", "\n## Results\n\nIntro without figures.\n\n" + head
          + "| triangle | Baseline | 4,200 × 4,096 tokens, seed 1 | 91.8% | [`tri.md`](docs/results/tri.md) |\n"
          "| | FCLL | | 51.7% | |\n\nFCLL 51.7% ([`tri.md`](docs/results/tri.md)).\n\n## Next\n")
    assert unbacked_results(repo) == [] and issue_numbers(repo) == [] and rows_without_budget(repo) == []
    (repo / "README.md").write_text(readme + "\n## Results\n\n" + head
          + "| triangle | Baseline | 4,200 steps, 4,096 tokens | 91.8% | [`tri.md`](docs/results/tri.md) |\n"
          "| | FCLL | | 41.2% | |\n\nAs issue 54 said, the seeds spread by 2.8.\n\n## Next\n")
    assert [x.split(": ", 1)[1] for x in issue_numbers(repo)] == ["issue 54"]
    assert [p.split(" ")[0] for p in unbacked_results(repo)] == ["41.2", "links"]      # the FCLL row inherits tri.md
    assert rows_without_budget(repo) == [f"{m}: budget '4,200 steps, 4,096 tokens' lacks seeds" for m in ("Baseline", "FCLL")]
    (repo / "docs" / "results" / "tri.md").write_text("## Square\n\n41.20%\n\n## Triangle\n\n4,200 steps of 4,096 tokens, "
                                                      "seed 1: 91.83%\n", encoding="utf-8")
    (repo / "README.md").write_text(readme + "\n## Results\n\n" + head + "| square | Baseline | 4,200 × 4,096 tokens, "
                                    "seed 1 | 41.2% | [`tri.md`](docs/results/tri.md#triangle) |\n\n## Next\n")
    assert [p.split(" ")[0] for p in unbacked_results(repo)] == ["41.2"]     # a link's anchor: that section only
    (repo / "README.md").write_text(readme + "\n## Results\n\n- Baseline 91.8% ([`tri.md`](docs/results/tri.md))\n\n## Next\n")
    assert unbacked_results(repo) == ["README.md: the Results section has no table"]
