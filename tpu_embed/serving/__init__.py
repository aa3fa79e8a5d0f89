"""Serving on raw features: the shards' raw -> id mapping in TensorFlow ops, and one SavedModel to export."""
