"""The planner: profile statistics -> SparseCore limits, in small stages, one module each.

    sources.resolve      which statistics describe each stack of the target configuration
    enumerate            candidate limit settings per stack (requested quantile, p50..max, TF defaults)
    estimate             expected drops and memory of each setting on the profiled data
    propose              the chosen setting per stack + the one chip-wide id buffer setting
    partition            mod vs div balance, stacking and topology comparisons
    variants             what-if: other chip counts, SparseCores per chip and batches from the recorded steps
    assemble             the results as a `Plan` (profiles/plan_file.py)

`plan(...)` (run.py) runs them in that order; the plain data between them is in types.py.
"""

from profiles.planner.run import plan
from profiles.planner.types import Policy

__all__ = ["plan", "Policy"]
