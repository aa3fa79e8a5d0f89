"""The artifacts for JAX users: reading jax-tpu-embedding's SparseCore input from the shards, its specs and FDO limits.

`input` (`input_iterator`), `specs` (jax-tpu-embedding's feature specs of a model) and `limits` (its FDO files).
jax's stacking and CSR packing are in `tpu_embed.sparsecore.jax_layout`, its records in
`tpu_embed.artifact.jax_records`. jax itself is imported only where a jax.Array is asked for; the rest is numpy.
"""
