"""`python -m looptpl` and the `looptpl` script: the CLI, cancelled in one line from the first instant.

Signals are handled before Typer (about 0.1 s of imports) is loaded, so a Ctrl-C or SIGTERM during
start-up prints the same one line as one during a command, not a traceback.
"""

from looptpl import signals


def main() -> None:
    signals.install()
    try:
        from looptpl.cli import main as run

        run()
    except (signals.Cancelled, KeyboardInterrupt):
        signals.report()
    except Exception:
        if signals.cancelled:
            signals.report()
        raise
    finally:  # the command is over: Python's own exit would put back the default handlers, and a signal
        signals.ignore()  # then would kill the process with the project already in place


if __name__ == "__main__":
    main()
