"""The template's machinery, out of the reading path. Managed by the looptpl template.

Read train.py (the loop), distributed.py (the strategy) and your own files: those are the run.
The modules here carry out what train.py calls in one line (checkpoints, data order, logs, config,
error messages); you never need to open them to follow a run. Your files import from two of
them only: `kit.api` (what a step returns, what a hook sees, the schedules) and `kit.config`.
"""
