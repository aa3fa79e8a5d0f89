"""The artifacts for JAX users: jax-tpu-embedding's SparseCore input format and its FDO limits.

jax itself is imported only where a jax.Array is asked for; the layout, the records and the limits are numpy.
"""
