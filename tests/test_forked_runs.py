"""The generated tests' forked runs (templates/shared/tests/forked_runs.py) start as a new process would."""

import os
import time

from conftest import forked_runs


def test_a_run_that_sets_a_variable_read_at_import_otherwise_gets_a_server_of_its_own(tmp_path):
    """TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, when imported: a run that turns oneDNN off must not be
    forked from a server that imported TensorFlow with it on (test_mistakes' NaN-data runs then passed
    alone and failed after any other test had started the server)."""
    (tmp_path / "parent.py").write_text("import os\n\nprint(os.getppid())\n")
    plain = {name: value for name, value in os.environ.items() if name not in forked_runs.READ_AT_IMPORT}

    def server_of(environment: dict[str, str]) -> int:
        log = tmp_path / f"run-{time.monotonic_ns()}.log"
        run = forked_runs.start(["python", "-m", "parent"], log, environment, ("json",), cwd=tmp_path)
        assert run.wait(timeout=60) == 0, log.read_text()
        return int(log.read_text())

    first = server_of(plain)
    assert server_of(plain) == first
    assert server_of({**plain, "TF_ENABLE_ONEDNN_OPTS": "0"}) != first
