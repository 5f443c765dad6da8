"""Start N processes of one run on this machine. Managed by the looptpl template.

    python -m charlm_dp.kit.launch --processes 2 -- --cpu-devices 1 --epochs 3

Each process is `python -m charlm_dp.train` with the flags after `--`, and JAX_COORDINATOR_ADDRESS
(127.0.0.1 and a free port), JAX_NUM_PROCESSES and JAX_PROCESS_ID, which distributed.py passes to
`jax.distributed.initialize`; process 0 hosts the coordinator. On several machines, set those three
on each and start train.py there (Slurm sets them for JAX itself).

When a process fails, the others get GRACE_S seconds to stop on their own (they usually fail the same
way, and say why), then are stopped; the launcher exits with the first failure's exit code. A SIGTERM
or Ctrl-C to the launcher is passed on to every process.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

GRACE_S = 10


def free_port() -> int:
    """A port nothing listens on right now, for the coordinator."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="Processes to start on this machine.")
    parser.add_argument("flags", nargs="*", help="train.py's flags, after --.")
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error(f"--processes must be at least 1, got {args.processes}")
    address = f"127.0.0.1:{free_port()}"
    processes = []
    for index in range(args.processes):
        environment = {
            **os.environ,
            "JAX_COORDINATOR_ADDRESS": address,
            "JAX_NUM_PROCESSES": str(args.processes),
            "JAX_PROCESS_ID": str(index),
        }
        command = [sys.executable, "-m", f"{__package__.rsplit('.', 1)[0]}.train", *args.flags]
        processes.append(subprocess.Popen(command, env=environment))

    def pass_on(signum: int, frame: object) -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    failed_at = None
    while any(process.poll() is None for process in processes):
        codes = [process.poll() for process in processes]
        if failed_at is None and any(code not in (None, 0) for code in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
            for process in processes:
                if process.poll() is None:
                    process.kill()
        time.sleep(0.1)
    return next((process.returncode for process in processes if process.returncode), 0)


if __name__ == "__main__":
    sys.exit(main())
