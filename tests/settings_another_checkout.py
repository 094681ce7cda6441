"""The tests' settings under another module: another project's identity on the same host and
services (``composition.lifecycle.pids``), as another checkout of the project would have."""

from tests.settings import *  # noqa: F403
