"""`omni-realtime ARGS` run in this process through the CLI's own `main`, with what a subprocess would show:
its exit code, stdout and stderr (argparse's own exits included). It saves the 3-4 s of imports a fresh
process pays; the real entry point (`python -m realtime.cli`) keeps subprocess tests of its own.

`main` runs in a thread, so that a run that does not end (a check that let `serve` start) fails the test after
`timeout` s as a subprocess's timeout would, instead of hanging the suite. `main` sets up logging (the root
logger's handler and level) and `serve` sets torch's thread count: both are put back afterwards, so the run
leaves this test process as it found it."""

from __future__ import annotations

import io
import logging
import threading
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

import torch

from realtime.cli import main


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, timeout: float = 120) -> Ran:
    root = logging.getLogger()
    handlers, level, threads = root.handlers[:], root.level, torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    result: list = []

    def call() -> None:
        try:
            result.append(main(list(args)))
        except SystemExit as e:  # argparse: --help, --version and its usage errors
            result.append(e.code if isinstance(e.code, int) else (0 if e.code is None else 1))
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread
            result.append(e)

    try:
        with redirect_stdout(out), redirect_stderr(err):
            worker = threading.Thread(target=call, daemon=True)
            worker.start()
            worker.join(timeout)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        torch.set_num_threads(threads)
    assert result, f"omni-realtime {' '.join(args)} still running after {timeout} s; stderr:\n{err.getvalue()}"
    if isinstance(result[0], BaseException):
        raise result[0]
    return Ran(result[0], out.getvalue(), err.getvalue())
