"""Writes the parts of the docs/ pages that the code already knows, so they cannot drift.

    python docs/generate.py          # rewrite every generated region in place
    python docs/generate.py --check  # exit 1, naming the stale pages, if any region is out of date

A page marks a generated region with two HTML comments (invisible on GitHub)::

    <!-- generated: encoders -->
    ...written by this script; edit the code, not this text...
    <!-- end generated: encoders -->

and ``REGIONS`` says what fills it: the encoder registry (each encoder's paper, hooks, learned
parameters, declarations and hyperparameters), the contract (``posenc/encodings/base.py``'s
module docstring), and the contract battery's checks (``posenc.testing.CHECKS`` and their
docstrings), settings and per-encoder hyperparameters. Text outside the markers is
hand-written and left alone. ``tests/test_docs.py`` fails when a committed page differs from
what this script writes now.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

DOCS = Path(__file__).resolve().parent
# The shapes in the registry table are those of configs/base.py:tiny's attention.
SAMPLE_DIMS = {"model_dim": 64, "num_heads": 4, "head_dim": 16}
SAMPLE_TRAIN_LEN = 64  # the tiny config's train.seq_len

_REGION = re.compile(
    r"(<!-- generated: (?P<name>[\w-]+) -->\n).*?(<!-- end generated: (?P=name) -->)", re.S
)
_TABLE_BORDER = re.compile(r"^=+( +=+)+$")


# -- reStructuredText docstrings -> markdown ---------------------------------------------------


def rst_to_markdown(text: str) -> str:
    """The subset of reStructuredText posenc's docstrings use, as GitHub markdown: roles
    (``:func:`~a.b``` -> `` `b` ``), inline literals (double backquotes -> one) and simple
    tables (``===`` borders; a row whose first cell is empty continues the row above)."""
    lines = text.splitlines()
    out: list[str] = []
    prose: list[str] = []  # converted together: an inline literal may span a line break
    i = 0
    while i < len(lines):
        if _TABLE_BORDER.match(lines[i]):
            end = next(j for j in range(i + 3, len(lines)) if _TABLE_BORDER.match(lines[j]))
            out += [_inline("\n".join(prose))] if prose else []
            out += _table(lines[i], lines[i + 1], lines[i + 3 : end])
            prose, i = [], end + 1
        else:
            prose.append(lines[i])
            i += 1
    out += [_inline("\n".join(prose))] if prose else []
    return "\n".join(out)


def _inline(text: str) -> str:
    def role(match: re.Match) -> str:
        target = match[2].rsplit(".", 1)[-1] if match[1] else match[2]
        return f"`{target}`"

    text = re.sub(r":\w+:`(~?)([^`]+)`", role, text)
    return re.sub(r"``(.+?)``", r"`\1`", text, flags=re.S)


def _table(border: str, header: str, rows: list[str]) -> list[str]:
    starts = [m.start() for m in re.finditer(r"=+", border)]

    def cells(line: str) -> list[str]:
        bounds = zip(starts, starts[1:] + [None], strict=True)
        return [line[a:b].strip() for a, b in bounds]

    body: list[list[str]] = []
    for line in rows:
        row = cells(line)
        if body and not row[0]:  # a continuation line
            body[-1] = [f"{a} {b}".strip() for a, b in zip(body[-1], row, strict=True)]
        else:
            body.append(row)
    head = cells(header)
    return [
        _row(head),
        "|" + "---|" * len(head),
        *(_row(r) for r in body),
    ]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _cell(text: str) -> str:
    """Markdown for one table cell: inline markup converted, pipes escaped."""
    return _inline(text).replace("|", "\\|")


def _paragraphs(doc: str) -> list[str]:
    return [p for p in doc.strip().split("\n\n") if p.strip()]


# -- the regions -------------------------------------------------------------------------------


def _builtin_encoders() -> list[type]:
    """posenc's own encoder classes (installed plugins left out, so the page is the same on
    every machine), sorted by name."""
    from posenc import encodings

    classes = [encodings.get_class(name) for name in encodings.names()]
    return [c for c in classes if c.__module__.startswith("posenc.encodings.")]


def _shape(shape: tuple[int, ...]) -> str:
    return " x ".join(map(str, shape)) if shape else "scalar"


def encoders() -> str:
    """Two tables over the registry: what each encoder is, and how it is configured."""
    from posenc.encodings import Dims

    dims = Dims(**SAMPLE_DIMS)
    sample = ", ".join(f"`{k}` = {v}" for k, v in SAMPLE_DIMS.items())
    first = [
        f"Learned parameters are shown at {sample} and `train_len` = {SAMPLE_TRAIN_LEN} "
        "(`configs/base.py:tiny`); `shared`: one set for the whole model, otherwise one per "
        "attention layer.",
        "",
        "| name | paper | what it does | hooks | learned parameters |",
        "|---|---|---|---|---|",
    ]
    second = [
        "| name | hyperparameters (defaults) | declarations |",
        "|---|---|---|",
    ]
    for cls in _builtin_encoders():
        enc = cls()
        summary = " ".join(_paragraphs(inspect.getdoc(cls) or "")[:1]).replace("\n", " ")
        # An encoder defined by the training length (a run fills `train_len` from train.seq_len)
        # is shown at the tiny config's.
        sized = cls(train_len=SAMPLE_TRAIN_LEN) if "train_len" in enc.hparams() else enc
        shapes = sized.param_shapes(dims)
        params = ", ".join(f"`{n}`: {_shape(s)}" for n, s in shapes.items()) or "none"
        if shapes and cls.param_scope == "shared":
            params += "; shared"
        hooks = ", ".join(f"`{h}`" for h in enc.hooks) or "none"
        first.append(_row([f"`{cls.name}`", cls.paper, summary, hooks, params]))
        hparams = ", ".join(f"`{k}={v!r}`" for k, v in enc.hparams().items()) or "none"
        second.append(_row([f"`{cls.name}`", hparams, _declarations(cls)]))
    return "\n".join(first + ["", *second])


def _declarations(cls: type) -> str:
    """The declarations that differ from the base class's defaults."""
    said = []
    if cls.relative:
        said.append("`relative`")
    if cls.causal_only:
        said.append("`causal_only`")
    if cls.continuous_positions:
        said.append("`continuous_positions`")
    if not cls.cacheable:
        said.append("not `cacheable`")
    if not cls.normalized:
        said.append("not `normalized` (no softmax)")
    if cls.eval_safe_hparams:
        names = ", ".join(f"`{h}`" for h in cls.eval_safe_hparams)
        said.append(f"`eval_safe_hparams`: {names}")
    methods = ("check_causal", "check_cacheable", "for_direction", "qk_head_dim", "key_lookback")
    for method in methods:
        if getattr(cls, method) is not getattr(_base(), method):
            said.append(f"overrides `{method}`")
    return "; ".join(said) or "—"


