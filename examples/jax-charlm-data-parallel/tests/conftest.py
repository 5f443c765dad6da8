"""The tests work whether or not the project is installed: its src/ comes first for them and for the runs
they start. The runs share one compilation cache: each compiles the same update and evaluation, which JAX
then reads back instead of compiling again (half of a short run's time on a CPU)."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

SOURCES = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, SOURCES)
os.environ["PYTHONPATH"] = os.pathsep.join([SOURCES, *filter(None, [os.environ.get("PYTHONPATH")])])

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # one of this session's own, whatever a run compiles
    cache = tempfile.mkdtemp(prefix="jax-compilation-cache-")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
