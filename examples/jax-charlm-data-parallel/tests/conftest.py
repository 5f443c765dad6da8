"""The tests work whether or not the project is installed: its src/ comes first for them and for the runs
they start."""

import os
import sys
from pathlib import Path

SOURCES = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, SOURCES)
os.environ["PYTHONPATH"] = os.pathsep.join([SOURCES, *filter(None, [os.environ.get("PYTHONPATH")])])
