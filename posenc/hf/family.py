"""What a pretrained family is: a mapping from a Hugging Face config and weight names onto
posenc's model options, registered encoders and parameter paths, both ways.

A family (one module of :mod:`posenc.hf`, registered with :func:`register`) provides:

- ``read(hf, names)``: the :class:`Spec` of a ``config.json`` (read strictly through
  :class:`~posenc.hf.fields.HFConfig`) and the checkpoint's tensor names;
- ``rules(spec)``: one :class:`Rule` per Hugging Face tensor: its name and shape, the posenc
  parameters it fills, and the functions from one layout to the other;
- ``write(spec)``: the ``config.json`` of the same model (export), after ``fits(spec)`` found
  nothing posenc's model has that the family cannot hold.

What several families share lives here too, so that a family module states only its own
names and options: the layouts of one tensor (:func:`linear`, :func:`heads_in`,
:func:`fused_per_head`, ...), whole layers named alike by more than one family
(:func:`separate_attention`, :func:`megatron_layer`), and the reading and writing of the sizes
every config holds (a family's table of names: :data:`SIZES`, :func:`read_sizes`,
:func:`write_sizes`, :func:`read_model`).

Positions always map onto a registered encoder (``rope`` with its scaling hyperparameters,
``learned``, ``alibi``, ``t5``): a family adds no position code. Differences between families
are options of :class:`~posenc.layers.config.ModelConfig` named by mechanism; no layer asks which
family it belongs to.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from posenc.attention.options import OPTION_FIELDS, AttentionOptions
from posenc.hf.fields import HFConfig
from posenc.layers.config import ModelConfig

# A parameter's path in the model's state, e.g. ("blocks", 0, "attn", "q").
Path = tuple[str | int, ...]


@dataclasses.dataclass(frozen=True)
class Spec:
    """A model as posenc builds it: what a family reads from a config, or a run config holds.

    Attributes:
      model: the architecture options.
      assembly: ``"lm"`` (decoder-only) or ``"encoder_decoder"``.
      encoding: a registered encoder name.
      hparams: its hyperparameters.
      train_len: the length the model was trained at (``max_position_embeddings``, or RoPE
        scaling's ``original_max_position_embeddings``); a run's ``train.seq_len``.
      extra: family facts that are not options of posenc's model (recorded in provenance).
      layers: per-layer kinds exactly as a run config's ``layers`` section holds them
        (``{"pattern": (kind, ...), "kinds": {kind: {"encoding": ..., "hparams": ...,
        "window": ..., ...}}}``, :mod:`posenc.layers.pattern`); empty: every layer alike. An
        imported family names its kinds after transformers' layer types
        (:mod:`posenc.hf.layer_types`).
      ignored: the config's fields that no transformers model of its type reads, by name
        (:meth:`~posenc.hf.fields.HFConfig.finish`; recorded in provenance, not exported).
    """

    model: ModelConfig
    assembly: str
    encoding: str
    hparams: dict[str, Any]
    train_len: int
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    layers: dict[str, Any] = dataclasses.field(default_factory=dict)
    ignored: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def pattern(self) -> tuple[str, ...]:
        """The layer pattern (empty: every layer alike)."""
        return tuple(self.layers.get("pattern", ()))

    @property
    def kinds(self) -> dict[str, dict[str, Any]]:
        """Each kind's fields (empty without a pattern)."""
        return {k: dict(v) for k, v in self.layers.get("kinds", {}).items()}


@dataclasses.dataclass(frozen=True)
class Rule:
    """One Hugging Face tensor and the posenc parameters it holds.

    Attributes:
      hf: the tensor's name in the checkpoint.
      shape: its shape, as the config says it must be.
      paths: the posenc parameters it fills (several for a fused projection).
      load: Hugging Face array (then one per ``also``) -> one posenc array per path (float32).
      save: posenc arrays (one per path) -> the Hugging Face array (float32).
      also: further ``(name, shape)`` tensors ``load`` reads, folded into the same parameters
        (BERT's token-type row into its position table); export writes them separately.
    """

    hf: str
    shape: tuple[int, ...]
    paths: tuple[Path, ...]
    load: Callable[..., tuple[np.ndarray, ...]]
    save: Callable[..., np.ndarray]
    also: tuple[tuple[str, tuple[int, ...]], ...] = ()


class Family:
    """Base class of a pretrained family (module docstring)."""

    # Registry key (also recorded in provenance).
    name: ClassVar[str] = ""
    # The config.json `model_type`s this family reads.
    model_types: ClassVar[tuple[str, ...]] = ()
    # The model_type and architecture it writes on export.
    export_type: ClassVar[str] = ""
    export_architecture: ClassVar[str] = ""
    # Tensors a checkpoint may hold that transformers does not load either (buffers).
    ignored_suffixes: ClassVar[tuple[str, ...]] = ()
    # Special token ids whose defaults in the family's config class name tokens of its own
    # vocabulary (SmolLM3's 128004 padding): export writes them null unless the imported config
    # named them, so that transformers builds a model of another vocabulary.
    null_token_ids: ClassVar[tuple[str, ...]] = ()

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        raise NotImplementedError

    def rules(self, spec: Spec) -> list[Rule]:
        raise NotImplementedError

    def keep(self, spec: Spec, read: Callable[[str], np.ndarray], names: set[str]) -> Spec:
        """``spec`` with checkpoint tensors that posenc's model does not hold as they are but
        export must write back (``read(name)`` gives one) added to ``spec.extra``, which
        ``pretrained.json`` records (BERT's token-type table). None by default."""
        del read, names
        return spec

    def export_rules(self, spec: Spec) -> list[Rule]:
        """The rules export writes: :meth:`rules`, plus any tensor the Hugging Face model has
        and posenc's does not (:func:`zero_tensor`)."""
        return self.rules(spec)

    def from_parts(self, extra: dict[str, Any], parts: dict[str, np.ndarray]) -> dict[str, Any]:
        """``extra`` completed from an imported run's ``pretrained_parts.safetensors`` (the
        arrays :meth:`head_rules` wrote) where it lacks what :meth:`keep` would have added (a
        run imported before :meth:`keep` existed). Unchanged by default."""
        del parts
        return extra

    def head_rules(self, spec: Spec, names: set[str]) -> list[Rule]:
        """Rules for the parts of a sequence classifier (:mod:`posenc.models.classifier`) that
        the checkpoint holds beside its language model (BERT's token-type table and pooler):
        what ``posenc train --init-from`` of an imported run starts the classifier's own parts
        from; ``names`` are the checkpoint's tensors (a part it lacks starts fresh). None by
        default."""
        del spec, names
        return []

    def fits(self, spec: Spec) -> list[str]:
        """What of ``spec`` this family cannot hold (empty: it can be exported as this family)."""
        raise NotImplementedError

    def write(self, spec: Spec) -> dict[str, Any]:
        """The ``config.json`` fields of ``spec`` (``fits(spec)`` is empty); ``model_type`` and
        ``architectures``, when given, override :attr:`export_type` and
        :attr:`export_architecture` (a family that reads several types, e.g. Llama and Qwen2)."""
        raise NotImplementedError


# -- layouts ---------------------------------------------------------------------------------


def copy(hf: str, path: Path, shape: tuple[int, ...], scale: float = 1.0) -> Rule:
    """The same array on both sides (norm weights, biases, tables); ``scale`` multiplies it on
    the way in (and divides on the way out)."""
    return Rule(hf, shape, (path,), lambda a: (a * scale,), lambda a: a / scale)


def zero_tensor(hf: str, shape: tuple[int, ...]) -> Rule:
    """A Hugging Face tensor posenc's model lacks (a bias it was trained without): zeros."""
    return Rule(hf, shape, (), lambda a: (), lambda: np.zeros(shape, np.float32))


def zero_attention_biases(spec: Spec, attention: str, qkv: str, out: str) -> list[Rule]:
    """Zeros for the fused query/key/value bias ``attention.format(i) + qkv`` and the output
    bias ``... + out`` of every layer that posenc's model trained without (export)."""
    m = spec.model
    zeros = []
    for i in range(m.num_layers):
        prefix = attention.format(i)
        if not m.qkv_bias:
            zeros.append(zero_tensor(prefix + qkv, (3 * m.num_heads * m.dims.head_dim,)))
        if not m.out_bias:
            zeros.append(zero_tensor(prefix + out, (m.model_dim,)))
    return zeros


def linear(hf: str, path: Path, n_in: int, n_out: int) -> Rule:
    """``torch.nn.Linear``'s ``[out, in]`` weight <-> posenc's ``[in, out]`` kernel."""
    return Rule(hf, (n_out, n_in), (path,), lambda w: (w.T,), lambda k: k.T)


def conv1d(hf: str, path: Path, n_in: int, n_out: int) -> Rule:
    """GPT-2's ``Conv1D`` weight, already ``[in, out]``."""
    return Rule(hf, (n_in, n_out), (path,), lambda w: (w,), lambda k: k)


def heads_in(hf: str, path: Path, d: int, h: int, dh: int, scale: float = 1.0) -> Rule:
    """A query/key/value projection ``[h * dh, d]`` <-> ``[d, h, dh]`` (times ``scale`` in)."""
    return Rule(
        hf,
        (h * dh, d),
        (path,),
        lambda w: (w.T.reshape(d, h, dh) * scale,),
        lambda k: k.reshape(d, h * dh).T / scale,
    )


def heads_out(hf: str, path: Path, h: int, dh: int, d: int) -> Rule:
    """The output projection ``[d, h * dh]`` <-> ``[h, dh, d]``."""
    return Rule(
        hf, (d, h * dh), (path,), lambda w: (w.T.reshape(h, dh, d),), lambda k: k.reshape(-1, d).T
    )


def head_bias(hf: str, path: Path, h: int, dh: int) -> Rule:
    """A projection's bias ``[h * dh]`` <-> ``[h, dh]``."""
    return Rule(hf, (h * dh,), (path,), lambda b: (b.reshape(h, dh),), lambda b: b.reshape(-1))


def fused_per_head(
    hf: str, paths: tuple[Path, Path, Path], d: int, h: int, dh: int, *, bias: bool
) -> Rule:
    """GPT-NeoX's and BLOOM's fused ``query_key_value``: rows grouped by head, each head's
    ``[q; k; v]`` (``view(.., h, 3 * dh)``): ``[3 h dh, d]`` <-> ``q, k, v [d, h, dh]``, or
    the bias ``[3 h dh]`` <-> ``[h, dh]`` each."""

    def load(w):
        w = w.reshape(h, 3, dh, *w.shape[1:])  # [h, 3, dh, (d)]
        if bias:
            return tuple(w[:, i] for i in range(3))
        return tuple(w[:, i].transpose(2, 0, 1) for i in range(3))  # [d, h, dh]

    def save(q, k, v):
        parts = [p if bias else p.transpose(1, 2, 0) for p in (q, k, v)]  # [h, dh, (d)]
        return np.stack(parts, axis=1).reshape(3 * h * dh, *parts[0].shape[2:])

    shape = (3 * h * dh,) if bias else (3 * h * dh, d)
    return Rule(hf, shape, paths, load, save)


# -- the registry ----------------------------------------------------------------------------

_FAMILIES: dict[str, Family] = {}
_loaded = False


def register(cls: type[Family]) -> type[Family]:
    """Registers a family class under ``cls.name`` (a class decorator)."""
    if not cls.name or not cls.model_types:
        raise ValueError(f"{cls.__name__} needs a name and model_types")
    _FAMILIES[cls.name] = cls()
    return cls


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        package = importlib.import_module("posenc.hf")
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"posenc.hf.{module.name}")


