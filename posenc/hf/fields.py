"""Strict reading of a Hugging Face ``config.json``: every field is mapped, at its default, or
known not to change the forward pass; anything else is refused in one line.

A family's converter reads fields through :class:`HFConfig` (``take``, ``expect``, ``ignore``);
:meth:`HFConfig.finish` then refuses every field it did not read, unless it is one of
:data:`NOT_THE_MODEL` (bookkeeping, token ids, generation and training settings). A field that
would change the model and that posenc does not map (a quantisation, sliding-window attention,
a per-layer scale) therefore stops the import instead of giving silently different logits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# Fields of any config.json that do not change the logits of a forward pass: provenance, token
# ids, generation defaults, training-only settings (dropout, initialisation) and the output
# options of transformers' model classes.
NOT_THE_MODEL = frozenset(
    {
        "_name_or_path",
        "architectures",
        "auto_map",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "use_cache",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "initializer_range",
        "initializer_factor",
        "attention_dropout",
        "hidden_dropout",
        "classifier_dropout",
        "dropout_rate",
        "resid_pdrop",
        "embd_pdrop",
        "attn_pdrop",
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "torchscript",
        "use_bfloat16",
        "pruned_heads",
        "chunk_size_feed_forward",
        "id2label",
        "label2id",
        "problem_type",
        "finetuning_task",
        "task_specific_params",
        "tokenizer_class",
        "prefix",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "tf_legacy_loss",
        "n_ctx",  # GPT-2's duplicate of n_positions in old files
    }
)

_MISSING = object()


class HFConfig:
    """A ``config.json`` read field by field (module docstring).

    Args:
      fields: the parsed JSON object.
      family: the importing family's name, for messages.
      source: where the fields came from (a path), for messages.
    """

    def __init__(self, fields: Mapping[str, Any], family: str, source: str):
        self.fields = dict(fields)
        self.family = family
        self.source = source
        self._read: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.fields

    def take(self, key: str, default: Any = _MISSING) -> Any:
        """The value of ``key`` (``default`` when absent; required when no default is given)."""
        self._read.add(key)
        if key in self.fields and self.fields[key] is not None:
            return self.fields[key]
        if default is _MISSING:
            raise ValueError(
                f"{self.source}: config.json has no {key!r}, which {self.family} needs"
            )
        return default

    def count(self, key: str, default: Any = _MISSING) -> int:
        """The value of ``key``, refused (one line) unless it is a positive integer (a size or a
        length: ``max_position_embeddings: 0`` would import a run of length 0)."""
        value = self.take(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{self.source}: config.json {key}={value!r} must be a positive integer"
            )
        return value

    def expect(self, key: str, allowed: Iterable[Any], default: Any = _MISSING) -> Any:
        """The value of ``key``, refused (one line) unless it is one of ``allowed``."""
        value = self.take(key, default)
        allowed = tuple(allowed)
        if value not in allowed:
            shown = ", ".join(repr(a) for a in allowed)
            raise ValueError(
                f"{self.source}: config.json {key}={value!r} is not supported by posenc's "
                f"{self.family} import (supported: {shown})"
            )
        return value

    def ignore(self, *keys: str) -> None:
        """Marks fields as read that this family knows do not change the forward pass."""
        self._read.update(keys)

    def finish(self) -> None:
        """Refuses every field that was not read and is not :data:`NOT_THE_MODEL`."""
        left = sorted(k for k in self.fields if k not in self._read and k not in NOT_THE_MODEL)
        if left:
            key = left[0]
            more = f" (and {len(left) - 1} more: {', '.join(left[1:])})" if len(left) > 1 else ""
            raise ValueError(
                f"{self.source}: config.json field {key}={self.fields[key]!r} is not supported by "
                f"posenc's {self.family} import: posenc neither maps it nor knows it leaves the "
                f"logits unchanged{more}"
            )
