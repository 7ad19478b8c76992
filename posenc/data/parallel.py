"""Parallel text (translation pairs) by spec string: a folder, a TFDS builder, or the default.

Spec forms (the `data.source` value of a translation run; languages in `data.src_lang` and
`data.tgt_lang`):

- `parallel:default` — the embedded English-German corpus (`grammar_pairs`): 20,000 / 1,000 /
  1,000 pairs, generated deterministically, always offline; `en -> de` unless the languages say
  `de -> en`. (A folder named `default` is `parallel:./default`.)
- `parallel:<dir>` — line-aligned plain-text files in the Moses/fairseq layout: `train.SRC` and
  `train.TGT`, `valid.*` (or `validation.*`, `dev.*`), `test.*`, e.g. `train.en` / `train.es`.
  Line `i` of `<split>.SRC` translates line `i` of `<split>.TGT`; lines end at "\\n" only
  ("\\r\\n" is accepted; other Unicode line breaks stay inside a line).
- `tfds:<name>[/<config>]` — a prepared TFDS translation data set (`wmt14_translate/de-en`,
  `wmt_t2t_translate/de-en`, `ted_hrlr_translate/pt_to_en`, ...), read through
  `tfds.data_source` (no TensorFlow).

Empty lines: a training pair whose source or target is empty (or only whitespace) is dropped,
as Moses' `clean-corpus-n` does, and counted in `info()`; validation and test keep every line, so
hypotheses stay line-aligned with the reference file.

Nothing downloads: an unprepared TFDS data set raises `DataNotFoundError` with the command that
prepares it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from posenc.data.base import (
    SOURCE_FIELD,
    SPLITS,
    DataNotFoundError,
    resolve_data_dir,
)
from posenc.data.parallel_base import (
    SRC_LANG_FIELD,
    TGT_LANG_FIELD,
    Pair,
    ParallelSource,
    drop_empty,
    pairs_sha256,
)

DEFAULT_SPEC = "parallel:default"
# The accepted spec forms, as shown in errors.
PARALLEL_SPEC_FORMS: tuple[str, ...] = (
    DEFAULT_SPEC,
    "parallel:<dir>",
    "tfds:<name>[/<config>][:<version>]",
)
# File prefixes that name each split in a parallel folder, in order of preference.
FILE_SPLITS: dict[str, tuple[str, ...]] = {
    "train": ("train",),
    "validation": ("valid", "validation", "dev"),
    "test": ("test",),
}


def _language_error(spec: str, src: str | None, tgt: str | None, pairs: Iterable[str]) -> str:
    return (
        f"{SRC_LANG_FIELD}={src!r}, {TGT_LANG_FIELD}={tgt!r}: {spec!r} has no such language "
        f"pair; language pairs there (either direction): {', '.join(sorted(pairs)) or 'none'}"
    )


class DefaultParallelSource(ParallelSource):
    """`parallel:default`: the embedded English-German corpus (see `grammar_pairs`).

    Args:
      src_lang: "en" (default) or "de".
      tgt_lang: the other one.
    """

    def __init__(self, src_lang: str | None = None, tgt_lang: str | None = None):
        from posenc.data import grammar_pairs

        src_lang = src_lang or ("de" if tgt_lang == "en" else "en")
        tgt_lang = tgt_lang or ("en" if src_lang == "de" else "de")
        if {src_lang, tgt_lang} != {"en", "de"}:
            raise ValueError(_language_error(DEFAULT_SPEC, src_lang, tgt_lang, ["de-en"]))
        self.spec = DEFAULT_SPEC
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.splits = SPLITS
        generated = grammar_pairs.generate_pairs()
        # The hash is of the English-German corpus, the same for both directions.
        self.content_sha256 = pairs_sha256((s, generated[s]) for s in SPLITS)
        self.grammar_version = grammar_pairs.GRAMMAR_VERSION
        flip = src_lang == "de"
        self._pairs = {s: [(t, e) if flip else (e, t) for e, t in generated[s]] for s in SPLITS}

    def pairs(self, split: str) -> list[Pair]:
        """See `ParallelSource.pairs` (the generated corpus has no empty lines)."""
        return list(self._pairs[self.check_split(split)])

    def info(self) -> dict[str, Any]:
        """See `ParallelSource.info`."""
        return {
            "spec": self.spec,
            "kind": "parallel-default",
            "generator": f"posenc.data.grammar_pairs v{self.grammar_version}",
            "src_lang": self.src_lang,
            "tgt_lang": self.tgt_lang,
            "content_sha256": self.content_sha256,
            "splits": {s: {"pairs": len(self._pairs[s])} for s in SPLITS},
        }


def _read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 file, split at "\\n" only (an "\\r" before it is dropped)."""
    return split_lines(path.read_bytes(), str(path))