def _base() -> type:
    from posenc.encodings.base import Encoding

    return Encoding


def contract() -> str:
    """The contract as ``posenc/encodings/base.py`` states it."""
    from posenc.encodings import base

    title, *rest = _paragraphs(inspect.getdoc(base) or "")  # the page has its own heading
    return rst_to_markdown("\n\n".join(rest))


def checks() -> str:
    """One item per check of the battery, in ``testing.CHECKS`` order, from its docstring."""
    from posenc import testing

    items = []
    for name, check in testing.CHECKS.items():
        doc = inspect.getdoc(check) or ""
        if doc.endswith(" (module docstring)."):  # the details live in the module's docstring
            module = sys.modules[check.__module__]
            doc = doc.removesuffix(" (module docstring).") + ":\n\n"
            doc += "\n\n".join(_paragraphs(inspect.getdoc(module) or "")[1:])
        first, *rest = _paragraphs(rst_to_markdown(doc))
        item = f"- **`{name}`** — " + first.replace("\n", "\n  ")
        for paragraph in rest:
            item += "\n\n" + "\n".join("  " + line for line in paragraph.splitlines())
        items.append(item)
    return "\n".join(items)


def settings() -> str:
    """``testing.Settings``: each field, its default and its line of the class docstring."""
    from posenc import testing

    meaning: dict[str, str] = {}
    names: list[str] = []
    attributes = inspect.getdoc(testing.Settings).split("Attributes:\n", 1)[1]
    for line in attributes.splitlines():
        if line.startswith("  ") and not line.startswith("    "):  # "  a, b: what they are"
            head, text = line.strip().split(": ", 1)
            names = [n.strip() for n in head.split(",")]
            for name in names:
                meaning[name] = text
        elif line.strip():  # a continuation of the entry above
            for name in names:
                meaning[name] += " " + line.strip()
    rows = ["| field | default | meaning |", "|---|---|---|"]
    for field in dataclasses.fields(testing.Settings):
        what = meaning.get(field.name, "")
        rows.append(_row([f"`{field.name}`", f"`{field.default!r}`", rst_to_markdown(what)]))
    return "\n".join(rows)


