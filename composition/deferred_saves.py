"""``save_with_commit``: an update of a row the caller holds, sent in one string with its
transaction's COMMIT rather than in a round trip of its own.

A write request commonly ends by changing the row it locked (an invoice marked paid under its
row lock) and committing. The UPDATE's answer tells the caller nothing it needs (the row is
there: it is locked), yet psycopg waits for it before the COMMIT goes out. On the composition
backend (``composition.db.postgresql``) ``save_with_commit`` holds that UPDATE as the library
holds its own rows (``composition.deferred_writes``): it goes with COMMIT, or with the next
statement when another comes first, so a read in the transaction still sees it. The example's
pay takes three round trips where it took four, which the pay benchmark shows
(bench/bench_pay_http.py).

What it keeps of ``Model.save(update_fields=...)``:

- The fields' ``pre_save`` run at the call, so an ``auto_now`` field is set on the instance.
- An update that finds no row fails: Django's save raises at the call; a held one fails the
  statement it went with, so at COMMIT ``atomic`` rolls the whole transaction back and raises
  the ``DatabaseError`` save raises (the model's ``NotUpdated`` on Django 6), naming the model
  and the id. Nothing is half-written, but the error comes later than the call, as for every
  held write: hold only the update of a row that cannot go away meanwhile, one locked in this
  transaction (``composition.locks.row_lock``).
- So does any other error of the UPDATE (a check constraint, a value too long for its column):
  it is raised where the statement went, most often at the end of the ``atomic`` block, with
  everything rolled back. Catch it around the block, not around the call. A field that is
  unique (or in a unique constraint) is saved at once: a concurrent transaction may take its
  value, and that conflict is the caller's to catch at the call.

When it cannot hold the update, it saves at once, exactly as ``Model.save(update_fields=...)``:
outside a transaction the server has begun, on another backend, for a model with
``pre_save``/``post_save`` receivers (they would run at the wrong time, or see no row),
a model with a ``save()`` of its own, multi-table inheritance, generated fields or a value
given as an expression (Django reads them back after a save), a unique field, or an unsaved
instance. It returns whether it held the update; ``update_fields=[]`` does nothing, as save.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from django.db import connections, router
from django.db.models import Field, Model, signals
from django.db.models.sql import UpdateQuery

from composition.deferred_writes import can_hold, hold_update

__all__ = ["save_with_commit"]


def save_with_commit(instance: Model, *, update_fields: Iterable[str], using: str | None = None) -> bool:
    """Save ``update_fields`` of ``instance`` (an existing row this transaction holds) with the
    transaction's COMMIT; True if the update was held, False if it was saved at once instead
    (see the module doc). Raises ValueError for a name that is not a field the model can save."""
    names = list(dict.fromkeys(update_fields))
    meta = instance._meta
    by_name = {name: field for field in meta.concrete_fields if not field.primary_key
               for name in (field.name, field.attname)}
    # What save() does first, for every relation, not only those saved: a related object saved
    # since it was assigned lends its id, and one still unsaved is refused (ValueError), here.
    instance._prepare_related_fields_for_save(operation_name="save")  # type: ignore[attr-defined]
    if not names:
        return False  # as save(update_fields=[]): nothing to do, nothing sent
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise ValueError(f"save_with_commit: {', '.join(map(repr, unknown))} are not fields {meta.label} can save")
    alias = using or router.db_for_write(type(instance), instance=instance)
    connection = connections[alias]
    # A field named twice (by name and by column name) is one assignment, as save() makes it.
    fields: list[Field] = list(dict.fromkeys(by_name[name] for name in names))
    if (not _holdable(instance) or not can_hold(connection) or _has_expression(instance, fields)
            or _unique(instance, fields)):
        instance.save(update_fields=names, using=alias)
        return False
    values: list[Any] = [(field, None, field.pre_save(instance, False)) for field in fields]
    # As save() updates: through the base manager, the row by its primary key.
    query = cast(UpdateQuery, type(instance)._base_manager.using(alias).filter(pk=instance.pk).query.chain(UpdateQuery))
    query.add_update_fields(values)
    query.annotations = {}
    sql, params = query.get_compiler(alias).as_sql()
    hold_update(connection, sql, params, model_label=meta.label, pk=instance.pk)
    instance._state.db = alias
    return True


def _unique(instance: Model, fields: list[Field]) -> bool:
    # A unique column is where another transaction may take the value first: that conflict is
    # raised at the call, by save(), where the caller can catch it.
    meta = instance._meta
    together = {name for group in meta.unique_together for name in group}
    constrained = {name for constraint in meta.total_unique_constraints for name in constraint.fields}
    return any(field.unique or field.name in together | constrained for field in fields)


def _has_expression(instance: Model, fields: list[Field]) -> bool:
    # An F() or other expression: save() reads the value it made back (Django 6), which a held
    # update cannot, so it saves at once.
    return any(hasattr(getattr(instance, field.attname, None), "resolve_expression") for field in fields)


def _holdable(instance: Model) -> bool:
    """Whether an UPDATE of the model's own table is all Model.save would do (see the module doc)."""
    meta = instance._meta
    concrete = meta.concrete_model or type(instance)
    if instance._state.adding or instance.pk is None or concrete._meta.parents:
        return False
    if type(instance).save is not Model.save:  # the model's own save() may do more than the UPDATE
        return False
    if any(getattr(field, "generated", False) for field in meta.concrete_fields):
        return False
    return not any(signal.has_listeners(sender) for signal in (signals.pre_save, signals.post_save)
                   for sender in {type(instance), concrete})
