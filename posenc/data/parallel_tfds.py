"""`tfds:<name>` as parallel text: a prepared TFDS translation data set, read without TensorFlow.

Works with any builder whose features are one `tfds.features.Translation` (a text per language):
`wmt14_translate/de-en`, `wmt_t2t_translate/de-en`, `ted_hrlr_translate/pt_to_en`, ... Records
are read through `tfds.data_source` (array_record), in the data set's record order. The sha256 of
a split's pairs is computed when the split is first read and cached beside the text sources'
caches, `<data_dir>/posenc/tfds/<name>/<config>/<version>/pairs.<split>.<src>-<tgt>.json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posenc.data import storage
from posenc.data.base import SOURCE_FIELD
from posenc.data.parallel_base import (
    SRC_LANG_FIELD,
    TGT_LANG_FIELD,
    Pair,
    ParallelSource,
    drop_empty,
    pairs_sha256,
)
from posenc.data.tfds_source import (
    canonical_splits,
    check_tfds_split,
    field_bytes,
    import_tfds,
    iter_records,
    require_array_record,
    tfds_builder,
)


def translation_prepare_command(name: str, data_dir: Path) -> str:
    """The shell command that prepares TFDS translation data set `name` under `data_dir`."""
    return (
        f"tfds build {name} --data_dir={data_dir} --file_format=array_record\n"
        f"  (or in Python: posenc.data.prepare_parallel('tfds:{name}', '{data_dir}'))"
    )


class TfdsParallelSource(ParallelSource):
    """A prepared TFDS translation data set as (source, target) pairs.

    Args:
      data_dir: TFDS data directory.
      name: TFDS name, `name[/config][:version]`.
      src_lang: source language, a key of the Translation feature; None: the other language
        when only the target is named (two-language builders), else the builder's supervised
        input.
      tgt_lang: target language; None: likewise, the other language or the supervised target.
      spec: the spec string to report.
    """

    def __init__(
        self,
        data_dir: Path,
        name: str,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        spec: str = "",
    ):
        self.spec = spec or f"tfds:{name}"
        self.name = name
        self.data_dir = Path(data_dir)
        builder = tfds_builder(name, self.data_dir)
        command = translation_prepare_command(name, self.data_dir)
        require_array_record(builder, self.spec, name, self.data_dir, command)
        tfds = import_tfds()
        features = builder.info.features
        if not isinstance(features, tfds.features.Translation):
            raise ValueError(
                f"{SOURCE_FIELD}={self.spec!r} is not a translation data set (its features are "
                f"{list(features.keys())}, not one tfds.features.Translation)"
            )
        languages = sorted(features.languages)
        supervised = builder.info.supervised_keys or (None, None)
        if len(languages) == 2 and bool(src_lang) != bool(tgt_lang):  # one side named
            other = [lang for lang in languages if lang != (src_lang or tgt_lang)]
            src_lang, tgt_lang = (src_lang, other[0]) if src_lang else (other[0], tgt_lang)
        src_lang = src_lang or supervised[0]
        tgt_lang = tgt_lang or supervised[1]
        if src_lang not in languages or tgt_lang not in languages or src_lang == tgt_lang:
            raise ValueError(
                f"{SRC_LANG_FIELD}={src_lang!r}, {TGT_LANG_FIELD}={tgt_lang!r}: {self.spec!r} has "
                f"no such language pair; its languages: {languages} (either direction)"
            )
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.languages = languages
        self.full_name: str = builder.info.full_name
        self._tfds_info = builder.info
        self.tfds_splits = canonical_splits(builder.info)
        self.splits = tuple(self.tfds_splits)
        self.cache_dir = self.data_dir / "posenc" / "tfds" / self.full_name
        self._pairs: dict[str, list[Pair]] = {}

    def check_split(self, split: str) -> str:
        """See `ParallelSource.check_split`; the error also lists the data set's split names."""
        check_tfds_split(self.spec, split, self._tfds_info)
        return super().check_split(split)

    def _meta_path(self, split: str) -> Path:
        return self.cache_dir / f"pairs.{split}.{self.src_lang}-{self.tgt_lang}.json"

    def pairs(self, split: str) -> list[Pair]:
        """See `ParallelSource.pairs`; reads the split on first use, then keeps it in memory."""
        split = self.check_split(split)
        if split not in self._pairs:
            tfds = import_tfds()
            data_source = tfds.data_source(
                self.name,
                split=self.tfds_splits[split],
                data_dir=str(self.data_dir),
                download=False,
            )
            pairs = [
                (
                    field_bytes(record, self.src_lang).decode("utf-8"),
                    field_bytes(record, self.tgt_lang).decode("utf-8"),
                )
                for record in iter_records(data_source)
            ]
            dropped = 0
            if split == "train":
                pairs, dropped = drop_empty(pairs)
            meta = {"pairs": len(pairs), "sha256": pairs_sha256([(split, pairs)])}
            if split == "train":
                meta["dropped_empty"] = dropped
            storage.atomic_write_json(self._meta_path(split), meta)
            self._pairs[split] = pairs
        return list(self._pairs[split])

    def info(self) -> dict[str, Any]:
        """See `ParallelSource.info`; pair counts and hashes appear for splits read so far (their
        sha256 is of that split's pairs: the TFDS name and version identify the whole)."""
        splits: dict[str, Any] = {}
        for split, tfds_split in self.tfds_splits.items():
            entry: dict[str, Any] = {
                "tfds_split": tfds_split,
                "examples": int(self._tfds_info.splits[tfds_split].num_examples),
            }
            if self._meta_path(split).exists():
                entry.update(storage.read_json(self._meta_path(split)))
            splits[split] = entry
        return {
            "spec": self.spec,
            "kind": "parallel-tfds",
            "tfds_name": self.full_name,
            "data_dir": str(self.data_dir),
            "src_lang": self.src_lang,
            "tgt_lang": self.tgt_lang,
            "languages": self.languages,
            "splits": splits,
        }


def prepare_tfds_parallel(
    name: str, data_dir: Path, src_lang: str | None = None, tgt_lang: str | None = None
) -> TfdsParallelSource:
    """Downloads and prepares a TFDS translation data set in array_record format (the one
    user-invoked step that may download), then opens it."""
    builder = tfds_builder(name, data_dir)
    if not builder.is_prepared():
        builder.download_and_prepare(file_format="array_record")
    return TfdsParallelSource(data_dir, name, src_lang, tgt_lang)
