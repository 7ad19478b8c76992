"""The per-instruction profile: self times that add up, names that are the program's own."""

import jax
import jax.numpy as jnp
import pytest

from posenc.benchmark import profile as prof


def test_self_times_subtract_nested_events_and_keep_sequential_ones():
    # A loop [0, 10) holding two body events [1, 4) and [5, 9); then a dot [10, 12).
    events = [(0, 10, "while"), (1, 4, "body.a"), (5, 9, "body.b"), (10, 12, "dot")]
    assert sorted(prof._self_times(events)) == sorted(
        [("while", 3), ("body.a", 3), ("body.b", 4), ("dot", 2)]
    )


def test_loop_body_is_counted_once_and_names_are_the_compiled_instructions():
    def f(x):
        return jax.lax.fori_loop(0, 8, lambda i, y: jnp.tanh(y @ x) * 0.5, x)

    x = jnp.full((128, 128), 0.01)
    compiled = jax.jit(f).lower(x).compile()
    text = compiled.as_text()
    rows, wall = prof.profile(lambda: compiled(x), steps=3, compiled_text=text)

    known = prof.instructions(text)
    assert rows and all(r.instruction.name in known for r in rows)
    loop = [r for r in rows if r.instruction.opcode == "while"]
    body = [r for r in rows if "/while/body/" in r.instruction.op_name]
    assert len(loop) == 1 and body
    assert all(r.calls == pytest.approx(8) for r in body)  # once per iteration
    # The loop's own time is its bookkeeping, not its body's again: the times add up to at
    # most the wall time (counting the body twice would give about twice it).
    assert loop[0].seconds < 0.5 * sum(r.seconds for r in body)
    assert sum(r.seconds for r in rows) <= 1.05 * wall


def test_steps_must_be_positive():
    with pytest.raises(ValueError, match="steps"):
        prof.profile(lambda: None, steps=0, compiled_text="")