def decode_utf8(data: bytes, name: str) -> str:
    """``data`` as UTF-8 text; otherwise a one-line ``ValueError`` naming ``name`` and the line
    of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ValueError(f"{name} is not UTF-8 text (line {line}: {err.reason})") from None


def split_lines(data: bytes, name: str) -> list[str]:
    """The lines of UTF-8 text, split at "\\n" only (an "\\r" before it is dropped, as a
    byte-order mark at the start): U+2028, U+0085, a lone "\\r" and the other characters
    ``str.splitlines`` also splits at stay inside their line, so line ``i`` of one file stays
    line ``i`` of its translation.

    Args:
      data: the text's bytes.
      name: the file it came from, for the error.

    Raises:
      ValueError: the text is not UTF-8 (naming ``name`` and the line).
    """
    text = decode_utf8(data, name)
    if text.startswith("\ufeff"):  # a byte-order mark is not text
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":  # the final newline ends the last line, it starts none
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


class FolderParallelSource(ParallelSource):
    """`parallel:<dir>`: line-aligned files `<split>.<lang>` in a folder.

    Args:
      folder: the folder.
      src_lang: source language, the suffix of its files (`train.<src_lang>`).
      tgt_lang: target language.
      spec: the spec string to report.

    Raises:
      DataNotFoundError: the folder does not exist or has no `train.*` files.
      ValueError: languages not given or not a pair of the folder (the message lists its pairs),
        a split with only one side, or a split whose two files differ in line count.
    """

    def __init__(self, folder: Path, src_lang: str | None, tgt_lang: str | None, spec: str = ""):
        self.folder = Path(folder).expanduser().resolve()
        self.spec = spec or f"parallel:{folder}"
        if not self.folder.is_dir():
            raise DataNotFoundError(f"{SOURCE_FIELD}={self.spec!r}: {self.folder} is not a folder")
        langs = self._languages("train")
        if not langs:
            raise DataNotFoundError(
                f"{SOURCE_FIELD}={self.spec!r}: no train.<lang> files in {self.folder} (expected "
                "the Moses/fairseq layout: train.en + train.de, valid.en + valid.de, ...)"
            )
        pairs = [f"{a}-{b}" for i, a in enumerate(langs) for b in langs[i + 1 :]]
        if not src_lang or not tgt_lang or src_lang == tgt_lang:
            raise ValueError(_language_error(self.spec, src_lang, tgt_lang, pairs))
        if src_lang not in langs or tgt_lang not in langs:
            raise ValueError(_language_error(self.spec, src_lang, tgt_lang, pairs))
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.files: dict[str, tuple[str, str]] = {}
        for split, prefixes in FILE_SPLITS.items():
            found = self._split_files(split, prefixes)
            if found:
                self.files[split] = found
        self.splits = tuple(self.files)
        self._pairs: dict[str, list[Pair]] = {}
        self._dropped: dict[str, int] = {}
        for split, (src_name, tgt_name) in self.files.items():
            src_lines = _read_lines(self.folder / src_name)
            tgt_lines = _read_lines(self.folder / tgt_name)
            if len(src_lines) != len(tgt_lines):
                raise ValueError(
                    f"{SOURCE_FIELD}={self.spec!r}: {src_name} has {len(src_lines)} lines but "
                    f"{tgt_name} has {len(tgt_lines)}; line i of one must translate line i of "
                    "the other"
                )
            pairs_ = list(zip(src_lines, tgt_lines, strict=True))
            if split == "train":
                pairs_, self._dropped[split] = drop_empty(pairs_)
            self._pairs[split] = pairs_
        self.content_sha256 = pairs_sha256((s, self._pairs[s]) for s in self.splits)

    def _languages(self, prefix: str) -> list[str]:
        return sorted(
            p.suffix[1:]
            for p in self.folder.iterdir()
            if p.is_file() and p.stem == prefix and len(p.suffix) > 1
        )

    def _split_files(self, split: str, prefixes: tuple[str, ...]) -> tuple[str, str] | None:
        present = [p for p in prefixes if self._languages(p)]
        if len(present) > 1:
            raise ValueError(
                f"{SOURCE_FIELD}={self.spec!r}: both {present} files name the {split} split; "
                "keep one prefix"
            )
        if not present:
            return None
        prefix = present[0]
        names = (f"{prefix}.{self.src_lang}", f"{prefix}.{self.tgt_lang}")
        missing = [n for n in names if not (self.folder / n).is_file()]
        if missing:
            have = [f"{prefix}.{lang}" for lang in self._languages(prefix)]
            raise ValueError(
                f"{SOURCE_FIELD}={self.spec!r}: the {split} split needs {names[0]} and "
                f"{names[1]}, but {', '.join(missing)} is missing (the folder has {have})"
            )
        return names

    def pairs(self, split: str) -> list[Pair]:
        """See `ParallelSource.pairs`."""
        return list(self._pairs[self.check_split(split)])

    def check_split(self, split: str) -> str:
        """See `ParallelSource.check_split`; the error names the files looked for."""
        if split in SPLITS and split not in self.splits:
            looked = [f"{p}.{self.src_lang}" for p in FILE_SPLITS[split]]
            raise ValueError(
                f"{SOURCE_FIELD}={self.spec!r} has no {split!r} split (looked for {looked} in "
                f"{self.folder}); available splits: {list(self.splits)}"
            )
        return super().check_split(split)

    def info(self) -> dict[str, Any]:
        """See `ParallelSource.info`."""
        splits: dict[str, Any] = {}
        for split in self.splits:
            entry: dict[str, Any] = {"files": list(self.files[split])}
            entry["pairs"] = len(self._pairs[split])
            if split in self._dropped:
                entry["dropped_empty"] = self._dropped[split]
            splits[split] = entry
        return {
            "spec": self.spec,
            "kind": "parallel-folder",
            "folder": str(self.folder),
            "src_lang": self.src_lang,
            "tgt_lang": self.tgt_lang,
            "content_sha256": self.content_sha256,
            "splits": splits,
        }


def _parse(spec: str) -> tuple[str, str]:
    if not isinstance(spec, str):
        raise ValueError(f"{SOURCE_FIELD} must be a string, got {type(spec).__name__}")
    kind, sep, arg = spec.strip().partition(":")
    if kind in ("parallel", "tfds") and sep and arg:
        return kind, arg
    raise ValueError(
        f"{SOURCE_FIELD}={spec!r} is not a parallel (translation) data source; "
        f"allowed forms: {', '.join(PARALLEL_SPEC_FORMS)}"
    )


def get_parallel_source(
    spec: str = DEFAULT_SPEC,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> ParallelSource:
    """Opens the parallel source named by `spec`; never downloads.

    Args:
      spec: `parallel:default`, `parallel:<dir>` or `tfds:<name>[/<config>][:<version>]`.
      data_dir: data directory (for `tfds:`); None means `default_data_dir()`.
      src_lang: source language (`data.src_lang`); `parallel:default` and `tfds:` have defaults
        (en, and the builder's supervised source language), a folder needs it.
      tgt_lang: target language (`data.tgt_lang`).

    Returns:
      A `ParallelSource`.
    """
    kind, arg = _parse(spec)
    if kind == "parallel" and arg == "default":
        return DefaultParallelSource(src_lang, tgt_lang)
    if kind == "parallel":
        return FolderParallelSource(Path(arg), src_lang, tgt_lang, spec=spec)
    from posenc.data.parallel_tfds import TfdsParallelSource

    return TfdsParallelSource(resolve_data_dir(data_dir), arg, src_lang, tgt_lang, spec=spec)


def prepare_parallel(
    spec: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> ParallelSource:
    """Prepares a parallel source once (for `tfds:` the one step that may download: TFDS's
    `download_and_prepare(file_format="array_record")`); folders and the default need nothing.

    Args: as for `get_parallel_source`.

    Returns:
      The opened source.
    """
    kind, arg = _parse(spec)
    if kind == "tfds":
        from posenc.data.parallel_tfds import prepare_tfds_parallel

        return prepare_tfds_parallel(arg, resolve_data_dir(data_dir), src_lang, tgt_lang)
    return get_parallel_source(spec, data_dir, src_lang=src_lang, tgt_lang=tgt_lang)
