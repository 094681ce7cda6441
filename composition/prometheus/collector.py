"""What a scrape serves: the merged multiprocess directory, read under the directory's shared
lock, or this process's default registry when multiprocess mode is off.

django-prometheus' export view and prometheus_client's own server build a plain
``MultiProcessCollector``, which reads the directory without any lock; with the archive merging
dead processes' files, such a read could catch a merge halfway (a process counted twice or not at
all). Every collector composition serves is this one.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from composition.prometheus.archive import interrupted, recover
from composition.prometheus.directory import LOCK_TIMEOUT_S, locked, multiproc_dir

__all__ = ["LockedMultiProcessCollector", "render", "scrape_registry"]

# A file's header: the used length (4 bytes) and padding (4 bytes).
_HEADER_BYTES = 8


@contextmanager
def _consistent(directory: Path, timeout_s: float) -> Iterator[None]:
    """The shared lock, on a directory where no merge is half done."""
    while True:
        with locked(directory, exclusive=False, timeout_s=timeout_s):
            if not interrupted(directory):
                yield
                return
        # A merger died after committing: finish its merge before anyone reads.
        with locked(directory, exclusive=True, timeout_s=timeout_s):
            recover(directory)


def _holds_samples(path: str) -> bool:
    # A process creates its file empty and sizes it right after (MmapedDict opens it "a+b", then
    # truncates it to its first size); a scrape between the two would fail on the empty file in
    # prometheus_client's reader. An empty file holds no sample yet, so leaving it out loses none.
    try:
        return os.stat(path).st_size >= _HEADER_BYTES
    except FileNotFoundError:  # a live gauge of a process marked dead meanwhile
        return False


class LockedMultiProcessCollector:
    """``MultiProcessCollector``'s merge of ``directory``, read whole under the shared lock.

    ``collect`` raises MetricsDirectoryBusy when the lock is not had within ``timeout_s``.
    """

    def __init__(self, directory: Path | str, *, timeout_s: float = LOCK_TIMEOUT_S) -> None:
        self.directory = Path(directory)
        self.timeout_s = timeout_s

    def collect(self) -> Iterable[Metric]:
        with _consistent(self.directory, self.timeout_s):
            # The files MultiProcessCollector.collect would read (its glob), and its own merge;
            # materialised inside the lock: the merge reads every file before it returns.
            files = [path for path in glob.glob(str(self.directory / "*.db")) if _holds_samples(path)]
            return list(MultiProcessCollector.merge(files, accumulate=True))


def scrape_registry() -> Collector:
    """The registry a scrape serves: ``PROMETHEUS_MULTIPROC_DIR`` merged under the lock when it
    is set (read at call time), else this process's default registry."""
    directory = multiproc_dir()
    if directory is None:
        return REGISTRY
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LockedMultiProcessCollector(directory))
    return registry


def render(registry: Collector, accept: str = "") -> tuple[bytes, str]:
    """The exposition body and its content type, in the format ``accept`` prefers (Prometheus
    text by default, OpenMetrics when asked), as prometheus_client's own server answers."""
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type