def battery_hparams() -> str:
    """``testing.HPARAMS`` and ``testing.BIDIRECTIONAL_HPARAMS``, one row per encoder."""
    from posenc import testing

    def said(hparams: dict) -> str:
        return ", ".join(f"`{k}={v!r}`" for k, v in hparams.items()) or "—"

    rows = ["| encoder | every check | the `bidirectional` check |", "|---|---|---|"]
    for name in sorted(testing.HPARAMS.keys() | testing.BIDIRECTIONAL_HPARAMS.keys()):
        both = (testing.HPARAMS.get(name, {}), testing.BIDIRECTIONAL_HPARAMS.get(name, {}))
        rows.append(_row([f"`{name}`", *map(said, both)]))
    return "\n".join(rows)


def run_kinds() -> str:
    """One row per registered run kind: how a config chooses it, what it trains, its module."""
    from posenc import kinds

    rows = [
        "| kind | chosen by | what it runs | `objective` in eval.json | asked | module |",
        "|---|---|---|---|---|---|",
    ]
    for kind in kinds.kinds():
        module = type(kind).__module__
        rows.append(
            _row(
                [
                    f"`{kind.name}`",
                    f"`{kind.chosen_by}`",
                    kind.summary,
                    f"`{kind.objective}`",
                    str(kind.precedence),
                    f"`{module}`",
                ]
            )
        )
    return "\n".join(rows)


def kind_contract() -> str:
    """The run-kind contract as ``posenc/kinds/base.py`` states it."""
    from posenc.kinds import base

    title, *rest = _paragraphs(inspect.getdoc(base) or "")
    return rst_to_markdown("\n\n".join(rest))


def kind_methods() -> str:
    """Every attribute and method of ``RunKind``, with the first paragraph of its docstring
    (attributes: their ``#:`` comment) and whether a kind must give it."""
    from posenc.kinds.base import RunKind

    source = inspect.getsource(RunKind)
    items = []
    for match in re.finditer(r"((?:    #: .*\n)+)    (\w+): ClassVar", source):
        text = " ".join(line.strip()[3:] for line in match[1].splitlines())
        items.append(f"- **`{match[2]}`** (attribute) — {rst_to_markdown(text)}")
    for name, member in RunKind.__dict__.items():
        if name.startswith("_") or not callable(member):
            continue
        doc = inspect.getdoc(member) or ""
        first = _paragraphs(doc)[0].replace("\n", " ") if doc else ""
        required = "NotImplementedError" in inspect.getsource(member)
        signature = str(inspect.signature(member)).replace("self, ", "").replace("(self)", "()")
        signature = signature.replace("'", "")
        signature = re.sub(r"ml_collections\.ConfigDict", "ConfigDict", signature)
        what = "required" if required else "has a default"
        items.append(f"- **`{name}{signature}`** ({what}) — {rst_to_markdown(first)}")
    return "\n".join(items)


def kind_checks() -> str:
    """The kind battery's checks, from ``posenc/testing/kinds.py``'s module docstring table."""
    from posenc.testing import kinds as battery

    doc = inspect.getdoc(battery) or ""
    table = doc[doc.index("=" * 5) :]
    table = table[: table.rindex("=" * 5) + 5]
    return rst_to_markdown(table)


REGIONS: dict[str, Callable[[], str]] = {
    "run-kinds": run_kinds,
    "kind-contract": kind_contract,
    "kind-methods": kind_methods,
    "kind-checks": kind_checks,
    "encoders": encoders,
    "contract": contract,
    "checks": checks,
    "settings": settings,
    "battery-hparams": battery_hparams,
}


# -- pages -------------------------------------------------------------------------------------


def render(page: str) -> str:
    """``page`` with every generated region rewritten; an unknown region name is an error."""

    def fill(match: re.Match) -> str:
        name = match["name"]
        if name not in REGIONS:
            raise ValueError(f"unknown generated region {name!r}; known: {sorted(REGIONS)}")
        return f"{match[1]}{REGIONS[name]().rstrip()}\n{match[3]}"

    return _REGION.sub(fill, page)


def stale_pages(docs: Path = DOCS, write: bool = False) -> list[Path]:
    """The pages under ``docs`` whose generated regions differ from :func:`render`'s (rewritten
    when ``write``)."""
    stale = []
    for path in sorted(docs.glob("*.md")):
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(path)
            if write:
                path.write_text(new)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale pages (exit 1)")
    args = parser.parse_args(argv)
    stale = stale_pages(write=not args.check)
    for path in stale:
        verb = "stale" if args.check else "rewrote"
        print(f"{verb}: {path.relative_to(DOCS.parent)}")
    if args.check and stale:
        print("run: python docs/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
