"""A notebook's parameters, declared once: name, kind, default, bounds and meaning.

Each `plan_NN.py` declares its notebook's parameters in `PARAMETERS`, and `check` is the one
validator: it refuses a bad value by name before any work (a ValueError), fills the defaults,
and turns papermill's text (`-p microbatches '[2, 4]'`) into lists. The notebook's cell tagged
`parameters` is written from the same declarations (`cell`; `make colab` rewrites it, and a
hygiene test fails when the two disagree), so a default lives in one place.

The torch a notebook needs is declared the same way (`MIN_TORCH`, with the reason), and
`check_torch` refuses an older one by name, before any work.
"""
import ast
import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Param:
    """One parameter. kind: 'int', 'float', 'str', 'list' (of ints) or 'device'; minimum: the
    smallest number allowed (ints, floats, list items); positive: a float that must be above 0
    (a learning rate), in place of a minimum; choices: the allowed values of a str; optional:
    None is allowed, and means "choose for this machine"."""
    name: str
    default: object
    meaning: str
    kind: str = 'int'
    minimum: float = 1
    choices: tuple = ()
    optional: bool = False
    positive: bool = False


def _number(p, value, where=None):
    where = where or p.name
    if p.positive:
        return check_positive(where, value)
    integer = p.kind in ('int', 'list')
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or (not integer and not math.isfinite(value)) \
            or value < p.minimum:
        what = 'an integer' if integer else 'a number'
        raise ValueError(f'{where} must be {what} >= {p.minimum}, got {value!r}')
    return value


def _as_list(p, value):
    value = check_list(p.name, value)
    if not value:
        raise ValueError(f'{p.name} must be a non-empty list, got {value!r}')
    return [_number(p, v, f'each of {p.name}') for v in value]


def check_one(p, value):
    """`value` for parameter `p`, checked (a ValueError naming p.name)."""
    if value is None:
        if p.optional:
            return None
        raise ValueError(f'{p.name} may not be None')
    if p.kind == 'list':
        return _as_list(p, value)
    if p.kind in ('int', 'float'):
        return _number(p, value)
    if p.kind == 'str':
        if p.choices and value not in p.choices:
            raise ValueError(f'{p.name} must be one of {list(p.choices)}, got {value!r}')
        return value
    if p.kind == 'device':
        import helpers
        return helpers.check_device(p.name, value)
    raise TypeError(f'parameter {p.name}: unknown kind {p.kind!r}')


def check(declared, given):
    """Every declared parameter's value: `given`'s (checked), or the default. A name that is
    not declared is refused, so a misspelt parameter never passes silently."""
    names = {p.name for p in declared}
    unknown = sorted(set(given) - names)
    if unknown:
        raise ValueError(f'unknown parameter(s) {unknown}; this notebook takes {sorted(names)}')
    return {p.name: check_one(p, given.get(p.name, p.default)) for p in declared}


def cell(declared):
    """The text of the notebook's `parameters` cell: one commented assignment per parameter."""
    width = max(len(f'{p.name} = {p.default!r}') for p in declared) + 2
    return '\n'.join(f'{p.name} = {p.default!r}'.ljust(width) + f'# {p.meaning}'
                     for p in declared)


def version(text):
    """(major, minor) of a torch version string: '2.11.0+cu130' -> (2, 11)."""
    major, minor = text.split('+')[0].split('.')[:2]
    return int(major), int(''.join(c for c in minor if c.isdigit()) or 0)


def check_torch(minimum, reason, installed=None):
    """Refuse a torch older than `minimum` ('2.10'), naming both versions and the reason."""
    installed = installed or torch.__version__
    if version(installed) < version(minimum):
        raise RuntimeError(f'this notebook needs torch>={minimum} ({reason}); '
                           f'this Python has torch {installed}')
    return installed


# ------------------------------------------------- single checks, used by modules too
def check_int(name, value, minimum=1, allow_none=False):
    """Raise a ValueError naming `name` unless `value` is an int >= minimum (or None if allowed)."""
    if value is None and allow_none:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f'{name} must be an integer >= {minimum}, got {value!r}')
    return value


def check_positive(name, value):
    """Raise a ValueError naming `name` unless `value` is a positive number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f'{name} must be a positive number, got {value!r}')
    return value


def with_defaults(config, defaults):
    """`defaults` updated by `config`; a ValueError names any setting `defaults` lacks."""
    unknown = set(config) - set(defaults)
    if unknown:
        raise ValueError(f'unknown setting(s) {sorted(unknown)}; known: {sorted(defaults)}')
    return {**defaults, **config}


def check_list(name, value, check_item=None):
    """A list parameter as a list, also when it arrives as text: papermill's `-p queue_lengths
    [1,4]` delivers the string '[1,4]'. Each item goes through check_item(name, item) if given;
    a ValueError names the parameter and says how to pass a list."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f'{name}={value!r} is not a list: write it as [1, 4], or pass '
                             f'lists to papermill with -y "{name}: [1, 4]"') from None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f'{name} must be a list, got {value!r}')
    if check_item is not None:
        for item in value:
            check_item(f'each of {name}', item)
    return list(value)


def check_choice(name, value, choices):
    """Raise a ValueError naming `name` unless `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f'{name} must be one of {list(choices)}, got {value!r}')
    return value
