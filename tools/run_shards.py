"""Run the main cell's tests as shards side by side, then print each shard's output in turn.

The tests wait on the processes and servers they start far more than they compute (one pytest
keeps about a third of a core busy), so shards side by side take far less time than one after
another. Each ``--shard`` gives one shard's paths (directories or files), in order; one more shard
runs every other test under ``tests``. Shard N has ``TEST_SHARD=N`` (tests/settings.py gives it
its own test database and Redis databases) and a temporary directory of its own (``TMPDIR``: the
registry of this host's worker processes, and every temporary file, apart). Exits with the first
failing shard's status.

    python tools/run_shards.py --pytest .venv/bin/pytest --shard "tests/a tests/b" --shard tests/c -- -m "not soak"
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _stopped(process: subprocess.Popen[str]) -> None:
    """A shard still running when this one stops (Ctrl-C, an error) is stopped with it."""
    if process.poll() is None:
        process.terminate()
        process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pytest", required=True, help="the pytest executable")
    parser.add_argument("--shard", action="append", required=True, dest="shards",
                        help="the paths of one shard, space-separated (repeat for each shard but the last)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: arguments for every shard")
    options = parser.parse_args()
    shards = [paths.split() for paths in options.shards]
    listed = [path for paths in shards for path in paths]
    missing = [path for path in listed if not (ROOT / path).exists()]
    if missing:
        parser.error(f"--shard names paths that do not exist: {missing}")
    if empty := [index for index, paths in enumerate(shards) if not paths]:
        parser.error(f"--shard {empty[0]} names no path")  # pytest would run every test in it
    if twice := sorted({path for path in listed if listed.count(path) > 1}):
        parser.error(f"--shard names paths twice: {twice}")
    extra = [arg for arg in options.pytest_args if arg != "--"]
    commands = [*([options.pytest, *paths, *extra] for paths in shards),
                [options.pytest, "tests", *(f"--ignore={path}" for path in listed), *extra]]
    began = time.monotonic()
    statuses: list[int] = []
    with ExitStack() as stack:
        runs = []
        for index, command in enumerate(commands):
            # Short (a server's Unix socket path under it must stay within 107 bytes) and open to
            # every user as /tmp is (embedded PostgreSQL's initdb runs as another user than root).
            tmp = tempfile.mkdtemp(prefix=f"shard{index}-")
            os.chmod(tmp, 0o1777)
            stack.callback(shutil.rmtree, tmp, ignore_errors=True)
            log = stack.enter_context(tempfile.TemporaryFile(mode="w+"))
            env = {**os.environ, "TEST_SHARD": str(index), "TMPDIR": tmp}
            process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
            stack.callback(_stopped, process)
            runs.append((command, log, process))
        for index, (command, log, process) in enumerate(runs):
            statuses.append(process.wait())
            log.seek(0)
            print(f"===== shard {index}: {' '.join(command[1:])}\n", flush=True)
            shutil.copyfileobj(log, sys.stdout)
            print(f"===== shard {index} exited {statuses[-1]}", flush=True)
    print(f"===== {len(runs)} shards in {time.monotonic() - began:.0f} s", flush=True)
    return next((status for status in statuses if status != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
