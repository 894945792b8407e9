"""Custom estimators with parameters: what ``sweep(custom=...)`` accepts, checked and printed as specs.

``custom`` maps a name to one of
  ``fn``                                   spec ``py:name``, random (``trials`` trials per case)
  ``(fn, {"k": [16, 32], "mode": ["a"]})``  one setting per combination of the lists, a grid
  ``(fn, params, {"samples": "k", "deterministic": True})``
and ``fn(q, k, v, scale, causal, seed, **params)`` is called with the setting's values as keyword arguments (the
first six positionally, so a parameter may be called ``k`` when the function names its second argument otherwise).

The grid's order: keys in the order given, the first varying slowest (``itertools.product``), so
``{"k": [4, 16], "mode": ["a", "b"]}`` gives ``py:f(k=4,mode=a)``, ``py:f(k=4,mode=b)``, ``py:f(k=16,mode=a)``, ...
Values print canonically: an int as an int (``16``, numpy integers too), a float as Python's ``repr`` (which
reads back to the same float: ``0.1``, ``1e-05``, ``100.0``), ``True``/``False``, and a string of letters, digits
and ``_ . + -`` as itself. The spec and thus the case id (and so the draws) of each setting carry its values.
"""

from __future__ import annotations

import inspect
import itertools
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Tuple

PREFIX = "py:"
OPTIONS = ("samples", "deterministic")
_SIMPLE_TEXT = re.compile(r"[A-Za-z0-9_.+-]+")
_FORMS = ('write {"name": fn}, {"name": (fn, {"k": [16, 32]})} or '
          '{"name": (fn, {"k": [16, 32]}, {"samples": "k", "deterministic": True})}')


@dataclass
class CustomEstimator:
    """One entry of ``custom``, checked: the function, its keys with (canonical text, value) pairs in the order
    given, the samples knob ("" for none) and whether it is deterministic."""
    name: str
    fn: Callable
    params: List[Tuple[str, List[Tuple[str, Any]]]] = field(default_factory=list)
    samples: str = ""
    deterministic: bool = False

    @property
    def spec_name(self) -> str:
        return PREFIX + self.name

    def specs(self) -> List[str]:
        """The canonical specs of the grid, in its order (the first key varies slowest)."""
        if not self.params:
            return [self.spec_name]
        keys = [key for key, _ in self.params]
        return [f"{self.spec_name}({','.join(f'{k}={text}' for k, (text, _) in zip(keys, combo))})"
                for combo in itertools.product(*(values for _, values in self.params))]

    def declaration(self, wrapper: Callable) -> tuple:
        """What ``_core.sweep`` takes for this name: (wrapper, [(key, [text, ...])], knob, deterministic)."""
        return (wrapper, [(key, [text for text, _ in values]) for key, values in self.params], self.samples,
                self.deterministic)

    def keywords(self, spec: str) -> Dict[str, Any]:
        """The keyword arguments of the setting ``spec`` (a canonical spec of this estimator): each key's value as
        it was given; the samples knob's as an int (``sweep(samples=...)`` may set it to a value not listed)."""
        if not self.params:
            return {}
        body = spec[len(self.spec_name) + 1:-1]
        given = dict(item.split("=", 1) for item in body.split(","))
        values = {}
        for key, listed in self.params:
            text = given[key]
            values[key] = int(text) if key == self.samples else dict(listed)[text]
        return values


