"""scripts/slurm.sbatch of a JAX project, on a pretend one-node Slurm allocation of two tasks (stand-ins for
srun and scontrol): JAX's own Slurm detection joins the two processes into one run; a process killed
part-way makes srun stop the other, the script starts both again with --resume, and the run ends as an
uninterrupted one."""

import os
import shutil
import stat
import sys

import pytest
from conftest import jax_run, looptpl, records, run

# srun: start the command once per task, as Slurm would on this node; --kill-on-bad-exit: when a task
# fails, SIGTERM to the others, SIGKILL a few seconds later (Slurm's KillWait: a process waiting on the dead
# one in a collective cannot stop on its own), and exit with the failed task's status.
SRUN = """#!/bin/bash
while [[ $1 == -* ]]; do shift; done
pids=()
for ((task = 0; task < SLURM_NTASKS; task++)); do
    SLURM_PROCID=$task SLURM_LOCALID=$task SLURM_NODEID=0 "$@" &
    pids+=($!)
done
status=0
for ((ended = 0; ended < ${#pids[@]}; ended++)); do
    wait -n && continue
    code=$?
    if ((status == 0)); then
        status=$code
        kill "${pids[@]}" 2>/dev/null
        (sleep 3; kill -9 "${pids[@]}" 2>/dev/null) &
    fi
done
exit $status
"""

# hooks.py of the run: process 1 kills itself after update 6 of the job's first attempt (the checkpoint of
# update 4 is finished by then).
KILLING_HOOKS = """import os
import signal
from pathlib import Path


class Hooks:
    def __init__(self, config):
        self.marker = Path(config.run_dir).parent / "killed-once"

    def after_update(self, run):
        if run.step == 6 and run.rank == 1 and not self.marker.exists():
            self.marker.write_text("")
            os.kill(os.getpid(), signal.SIGKILL)
"""

FLAGS = ("--cpu-devices", "1", "--epochs", "2", "--checkpoint-every", "4", "--log-every", "1", "--no-progress")


def test_the_slurm_script_joins_the_processes_and_restarts_them_after_a_kill(tmp_path):
    project = tmp_path / "slurmed"
    created = looptpl("new", str(project), "--backend", "jax", "--strategy", "data-parallel", "--defaults")
    assert created.exit_code == 0, created.stderr
    sources = tmp_path / "sources"
    shutil.copytree(project / "src", sources)
    (sources / "slurmed" / "hooks.py").write_text(KILLING_HOOKS)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"srun": SRUN, "scontrol": "#!/bin/bash\necho localhost\n"}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    environment = {
        "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
        "PYTHONPATH": str(sources),
        "OMP_NUM_THREADS": "1",
        **{"SLURM_JOB_ID": str(os.getpid()), "SLURM_JOB_NAME": "test", "SLURM_NTASKS": "2", "SLURM_NNODES": "1"},
        **{"SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_NODELIST": "localhost"},
        **{"RUN_DIR": str(tmp_path / "run"), "MAX_RESTARTS": "1"},
    }
    slurm = run(["bash", "scripts/slurm.sbatch", *FLAGS], cwd=project, timeout=600, env=environment)
    assert slurm.returncode == 0, slurm.stdout[-5000:]
    assert "cpu, 2 devices" in slurm.stdout  # one run of the two processes
    assert (tmp_path / "killed-once").exists()
    assert "slurm.sbatch: a process failed (srun exit status 137); restarting every process (1 of 1)" in slurm.stdout
    one = jax_run(project, tmp_path / "one", *FLAGS)
    for first, second in zip(one, records(tmp_path / "run"), strict=True):
        for name in ("train_loss", "val_loss"):
            assert second[name] == pytest.approx(first[name], rel=1e-5), name
