"""Models used only by the tests: observable effects of test jobs.

``Effect.key`` is deliberately not unique: a job that ran its effect twice must show up as two
rows, not be hidden by a constraint violation.
"""

from django.db import models


class Effect(models.Model):
    key = models.CharField(max_length=100, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The worker process that committed it, for a test that runs several (``TEST_HOST`` in its
    # environment); empty otherwise.
    host = models.CharField(max_length=40, default="", blank=True)


class Attempt(models.Model):
    """One run of a test job: which attempt it was and the backoff computed before it."""

    key = models.CharField(max_length=100, db_index=True)
    attempt = models.PositiveIntegerField()
    backoff_ms = models.IntegerField(null=True)


class Account(models.Model):
    """Data a job needs; a test "fixes the data" by creating the missing row."""

    name = models.CharField(max_length=100, unique=True)