def _canonical(value, where: str) -> str:
    """The spec text of one parameter value (see the module's docstring), or a TypeError/ValueError saying what
    a spec can carry."""
    if isinstance(value, bool):  # before Integral: bool is an int to Python
        return repr(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{where}: {number!r} is not a finite number; a spec carries finite ints and floats")
        return repr(number)
    if isinstance(value, str):
        if not _SIMPLE_TEXT.fullmatch(value):
            raise ValueError(f"{where}: the string {value!r} cannot be printed into a spec; use letters, digits "
                             "and _ . + - only")
        return value
    raise TypeError(f"{where}: a {type(value).__name__} cannot be printed into a spec; use ints, floats, bools or "
                    "simple strings (and map them to objects inside your function)")


def _check_call(entry: CustomEstimator):
    """A TypeError now, rather than on every call, when fn cannot take (q, k, v, scale, causal, seed, **params),
    e.g. a parameter ``k`` while fn's second argument is also called ``k``."""
    try:
        signature = inspect.signature(entry.fn)
    except (TypeError, ValueError):  # builtins and some extension callables have none to read
        return
    keywords = {key: values[0][1] for key, values in entry.params}
    try:
        signature.bind(*range(6), **keywords)
    except TypeError as e:
        names = ", ".join(keywords)
        raise TypeError(f"custom[{entry.name!r}]: fn{signature} cannot be called as fn(q, k, v, scale, causal, seed"
                        f"{', ' if names else ''}{', '.join(f'{n}=...' for n in keywords)}): {e}. Take the six "
                        "arguments positionally (any names that differ from the parameters', e.g. fn(q, keys, "
                        "values, scale, causal, seed, *, k)) and each parameter as a keyword") from None


def parse_custom(custom: Mapping) -> List[CustomEstimator]:
    """Checks ``sweep``'s ``custom`` argument and returns its entries in the order given."""
    if not isinstance(custom, Mapping):
        raise TypeError(f"custom must be a dict; {_FORMS}")
    entries = []
    for label, item in custom.items():
        if not isinstance(label, str):  # its characters are the library's to check (register_custom)
            raise ValueError(f"custom name {label!r}: give the estimator's name as a string (the spec is py:NAME)")
        where = f"custom[{label!r}]"
        if isinstance(item, tuple):
            if len(item) not in (2, 3):
                raise TypeError(f"{where} is a tuple of {len(item)}; {_FORMS}")
            fn, params, options = item[0], item[1], (item[2] if len(item) == 3 else {})
        else:
            fn, params, options = item, {}, {}
        if not callable(fn):
            raise TypeError(f"{where}: {type(fn).__name__} is not callable: give a function "
                            f"fn(q, k, v, scale, causal, seed, **params); {_FORMS}")
        if not isinstance(params, Mapping):
            raise TypeError(f"{where}: the parameters must be a dict of lists, e.g. {{'k': [16, 32]}}, "
                            f"not a {type(params).__name__}")
        if not isinstance(options, Mapping):
            raise TypeError(f"{where}: the options must be a dict, e.g. {{'samples': 'k', 'deterministic': True}}, "
                            f"not a {type(options).__name__}")
        entry = CustomEstimator(label, fn)
        for key, values in params.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise ValueError(f"{where}: parameter name {key!r} is not a Python identifier; fn receives it as a "
                                 "keyword argument, so write e.g. 'k' or 'num_keys'")
            if not isinstance(values, (list, tuple, range)):
                raise TypeError(f"{where}: parameter {key!r} must be a list of values, e.g. {{{key!r}: "
                                f"[{values!r}]}}, not a {type(values).__name__}")
            if len(values) == 0:
                raise ValueError(f"{where}: parameter {key!r} has an empty list; give at least one value, e.g. "
                                 f"{{{key!r}: [16, 32]}}")
            listed = [(_canonical(value, f"{where}[{key!r}]"), value) for value in values]
            texts = [text for text, _ in listed]
            repeated = sorted({text for text in texts if texts.count(text) > 1})
            if repeated:
                raise ValueError(f"{where}: parameter {key!r} lists {', '.join(repeated)} more than once")
            entry.params.append((key, listed))
        unknown = [key for key in options if key not in OPTIONS]
        if unknown:
            raise ValueError(f"{where}: unknown option {unknown[0]!r}; the options are 'samples' (the name of the "
                             "parameter that counts samples) and 'deterministic' (True: one trial per case)")
        knob = options.get("samples")
        if knob is not None:
            keys = [key for key, _ in entry.params]
            if knob not in keys:
                raise ValueError(f"{where}: the samples knob {knob!r} is not one of the parameters "
                                 f"({', '.join(map(repr, keys)) or 'none given'}); name one of them, e.g. "
                                 f"{{'samples': {keys[0] if keys else 'k'!r}}}")
            for _, value in dict(entry.params)[knob]:
                if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                    raise ValueError(f"{where}: the samples knob {knob!r} counts samples, so its values must be "
                                     f"integers >= 1; {value!r} is not")
            entry.samples = knob
        deterministic = options.get("deterministic", False)
        if not isinstance(deterministic, bool):
            raise TypeError(f"{where}: option 'deterministic' must be True or False, not {deterministic!r}")
        entry.deterministic = deterministic
        _check_call(entry)
        entries.append(entry)
    return entries
