"""Errors and warnings of the profiles package.

Errors name the file involved and the fix; warnings are specific subclasses
so callers (and tests) can filter them with `warnings.simplefilter`.
"""

from __future__ import annotations


class ProfileError(ValueError):
    """Base class: a profile file or directory cannot be used."""


class CorruptProfileError(ProfileError):
    """A profile file is not valid JSON (corrupt or truncated)."""


class SchemaVersionError(ProfileError):
    """A profile or plan file was written with a schema version this code does not read."""


class ProfileMismatchError(ProfileError):
    """A file's recorded configuration does not match its name/hash, or profiles of
    different configurations were merged."""


class MissingProfileError(ProfileError):
    """The statistics a plan needs are not in the profile directory."""


class ProfileWarning(UserWarning):
    """Base class of the planner's warnings."""


class InsufficientDataWarning(ProfileWarning):
    """The profile covers too few steps for the requested quantile to mean much."""


class ConfigurationMismatchWarning(ProfileWarning):
    """The statistics come from another configuration than the one being planned
    (another chip count via the candidate figures, other hosts, another model's stack)."""


class ConservativeBoundWarning(ProfileWarning):
    """A stack was never profiled as such; its limits are bounded from its tables' statistics."""


class StaleProfileWarning(ProfileWarning):
    """Files of one model in a directory were written by runs over different numbers of steps."""


class LimitOverflowWarning(ProfileWarning):
    """Planned max_ids_per_table / max_unique_ids_per_table are below what the profiled data needs.

    TF's host preprocessing (SortListOfSparseCoreCooTensors, TF 2.20) raises
    on such a step even with allow_id_dropping=True; only the id buffer
    (max_ids_per_chip_per_sample) drops ids.  So a partition quantile below
    'max' is an error budget, not a drop budget.
    """
