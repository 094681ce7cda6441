"""System checks for ``COMPOSITION`` mistakes, reported by ``manage.py check`` (importing this
package registers them; ``composition.apps`` does).

Modules: ``settings`` (the general keys, the cache-aside and metrics settings), ``outbox`` (the
outbox's settings, and retention against the redelivery windows), ``load`` (backpressure and
shedding), ``queues`` (queue names in the settings that no job uses), ``deploy`` (schedules, a
pooled database, queued work the code cannot run), and ``common`` (what they share).
"""

from composition.checks.deploy import check_queued_work, check_schedules
from composition.checks.load import check_backpressure_settings, check_shedding_settings
from composition.checks.outbox import check_outbox_settings, check_retention_settings
from composition.checks.queues import check_queue_names
from composition.checks.settings import check_cache_settings, check_metrics_settings, check_settings

__all__ = ["check_backpressure_settings", "check_cache_settings", "check_metrics_settings", "check_outbox_settings",
           "check_queue_names", "check_queued_work", "check_retention_settings", "check_schedules", "check_settings",
           "check_shedding_settings"]
