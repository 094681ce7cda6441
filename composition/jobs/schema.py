"""A job's payload schema, taken from its signature: argument names and simple annotated types.

A payload that does not fit can never succeed, so it raises ``PayloadValidationError`` (permanent):
a deploy that changes a job's arguments shows up as one group of dead letters, not endless retries.
Only JSON's own types (with their unions, ``list[...]`` and ``dict[...]``) are checked; any other
annotation is accepted as it comes.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NoReturn

from composition.errors import PayloadValidationError

__all__ = ["PayloadSchema"]

_SIMPLE: tuple[type, ...] = (int, float, str, bool, list, dict, type(None))
# A checker answers whether a decoded JSON value fits; None means "not checked".
_Checker = Callable[[Any], bool]


def _fits(value: Any, expected: type) -> bool:
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        # JSON true/false decode to bool, a subclass of int: not an int argument.
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, expected)


def _checker(annotation: Any) -> tuple[_Checker, str] | None:
    """A predicate and a readable name for ``annotation``, or None when it is not checked."""
    if annotation is None or annotation is type(None):
        return (lambda value: value is None), "None"
    if annotation in _SIMPLE:
        return (lambda value: _fits(value, annotation)), annotation.__name__
    origin = typing.get_origin(annotation)
    if origin in (list, dict):
        return (lambda value: isinstance(value, origin)), origin.__name__
    if origin in (typing.Union, types.UnionType):
        members = [_checker(arg) for arg in typing.get_args(annotation)]
        if any(member is None for member in members):
            return None
        checks = [member[0] for member in members if member is not None]
        name = " | ".join(member[1] for member in members if member is not None)
        return (lambda value: any(check(value) for check in checks)), name
    return None


@dataclass(frozen=True)
class PayloadSchema:
    """The argument names and checked types of one job function."""

    actor_name: str
    signature: inspect.Signature
    checks: Mapping[str, tuple[_Checker, str]]

    @classmethod
    def of(cls, fn: Callable[..., Any], actor_name: str) -> PayloadSchema:
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # an unresolvable forward reference: check names only
            hints = {}
        checks = {}
        named = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                 inspect.Parameter.KEYWORD_ONLY)
        for name, parameter in inspect.signature(fn).parameters.items():
            if parameter.kind in named and name in hints:
                checker = _checker(hints[name])
                if checker is not None:
                    checks[name] = checker
        return cls(actor_name, inspect.signature(fn), checks)

    def validate(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Raise PayloadValidationError naming the first argument that does not fit."""
        if not args and self._fits_by_keyword(kwargs):
            # What publish() and send(**kwargs) deliver, checked without Signature.bind (it runs
            # for every message): the same arguments, in the signature's order.
            for name, (check, label) in self._ordered_checks:
                if name in kwargs and not check(kwargs[name]):
                    self._raise_type(name, label, kwargs[name])
            return
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise PayloadValidationError(
                f"payload for {self.actor_name} does not fit its arguments: {self._mismatch(args, kwargs) or exc}"
            ) from None
        for name, value in bound.arguments.items():
            checked = self.checks.get(name)
            if checked is not None and not checked[0](value):
                self._raise_type(name, checked[1], value)

    def _raise_type(self, name: str, label: str, value: Any) -> NoReturn:
        raise PayloadValidationError(
            f"payload for {self.actor_name}: argument {name!r} must be {label}, got {type(value).__name__}")

    def _fits_by_keyword(self, kwargs: Mapping[str, Any]) -> bool:
        """Whether ``Signature.bind(**kwargs)`` would bind every key to a named argument and miss
        no required one (never said for a function taking ``**kwargs``: bind decides there)."""
        if self._keyword_names is None:
            return False
        keywords, required = self._keyword_names
        names = kwargs.keys()
        return names <= keywords and required <= names

    @cached_property
    def _keyword_names(self) -> tuple[frozenset[str], frozenset[str]] | None:
        """(the names an argument can be given by, the names that must be given, positional-only
        ones included), or None for a function taking ``**kwargs``."""
        kinds = inspect.Parameter
        parameters = self.signature.parameters.values()
        if any(p.kind is kinds.VAR_KEYWORD for p in parameters):
            return None
        keywords = frozenset(p.name for p in parameters if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY))
        required = frozenset(p.name for p in parameters
                             if p.default is kinds.empty and p.kind is not kinds.VAR_POSITIONAL)
        return keywords, required

    @cached_property
    def _ordered_checks(self) -> tuple[tuple[str, tuple[_Checker, str]], ...]:
        return tuple((name, self.checks[name]) for name in self.signature.parameters if name in self.checks)

    def _mismatch(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """Unexpected and missing argument names, both, so one message says the whole story."""
        parameters = self.signature.parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        positional = [name for name, p in parameters.items()
                      if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        given = set(positional[:len(args)]) | set(kwargs)
        unexpected = [] if takes_any else sorted(set(kwargs) - set(parameters))
        missing = [name for name, p in parameters.items()
                   if p.default is inspect.Parameter.empty and name not in given
                   and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        parts = []
        if unexpected:
            parts.append("unexpected keyword argument " + ", ".join(repr(name) for name in unexpected))
        if missing:
            parts.append("missing a required argument " + ", ".join(repr(name) for name in missing))
        return "; ".join(parts)
