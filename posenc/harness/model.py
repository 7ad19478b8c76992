"""The ``posenc`` model of EleutherAI's lm-evaluation-harness: any posenc run directory (trained,
or imported by ``posenc import-hf``) scored by the harness's tasks.

    posenc harness run --model posenc --model_args workdir=runs/rope,max_length=512 \\
        --tasks lambada_openai --output_path runs/rope/harness

Model arguments (``--model_args``, comma-separated ``key=value``, or a JSON object):

- ``workdir`` (required): the run directory (:func:`posenc.load_run`).
- ``max_length``: the scoring window in tokens; default the run's training length
  (``train.seq_len``). A length a layer's encoder cannot represent (a learned position table
  shorter than it) is refused.
- ``max_gen_toks``: tokens generated when a task gives no ``max_gen_toks`` (default 256).
- ``batch_size``: windows per batch, or ``auto`` (sized from ``eval.memory_budget`` as ``posenc
  eval`` sizes them); the harness's ``--batch_size`` sets it too.
- any key with a dot: an evaluation-time override of the run's config, as ``posenc eval
  --config.<field>=<value>`` takes it (``encoding.hparams.scaling=yarn``,
  ``encoding.hparams.factor=4``, ``model.attention_impl=blocked``); a value with commas (a
  tuple) needs the JSON form of ``--model_args``. What ``posenc eval`` may not change is refused.

The harness's ``device`` and ``max_batch_size`` are accepted and not used (JAX places the model on
its default device). What each request computes is :mod:`posenc.harness.scoring`'s:
``loglikelihood`` tokenizes as the harness's Hugging Face model does (``context + continuation``
encoded whole, split where the context's own encoding ends; trailing spaces of the context move
to the continuation; an empty context is the :func:`~posenc.harness.scoring.prefix_token`),
``loglikelihood_rolling`` sums :meth:`~posenc.harness.scoring.HarnessScorer.rolling`'s per-token
losses, and ``generate_until`` cuts posenc's greedy continuation at the first stop sequence
(``until``), at the document separator and at ``max_gen_toks`` tokens.
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from posenc.harness.scoring import HarnessScorer, prefix_token

NAME = "posenc"
DEFAULT_MAX_GEN_TOKS = 256
# What the harness itself passes to every model (simple_evaluate's additional_config).
_HARNESS_ARGS = ("device", "max_batch_size", "trust_remote_code")
_OWN_ARGS = ("workdir", "max_length", "max_gen_toks", "batch_size")


def parse_model_args(args: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """posenc's model arguments and the ``field=value`` overrides among ``args`` (the keys
    with a dot); a one-line ``ValueError`` for any other key."""
    own, overrides = {}, []
    for key, value in args.items():
        if "." in key:
            text = value if isinstance(value, str) else repr(value)
            overrides.append(f"{key}={text}")
        elif key in _OWN_ARGS:
            own[key] = value
        elif key not in _HARNESS_ARGS:
            raise ValueError(
                f"model argument {key!r} is not one posenc knows: give workdir, max_length, "
                "max_gen_toks, batch_size, or a config field with a dot (encoding.hparams."
                "scaling=yarn) to change at evaluation"
            )
    if not own.get("workdir"):
        raise ValueError("model argument workdir is required: --model_args workdir=<run directory>")
    return own, overrides


def _batch_size(value: Any) -> int | None:
    """``batch_size`` as rows, or None (``auto``: sized from the memory budget)."""
    if value is None or (isinstance(value, str) and value.startswith("auto")):
        return None
    try:
        rows = int(value)
    except (TypeError, ValueError):
        rows = 0
    if rows < 1 or isinstance(value, bool) or str(rows) != str(value).strip():
        raise ValueError(f"batch_size must be a positive integer or auto, got {value!r}")
    return rows


@register_model(NAME)
class PosencLM(TemplateLM):
    """A posenc run as an lm-evaluation-harness model (module docstring)."""

    backend = "causal"

    @classmethod
    def create_from_arg_obj(cls, arg_dict, additional_config=None):
        """The model from ``--model_args`` (a dict), which win over the harness's own
        ``--batch_size`` (always given on its command line, 1 by default)."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(**{**extra, **dict(arg_dict)})

    @classmethod
    def create_from_arg_string(cls, arg_string, additional_config=None):
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    def __init__(self, **args: Any):
        super().__init__()
        from posenc.runs.trained import load_run
        from posenc.workdir import RunDir

        own, overrides = parse_model_args(args)
        workdir = str(own["workdir"])
        RunDir(workdir).read_config()  # a folder that is not a run: one line, nothing loaded
        self.run = load_run(workdir, overrides)
        max_length = own.get("max_length", self.run.config.train.seq_len)
        if isinstance(max_length, str) and max_length.strip().isdigit():  # JSON's "256"
            max_length = int(max_length)
        self.scorer = HarnessScorer(self.run, max_length, _batch_size(own.get("batch_size")))
        self.max_gen_toks = int(own.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
        if self.max_gen_toks < 1:
            raise ValueError(f"max_gen_toks must be a positive integer, got {self.max_gen_toks}")
        self.overrides = overrides

    # -- tokens

    @property
    def max_length(self) -> int:
        return self.scorer.max_length

    @property
    def eot_token_id(self) -> int:
        return int(self.run.tokenizer.sep_id)

    @property
    def prefix_token_id(self) -> int:
        return prefix_token(self.run.tokenizer)

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs
    ) -> list[int]:
        """The run's tokenizer without special tokens (as ``posenc eval``'s streams hold text)."""
        return [int(t) for t in self.run.tokenizer.encode(string)]

    def tok_decode(self, tokens: Any, **kwargs) -> str:
        return self.run.tokenizer.decode(tokens)

    # -- requests

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        pairs = [(context, continuation) for _, context, continuation in requests]
        out = self.scorer.continuations(pairs)
        for (key, _, _), answer in zip(requests, out, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        texts = [req.args[0] for req in requests]
        docs = [self.tok_encode(t) for t in tqdm(texts, disable=disable_tqdm, desc="Tokenizing")]
        out = [-float(losses.sum()) for losses in self.scorer.rolling(docs)]
        for text, answer in zip(texts, out, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), answer)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out: list[str | None] = [None] * len(requests)
        groups: dict[tuple[int, tuple[str, ...]], list[int]] = {}
        for i, req in enumerate(requests):
            num_new, until = self._generation_settings(req.args[1])
            groups.setdefault((num_new, until), []).append(i)
        for (num_new, until), indices in groups.items():
            prompts = [self.tok_encode(requests[i].args[0]) for i in indices]
            for i, tokens in zip(indices, self.scorer.generate(prompts, num_new), strict=True):
                out[i] = cut_at_stop(self.run.tokenizer, tokens, until)
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
        return out

    def _generation_settings(self, gen_kwargs: dict[str, Any]) -> tuple[int, tuple[str, ...]]:
        """``(max_gen_toks, stop sequences)`` of a request; sampling is refused in one line."""
        kwargs = dict(gen_kwargs or {})
        if kwargs.get("do_sample") or float(kwargs.get("temperature", 0) or 0) > 0:
            raise ValueError(
                "the posenc model decodes greedily: give do_sample=False and temperature=0 "
                "(--gen_kwargs do_sample=False,temperature=0)"
            )
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        num_new = int(kwargs.get("max_gen_toks", self.max_gen_toks))
        return num_new, tuple(until)


def cut_at_stop(tokenizer, tokens, until) -> str:
    """The text of ``tokens`` up to the document separator and the first stop sequence."""
    ids = [int(t) for t in tokens]
    if tokenizer.sep_id in ids:
        ids = ids[: ids.index(tokenizer.sep_id)]
    text = tokenizer.decode(ids)
    cuts = [text.find(s) for s in until if s and s in text]
    return text[: min(cuts)] if cuts else text