def families() -> dict[str, Family]:
    """The registered families by name, in registration order."""
    _load()
    return dict(_FAMILIES)


def model_types() -> list[str]:
    """Every ``model_type`` some family reads, sorted."""
    return sorted(t for f in families().values() for t in f.model_types)


def for_model_type(model_type: str, source: str) -> Family:
    """The family that reads ``model_type``; a one-line error lists the supported ones."""
    for family in families().values():
        if model_type in family.model_types:
            return family
    raise ValueError(
        f"{source}: model_type {model_type!r} is not supported by posenc's import; supported: "
        f"{', '.join(model_types())}"
    )


def get(name: str) -> Family:
    """The family registered as ``name``."""
    found = families().get(name)
    if found is None:
        raise ValueError(f"unknown pretrained family {name!r}; known: {', '.join(families())}")
    return found


# -- pieces every decoder-only family shares -------------------------------------------------

# transformers' own names of a model's sizes (PretrainedConfig's standard attributes, which a
# model's `attribute_map` renames): config.json key -> ModelConfig field, in the order export
# writes them. A family whose config names them otherwise (GPT-2's n_embd, T5's d_model) states
# its own table; one table serves both directions, so import and export cannot disagree.
SIZES = {
    "vocab_size": "vocab_size",
    "hidden_size": "model_dim",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "intermediate_size": "mlp_dim",
}


