"""Input files -> parsed chunks (Beam-free): listing and splits, the readers of each format, the parse.

* `splits`          — input files and their splits (byte ranges); `read_split` reads one in any format
* `records`         — what the readers yield (`RawBatch`, `DeadLetter`) and the errors of a read
* `source`          — ranged reads of a file, local or on an object store
* `csv_scan`        — CSV record boundaries, vectorised (any split can start reading at its first record)
* `csv_reader`, `parquet_reader`, `tfrecord_reader` — one reader per format
* `parse`           — Arrow batches -> labels, dense floats and per-feature tokens; dead letters
* `spill`           — `run` reads once: the vocabulary job's read kept for the shard job
* `chunk_sizes`     — the read's record: each chunk's valid examples, which the shard job's batches start from
"""
