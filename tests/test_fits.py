"""CheckedJit: one compilation per argument signature, whether described or real."""

import jax
import jax.numpy as jnp
import numpy as np

from posenc.devices.fits import CheckedJit


def test_a_compilation_from_shape_structs_serves_the_arrays_and_dtypes_select_another():
    checked = CheckedJit(lambda x, n: x * n, lambda *args: ("doubling", "nothing"))
    x = jnp.arange(6.0).reshape(2, 3)
    described = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    n = jnp.asarray(2.0, jnp.float32)  # not weak-typed, as its description
    checked.compile(described, jax.ShapeDtypeStruct((), n.dtype, sharding=n.sharding))
    np.testing.assert_array_equal(checked(x, n), 2 * np.arange(6.0).reshape(2, 3))
    assert len(checked._compiled) == 1  # the call reused the described compilation
    checked(x.astype(jnp.int32), jnp.asarray(2))
    assert len(checked._compiled) == 2
