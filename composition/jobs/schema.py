"""A job's payload schema, taken from its signature: argument names and simple annotated types.

A payload that does not fit can never succeed, so it raises ``PayloadValidationError`` (permanent):
a deploy that changes a job's arguments shows up as one group of dead letters, not endless retries.
Only JSON's own types are checked, with their unions: ``list[X]`` checks each element with X, and
``dict[K, V]`` each value with V and, when K is ``str``, each key (JSON makes every key a string,
so a ``dict[int, V]``'s keys are left alone). Any other annotation is accepted as it comes, and a
container of one is checked as a container only (``list[Invoice]`` as a list).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, NoReturn

from composition.errors import PayloadValidationError

__all__ = ["PayloadSchema"]

_SIMPLE: tuple[type, ...] = (int, float, str, bool, list, dict, type(None))


@dataclass(frozen=True)
class _Misfit:
    """A value that does not fit: the argument itself (``path`` ""), or one inside it at ``path``
    (``[1]``, ``['eur']``), a dict's key there when ``key``."""

    value: Any
    path: str = ""
    key: bool = False

    def inside(self, step: str) -> _Misfit:
        return replace(self, path=step + self.path)

    def described(self, argument: str) -> str:
        found = type(self.value).__name__
        if self.key:
            return f"{found} key in {argument}{self.path}"
        return f"{found} at {argument}{self.path}" if self.path else found


# A checker answers what of a decoded JSON value does not fit, or None when it all fits.
_Checker = Callable[[Any], _Misfit | None]


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
    """A checker and a readable name for ``annotation``, or None when it is not checked."""
    if annotation is None or annotation is type(None):
        return (lambda value: None if value is None else _Misfit(value)), "None"
    if annotation in _SIMPLE:
        return (lambda value: None if _fits(value, annotation) else _Misfit(value)), annotation.__name__
    origin = typing.get_origin(annotation)
    if origin is list:
        return _list_checker(typing.get_args(annotation))
    if origin is dict:
        return _dict_checker(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        members = [_checker(arg) for arg in typing.get_args(annotation)]
        if any(member is None for member in members):
            return None
        checks = [member[0] for member in members if member is not None]
        name = " | ".join(member[1] for member in members if member is not None)
        return _union_check(checks), name
    return None


def _list_checker(args: tuple[Any, ...]) -> tuple[_Checker, str]:
    element = _checker(args[0]) if len(args) == 1 else None
    if element is None:
        return (lambda value: None if isinstance(value, list) else _Misfit(value)), "list"
    check_element, element_name = element

    def check(value: Any) -> _Misfit | None:
        if not isinstance(value, list):
            return _Misfit(value)
        for index, item in enumerate(value):
            if (misfit := check_element(item)) is not None:
                return misfit.inside(f"[{index}]")
        return None

    return check, f"list[{element_name}]"


def _dict_checker(args: tuple[Any, ...]) -> tuple[_Checker, str]:
    values = _checker(args[1]) if len(args) == 2 else None
    if values is None:
        return (lambda value: None if isinstance(value, dict) else _Misfit(value)), "dict"
    check_value, value_name = values
    key_type = args[0]
    # A JSON object's keys are strings: checked as ints, a worker's every message would be refused.
    checks_keys = key_type is str

    def check(value: Any) -> _Misfit | None:
        if not isinstance(value, dict):
            return _Misfit(value)
        for key, item in value.items():
            if checks_keys and not isinstance(key, str):
                return _Misfit(key, key=True)
            if (misfit := check_value(item)) is not None:
                return misfit.inside(f"[{key!r}]")
        return None

    return check, f"dict[{getattr(key_type, '__name__', key_type)}, {value_name}]"


def _union_check(checks: list[_Checker]) -> _Checker:
    def check(value: Any) -> _Misfit | None:
        misfits = []
        for member in checks:
            if (misfit := member(value)) is None:
                return None
            misfits.append(misfit)
        # A member whose container fitted says more (an element's misfit) than the value's type.
        return next((misfit for misfit in misfits if misfit.path or misfit.key), _Misfit(value))

    return check


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
                if name in kwargs and (misfit := check(kwargs[name])) is not None:
                    self._raise_type(name, label, misfit)
            return
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise PayloadValidationError(
                f"payload for {self.actor_name} does not fit its arguments: {self._mismatch(args, kwargs) or exc}"
            ) from None
        for name, value in bound.arguments.items():
            checked = self.checks.get(name)
            if checked is not None and (misfit := checked[0](value)) is not None:
                self._raise_type(name, checked[1], misfit)

    def _raise_type(self, name: str, label: str, misfit: _Misfit) -> NoReturn:
        raise PayloadValidationError(
            f"payload for {self.actor_name}: argument {name!r} must be {label}, got {misfit.described(name)}")

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
