"""A byte-level causal language model trained on Python's own standard library"""

from .kit.moved import keep_old_import_paths

keep_old_import_paths(__name__)  # files written before kit/ existed import `.config` and the like
