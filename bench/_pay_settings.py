"""The pay benchmark's settings: the tests' settings with ``_pay_urls`` as URLconf (the example's
URLs plus a plain pay view, the baseline of ``bench/bench_pay_http.py``)."""

from tests.settings import *  # noqa: F403
from tests.settings import COMPOSITION

ROOT_URLCONF = "_pay_urls"

# No worker runs during the benchmark, so every library pay leaves its receipt job on the
# `billing` queue. At the example's limit (10,000) a run of more than ~360 library pays/s over
# its ~28 s would be answered 503 from then on, and those count as failures. The limit stays
# set, so admission still measures the backlog as in production (the same work whatever the
# limit), but it cannot trip; the benchmark also empties the queue before every round.
COMPOSITION = {**COMPOSITION, "BACKPRESSURE_QUEUES": {**COMPOSITION["BACKPRESSURE_QUEUES"], "billing": 10**9}}
