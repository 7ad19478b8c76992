"""The ``pallas`` check: the Pallas flash-attention kernel (:mod:`posenc.attention.pallas`)
equals the ``einsum`` reference, forward and gradients (``q``, ``k``, ``v`` and the encoder's
parameters), for every encoder the kernel takes.

Off a GPU the kernel runs in Pallas's interpret mode, which is slow to compile, so the kernel
has this check of its own rather than a place among ``paths_agree``'s float32 paths (posenc's
suite runs it for a few encoders by default and every encoder in the slow step).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc.attention import core as attention
from posenc.encodings.base import Encoding
from posenc.testing._harness import (
    NotApplicable,
    Settings,
    fail,
    finite_or_recompiled,
    label,
    max_error,
    resolve,
)

# Gradients go through the blocked path's recomputation and the reference's softmax: float32
# round-off of sums over a few dozen terms.
_GRAD_TOLERANCE = 1e-4


def refused_by_pallas(enc: Encoding, settings: Settings) -> str | None:
    """Why the check cannot apply to ``enc``: the kernel refuses it (None: it runs)."""
    try:
        attention.check_implementation(enc.bind(settings.dims), "pallas")
    except ValueError as err:
        return f"the path refuses it ({err})"
    return None


def check_pallas(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """The ``pallas`` path equals ``einsum`` on ``check_paths_agree``'s inputs (each row at its
    offset, then randomized positions; ``T`` queries over ``T + extra_keys`` keys, tiles of the
    largest power of two at most ``block_size``), forward within ``tolerance`` and gradients of
    a random projection of the output within ``1e-4``; causal and, for an encoder that serves
    bidirectional attention, without the mask."""
    settings = settings or Settings()
    enc = resolve(encoder)
    reason = refused_by_pallas(enc, settings)
    if reason:
        raise NotApplicable(f"pallas does not apply to {label(enc)}: {reason}")
    _compare(enc, settings, causal=True)
    both_ways = resolve(encoder, bidirectional=True)
    try:
        both_ways.check_causal(False)
    except ValueError:
        return
    if not both_ways.causal_only:
        _compare(both_ways, settings, causal=False)


def _compare(enc: Encoding, settings: Settings, causal: bool) -> None:
    dims = settings.dims
    bound = enc.bind(dims)
    params = bound.init(jax.random.key(settings.seed), dims)
    b, t = len(settings.offsets), settings.length
    s = t + settings.extra_keys
    rng = np.random.default_rng(settings.seed)
    q, k, v = (
        jnp.asarray(rng.standard_normal((b, n, dims.num_heads, dims.head_dim)), jnp.float32)
        for n in (t, s, s)
    )
    weights = jnp.asarray(rng.standard_normal((b, t, dims.num_heads, dims.head_dim)), jnp.float32)
    contiguous = np.asarray(settings.offsets)[:, None] + np.arange(s)
    randomized = np.stack(
        [np.sort(rng.choice(settings.max_position, s, replace=False)) for _ in settings.offsets]
    )

    def compute(jit):
        def loss(q, k, v, params, k_pos, impl):
            out = attention.attend(
                q,
                k,
                v,
                encoding=bound,
                params=params,
                q_pos=k_pos[:, s - t :],
                k_pos=k_pos,
                causal=causal,
                implementation=impl,
                block_size=settings.block_size,
            )
            return jnp.sum(out * weights), out

        def both(k_pos):
            results = {}
            for impl in ("einsum", "pallas"):
                grad = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
                grads, out = grad(q, k, v, params, k_pos, impl)
                results[impl] = (out, grads)
            return results

        run = jit(both)
        return [run(jnp.asarray(pos, jnp.int32)) for pos in (contiguous, randomized)]

    results = finite_or_recompiled(compute, f"{label(enc)}'s pallas and einsum gradients")
    direction = "" if causal else "causal=False, "
    for where, result in zip(("offsets", "randomized positions"), results, strict=True):
        (ref_out, ref_grads), (out, grads) = result["einsum"], result["pallas"]
        ref_out, out = np.asarray(ref_out), np.asarray(out)
        if not np.allclose(out, ref_out, rtol=settings.tolerance, atol=settings.tolerance):
            raise fail(
                enc,
                "pallas",
                f"the pallas path's output differs from einsum's ({max_error(out, ref_out)}; "
                f"{direction}{where})",
            )
        names = ("q", "k", "v", "params")
        for name, ref_g, got_g in zip(names, ref_grads, grads, strict=True):
            for path, ref_leaf in jax.tree_util.tree_leaves_with_path(ref_g):
                got_leaf = np.asarray(_at(got_g, path))
                ref_leaf = np.asarray(ref_leaf)
                if not np.allclose(got_leaf, ref_leaf, rtol=_GRAD_TOLERANCE, atol=_GRAD_TOLERANCE):
                    what = name + jax.tree_util.keystr(path)
                    raise fail(
                        enc,
                        "pallas",
                        f"the pallas path's gradient of {what} differs from einsum's "
                        f"({max_error(got_leaf, ref_leaf)}; {direction}{where})",
                    )


def _at(tree, path):
    for key in path:
        tree = tree[key.key] if hasattr(key, "key") else tree[key.idx]
    return tree