def read_sizes(hf: HFConfig, keys: Mapping[str, str] = SIZES) -> dict[str, int]:
    """The ``ModelConfig`` sizes a config holds under ``keys`` (config key -> field), each
    required."""
    return {field: hf.count(key) for key, field in keys.items()}


def write_sizes(m: ModelConfig, keys: Mapping[str, str] = SIZES) -> dict[str, int]:
    """The ``config.json`` fields of ``m``'s sizes: :func:`read_sizes` backwards."""
    return {key: getattr(m, field) for key, field in keys.items()}


def read_model(
    hf: HFConfig,
    names: set[str],
    sizes: dict[str, int],
    *,
    head: str = "lm_head.weight",
    tied: bool = True,
    **options: Any,
) -> ModelConfig:
    """The ``ModelConfig`` of a Hugging Face model: its ``sizes`` (:func:`read_sizes`) and the
    family's ``options``, in float32 (import and loading set the dtype they are asked for),
    embeddings not scaled by ``sqrt(D)`` (posenc's default does; of the families here only
    Gemma's scale them, which set it after),
    and a head of its own when :func:`untied` finds one. ``head`` is that tensor's name and
    ``tied`` the family's default for ``tie_word_embeddings``; both default to transformers'
    own (``*ForCausalLM``'s ``lm_head``, ``PretrainedConfig``'s tied embeddings)."""
    return ModelConfig(
        **sizes,
        dtype="float32",
        tie_embeddings=not untied(hf, names, head, default=tied),
        scale_embeddings=False,
        **options,
    )


