"""Which examples a GEPA run never saw, for checking its prompt afterwards (`gepa verify`).

`run_gepa` draws reflection minibatches from the first `num_train` rows of the train split and
scores candidates on the first `num_val` rows of the eval split. Held-out examples are the eval
rows after those; when an environment has one split (train and eval rows are the same list),
after both.
"""

from __future__ import annotations

from typing import Any

from workbench.errors import UserError
from workbench.store.runs import GepaRun


def held_out_start(run: GepaRun, train_rows: list[Any], eval_rows: list[Any]) -> int:
    """The first eval-split row the run never used. UserError when none is left."""
    one_split = train_rows[:5] == eval_rows[:5]
    start = max(run.num_val, run.num_train) if one_split else run.num_val
    if start >= len(eval_rows):
        used = f"the first {start} (validation{' and training' if one_split else ''})"
        raise UserError(
            f"no held-out examples: {run.env_id}'s eval split has {len(eval_rows)} examples and the GEPA "
            f"run used {used}; run GEPA with a smaller -N to keep some aside"
        )
    return start
