"""A small GPT trained on windows of Python's standard library text, as nanoGPT trains"""

from .kit.moved import keep_old_import_paths

keep_old_import_paths(__name__)  # files written before kit/ existed import `.config` and the like
