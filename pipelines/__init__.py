"""The entry points (train, evaluate, ...) and their plumbing; Hydra and W&B live here, never in tape/.

No module here imports torch, Lightning or transformers at module level: every entry point
imports its plumbing before checking its arguments, and a typo must be reported in a second or
two, not after 15 s of imports. Heavy imports happen inside the functions that need them.
"""

from pipelines import hydra_conf  # noqa: F401 - registers the ${run_id:} and ${cwd:} that conf/ uses