def plain_heads(m: ModelConfig) -> dict[str, tuple[int | None, int]]:
    """The :func:`common_misfits` needs of a family without grouped-query heads or a head width
    of its own: one key/value head per query head, each ``D / H`` wide."""
    return {"num_kv_heads": (None, m.num_heads), "head_dim": (None, m.model_dim // m.num_heads)}


def embeddings(spec: Spec, embed: str, head: str, prefix: Path = ()) -> list[Rule]:
    """The token table and output projection: ``embed`` ``[V, D]`` and, when posenc's model has
    its own (or scales its embeddings by ``sqrt(D)``, which the families using this do not), the
    head ``[V, D]``. A scaled posenc table is written scaled, with the unscaled table as the
    head (so the exported model computes what posenc's does)."""
    m = spec.model
    v, d = m.vocab_size, m.model_dim
    scale = math.sqrt(d) if m.scale_embeddings else 1.0
    table = (*prefix, "embed", "embedding")
    rules = [copy(embed, table, (v, d), scale=1.0 / scale)]
    if not m.tie_embeddings:
        rules.append(linear(head, (*prefix, "unembed", "kernel"), d, v))
    elif scale != 1.0:  # export only: an imported model is never scaled
        rules.append(Rule(head, (v, d), (table,), lambda w: (w,), lambda e: e))
    return rules


def hf_tied(spec: Spec) -> bool:
    """Whether the Hugging Face model ties its head to its table (see :func:`embeddings`)."""
    return spec.model.tie_embeddings and not spec.model.scale_embeddings


def untied(hf: HFConfig, names: set[str], head: str, default: bool) -> bool:
    """Whether posenc's model needs a separate head: the config unties it, or the checkpoint
    holds one anyway (transformers then keeps both when they differ)."""
    return not hf.take("tie_word_embeddings", default) or head in names


def common_misfits(spec: Spec, family: str, **needs: Any) -> list[str]:
    """What of ``spec`` a family cannot hold, for the options every family checks: the
    assembly, the encoder, per-layer kinds (unless ``needs`` has ``layers=True``: the family
    writes them and checks the kinds itself), and each ``ModelConfig`` field named in ``needs``
    with the value (or tuple of values) the family needs."""
    m = spec.model
    out = []
    if spec.pattern and not needs.pop("layers", False):
        out.append(f"layers.pattern={spec.pattern!r} (per-layer kinds)")
    needs.pop("layers", None)
    if spec.assembly != needs.pop("assembly", "lm"):
        out.append(f"model.assembly={spec.assembly!r}")
    encoding = needs.pop("encoding")
    if spec.encoding != encoding:
        out.append(f"encoding {spec.encoding!r} (a {family} model has {encoding!r})")
    if m.mem_len:
        out.append("model.mem_len (Transformer-XL memory)")
    if m.attention_impl in ("linear", "linear_performer"):
        out.append(f"model.attention_impl={m.attention_impl!r}")
    options, plain = m.attention_options(), AttentionOptions()
    for field in OPTION_FIELDS:
        if field not in needs and getattr(options, field) != getattr(plain, field):
            out.append(f"model.{field}={getattr(options, field)!r} (an attention option)")
    for field, default in _LATER_FIELDS.items():
        if field not in needs and getattr(m, field) != default:
            out.append(f"model.{field}={getattr(m, field)!r}")
    for field, allowed in needs.items():
        allowed = allowed if isinstance(allowed, tuple) else (allowed,)
        if getattr(m, field) not in allowed:
            out.append(
                f"model.{field}={getattr(m, field)!r} (needs {' or '.join(map(repr, allowed))})"
            )
    return out


# ModelConfig fields added after most families were written, at the value those families hold:
# a family that can hold another value names the field in common_misfits' needs.
_LATER_FIELDS = {
    "norm_unit_offset": False,
    "output_softcap": 0.0,
    "output_logit_scale": 1.0,  # issue 32: Cohere2's logit_scale
}


# transformers' activation names (ACT2FN) -> posenc's MLP kinds; "gelu" is the exact one.
ACTIVATIONS = {
    "gelu": "gelu_exact",
    "gelu_new": "gelu",
    "gelu_fast": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "relu": "relu",
}


# posenc's MLP kinds -> the transformers name export writes for each (ACTIVATIONS backwards).
ACT_NAMES = {"gelu_exact": "gelu", "gelu": "gelu_new", "relu": "relu"}


def activation(hf: HFConfig, key: str, default: str) -> str:
    """The posenc MLP kind of the config's activation ``key`` (refusing others)."""
    return ACTIVATIONS[hf.expect(key, tuple(ACTIVATIONS), default)]


def layernorm(hf: str, path: Path, d: int) -> list[Rule]:
    """A LayerNorm's ``weight`` and ``bias`` (``hf`` is the module's name)."""
    return [copy(hf + ".weight", (*path, "scale"), (d,)), copy(hf + ".bias", (*path, "bias"), (d,))]


def dense(hf: str, path: Path, n_in: int, n_out: int) -> list[Rule]:
    """A biased ``nn.Linear``: its weight and bias onto an ``nnx.Linear``'s kernel and bias."""
    return [
        linear(hf + ".weight", (*path, "kernel"), n_in, n_out),
        copy(hf + ".bias", (*path, "bias"), (n_out,)),
    ]


def dense_mlp(wi: str, wo: str, at: Path, d: int, f: int) -> list[Rule]:
    """A two-layer MLP of biased ``nn.Linear``s ``wi`` (``D -> F``) and ``wo`` (``F -> D``)
    onto the block ``at``'s ``mlp.wi`` and ``mlp.wo``."""
    return dense(wi, (*at, "mlp", "wi"), d, f) + dense(wo, (*at, "mlp", "wo"), f, d)


def prefix_of(names: set[str], probe: str, prefix: str) -> str:
    """``prefix`` when the checkpoint's names carry it (saved from the LM class), else ``""``
    (saved from the base model class, as GPT-2's and BLOOM's Hub files are)."""
    return prefix if prefix + probe in names else ""


# -- layers several families name alike ------------------------------------------------------


def separate_attention(
    modules: tuple[str, str, str, str], at: Path, d: int, h: int, dh: int
) -> list[Rule]:
    """Biased query, key, value and output ``nn.Linear``s (BERT's, OPT's), named ``modules``
    (without ``.weight``), onto the attention ``at``'s ``q, k, v [D, H, Dh]``, ``o [H, Dh, D]``
    and their biases (``[H, Dh]``, ``[D]``)."""
    *qkv, out = modules
    rules = []
    for module, n in zip(qkv, ("q", "k", "v"), strict=True):
        rules.append(heads_in(module + ".weight", (*at, n), d, h, dh))
        rules.append(head_bias(module + ".bias", (*at, f"{n}_bias"), h, dh))
    rules.append(heads_out(out + ".weight", (*at, "o"), h, dh, d))
    rules.append(copy(out + ".bias", (*at, "o_bias"), (d,)))
    return rules


def megatron_layer(hf: str, attention: str, at: Path, m: ModelConfig) -> list[Rule]:
    """One block as Megatron-LM's code names it, which GPT-NeoX and BLOOM kept: under ``hf``,
    ``input_layernorm`` and ``post_attention_layernorm``; the attention module ``attention``
    (``attention.`` or ``self_attention.``) with its per-head fused ``query_key_value``
    (:func:`fused_per_head`) and ``dense``; ``mlp.dense_h_to_4h`` and ``mlp.dense_4h_to_h``.
    The attention biases are mapped where posenc's model has them (``qkv_bias``, ``out_bias``):
    BLOOM's checkpoints always hold both, GPT-NeoX's as its ``attention_bias`` says, and a
    posenc-trained model may lack either (the family's ``export_rules`` writes zeros)."""
    d, h, dh, f = m.model_dim, m.num_heads, m.dims.head_dim, m.mlp_dim
    attn = hf + attention
    qkv = tuple((*at, "attn", n) for n in ("q", "k", "v"))
    rules = layernorm(hf + "input_layernorm", (*at, "attn_norm"), d)
    rules += layernorm(hf + "post_attention_layernorm", (*at, "mlp_norm"), d)
    rules.append(fused_per_head(attn + "query_key_value.weight", qkv, d, h, dh, bias=False))
    rules.append(heads_out(attn + "dense.weight", (*at, "attn", "o"), h, dh, d))
    if m.qkv_bias:
        biases = tuple((*at, "attn", f"{n}_bias") for n in ("q", "k", "v"))
        rules.append(fused_per_head(attn + "query_key_value.bias", biases, d, h, dh, bias=True))
    if m.out_bias:
        rules.append(copy(attn + "dense.bias", (*at, "attn", "o_bias"), (d,)))
    return rules + dense_mlp(hf + "mlp.dense_h_to_4h", hf + "mlp.dense_4h_to_h", at, d, f)


def llama_attention_mlp(hf: str, at: Path, m: ModelConfig) -> list[Rule]:
    """The attention and MLP of a Llama-style layer as Llama, Cohere, Gemma, OLMo and their
    successors name them (``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``, each with
    its bias where ``m`` has one) under ``hf``, onto the block ``at``; its norms are the
    family's."""
    d, h, kv, dh, f = m.model_dim, m.num_heads, m.kv_heads, m.dims.head_dim, m.mlp_dim
    attn, mlp = hf + "self_attn.", hf + "mlp."
    rules = [
        heads_in(attn + "q_proj.weight", (*at, "attn", "q"), d, h, dh),
        heads_in(attn + "k_proj.weight", (*at, "attn", "k"), d, kv, dh),
        heads_in(attn + "v_proj.weight", (*at, "attn", "v"), d, kv, dh),
        heads_out(attn + "o_proj.weight", (*at, "attn", "o"), h, dh, d),
        linear(mlp + "gate_proj.weight", (*at, "mlp", "wg", "kernel"), d, f),
        linear(mlp + "up_proj.weight", (*at, "mlp", "wi", "kernel"), d, f),
        linear(mlp + "down_proj.weight", (*at, "mlp", "wo", "kernel"), f, d),
    ]
    if m.qkv_bias:
        rules += [
            head_bias(attn + f"{n}_proj.bias", (*at, "attn", f"{n}_bias"), heads, dh)
            for n, heads in (("q", h), ("k", kv), ("v", kv))
        ]
    if m.out_bias:
        rules.append(copy(attn + "o_proj.bias", (*at, "attn", "o_bias"), (d,)))
    if m.mlp_bias:
        rules += [
            copy(mlp + f"{n}_proj.bias", (*at, "mlp", w, "bias"), (size,))
            for n, w, size in (("gate", "wg", f), ("up", "wi", f), ("down", "wo", d))
        ]
    return rules


def nullable(hf: HFConfig, key: str, default: Any) -> Any:
    """``key``'s value where an explicit ``null`` means "off" (Gemma's soft caps): the value as
    written, null included, and ``default`` (the config class's) only when the key is absent."""
    hf.take(key, None)
    return hf.fields[key] if key in hf.fields else default
