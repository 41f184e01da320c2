"""Runs in .venv-qwen-tts: one process that runs the reference scripts one after another, so that the reference
package (about 11 s of imports) is imported once per test session, not once per script: as the process starts,
while the tests before the first job run (conftest starts it when collection ends).

Reads one JSON job a line on stdin: [log_path, script, *args]. Runs the script as `python script *args` would
(its __main__, with sys.argv set), its stdout and stderr going to log_path, then writes `done RC` on stdout
(0, or 1 after a traceback in the log). Ends at the end of stdin."""

from __future__ import annotations

import json
import runpy
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout, suppress

if __name__ == "__main__":
    # the package the scripts share, imported before the first job comes; should that fail, the first job's
    # log shows the error with its traceback
    with suppress(Exception):
        import qwen_tts  # noqa: F401

    reply = sys.stdout
    for line in sys.stdin:
        log_path, *argv = json.loads(line)
        rc = 0
        with open(log_path, "w") as log, redirect_stdout(log), redirect_stderr(log):
            sys.argv = argv
            try:
                runpy.run_path(argv[0], run_name="__main__")
            except BaseException:  # noqa: BLE001 - reported through the log and the exit code
                traceback.print_exc()
                rc = 1
        print(f"done {rc}", file=reply, flush=True)
