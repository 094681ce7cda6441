"""``Operations``: a proxy of ``DeadLetter`` that gives the operations page its admin address
(``/admin/composition/operations/``), its line in the admin index and its permission."""

from __future__ import annotations

from composition.jobs.models import DeadLetter


class Operations(DeadLetter):
    class Meta:
        proxy = True
        app_label = "composition"
        verbose_name = "operations"
        verbose_name_plural = "operations"
        # No add/change/delete: the page only shows. Viewing it needs this permission (or a
        # superuser), granted like any other in the admin.
        default_permissions = ("view",)
