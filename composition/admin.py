"""Admin screens: each subsystem registers its own; this module only imports them."""

from composition import operations_admin as _operations_admin  # noqa: F401
from composition.jobs import admin as _jobs_admin  # noqa: F401
from composition.jobs import ledger_admin as _ledger_admin  # noqa: F401
from composition.outbox import admin as _outbox_admin  # noqa: F401
