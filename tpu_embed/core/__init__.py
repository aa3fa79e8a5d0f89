"""The model and its building blocks, free of TensorFlow, Beam and numpy-heavy code.

`topology` (chips, SparseCores, hosts), `model` (the frozen table and feature
configurations every other package consumes), `optimizers` (the seed API's
optimizer parameters, which validate a table's optimizer), `canonical`
(canonical JSON and fingerprints), `permutation` (the deterministic shuffle),
`nest` (tf.nest's flattening order without TensorFlow), `lazy` (a package's
public names imported on first use) and `quiet` (TensorFlow's logs below errors
and its start-up lines muted, installed by `import tpu_embed` unless the user set
`TF_CPP_MIN_LOG_LEVEL`).

Nothing is imported here: `import tpu_embed` loads `core.quiet` alone, before anything imports TensorFlow.
"""
