"""The README, experiments/README.md and the docs/ pages hold together: every relative link
reaches a file (and heading), and the generated regions are what ``docs/generate.py`` writes
from the code today."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from _train_helpers import REPO

PAGES = [REPO / "README.md", REPO / "experiments/README.md", *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _generator():
    spec = importlib.util.spec_from_file_location("posenc_docs_generate", REPO / "docs/generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and typing look the module up
    spec.loader.exec_module(module)
    return module


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but ``-`` and ``_`` dropped, spaces to
    ``-``, a repeated anchor suffixed ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in _FENCE.sub("", markdown).splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` (outside code) whose file or heading does not exist."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", page.read_text()))
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            broken.append(f"{target}: no heading with that anchor")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_link_check_finds_missing_files_and_headings(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Sweeps and reports\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## A (b) c\n\n[ok](other.md#sweeps-and-reports) [ok](#a-b-c) "
        "[ok](https://example.com/x.md) `[not a link](missing.md)`\n"
        "[bad](missing.md) [bad](other.md#sweeps) [bad](#a-(b)-c)\n"
        "```\n[in code](missing.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#sweeps: no heading with that anchor",
        "#a-(b: no heading with that anchor",
    ]


def test_the_generated_regions_are_up_to_date():
    generate = _generator()
    stale = generate.stale_pages()
    assert stale == [], f"stale generated docs: {stale}; run python docs/generate.py"


def test_the_generated_regions_come_from_the_code():
    from posenc import encodings, testing

    generate = _generator()
    empty = "".join(
        f"<!-- generated: {n} -->\n<!-- end generated: {n} -->\n" for n in generate.REGIONS
    )
    page = generate.render(empty)
    for name in encodings.names():
        if not encodings.get_class(name).__module__.startswith("posenc.encodings."):
            continue  # a plugin's encoder: the pages list posenc's own
        assert f"| `{name}` | {encodings.get_class(name).paper} |" in page
    for check in testing.CHECKS:
        assert f"- **`{check}`** — " in page
    assert "| `rotate(params, q, k, q_pos, k_pos)` |" in page  # the contract's hook table
    assert generate.render(page) == page  # rendering twice changes nothing
    with pytest.raises(ValueError, match="unknown generated region 'nope'"):
        generate.render("<!-- generated: nope -->\n<!-- end generated: nope -->")


def test_rst_tables_become_markdown_tables():
    generate = _generator()
    rst = (
        "Intro ``code`` and :func:`~posenc.encodings.get`.\n\n"
        "======  ==========\n"
        "hook    returns\n"
        "======  ==========\n"
        "``a``   ``[B|1, T]``\n"
        "``b``   two lines,\n"
        "        joined\n"
        "======  ==========\n"
    )
    assert generate.rst_to_markdown(rst).splitlines() == [
        "Intro `code` and `get`.",
        "",
        "| hook | returns |",
        "|---|---|",
        "| `a` | `[B\\|1, T]` |",
        "| `b` | two lines, joined |",
    ]
