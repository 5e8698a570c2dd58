"""Argument checks shared by the library and the flags: errors name the argument.

Raised at construction time, long before any TFF tracing (the habit of TFF's
own aggregators, `_check_float_positive(value, label)`). One rule per kind of
error: a value of the wrong type is a `TypeError`, a value of the right type
outside its range a `ValueError`. A number is checked in the dtype it will be
used in (float32 by default: norms, noise multipliers, learning rates and
counts enter TensorFlow as float32), so 1e39 (inf in float32) and 1e-50 (0 in
float32) are refused rather than silently becoming inf or 0. No TF import.

The project's one set of these rules: the library, the flags
(`tff_clip.program.config`, which writes `name` as --name), the accountant and the
optimizers all check their numbers and names here.
"""

from __future__ import annotations

import math
import os
import numbers

import numpy as np

__all__ = ['FLOAT32_TINY', 'INT64_MAX', 'MAX_AUDIT_CANARIES', 'MAX_DELTA',
           'MAX_NUM_CLIENTS', 'MAX_ROUNDS', 'NAME_MAX', 'PATH_MAX',
           'ascii_number', 'boolean',
           'delta', 'integer', 'is_real', 'nonnegative_float', 'normal_float',
           'one_of', 'path_text', 'positive_float', 'probability', 'rounds']

INT64_MAX = 2**63 - 1
# The smallest normal float32. TensorFlow's CPU kernels flush smaller
# (subnormal) values to zero, so a noise scale below it adds no noise.
FLOAT32_TINY = float(np.finfo(np.float32).tiny)
# The largest delta accounted. A delta is the chance that the guarantee
# fails outright; meaningful ones are far below 1/population. Above about
# 0.01 the epsilon of a noisy round falls towards 0 (at delta = 0.5 it is
# the loss distribution's median), and PLD accounting, whose grid follows
# epsilon, then needs a grid too fine to finish (minutes to never: delta
# 0.1 to 0.5, z 2 to 20). Up to 0.01 every accountant answers in bounded
# time, and the flags refuse more before anything runs.
MAX_DELTA = 0.01
# The most rounds accounted: PLD composes T rounds on a grid that grows with
# T (10^6 rounds: about 2 s; 10^7: minutes). Far beyond any run of this
# project (thousands of rounds).
MAX_ROUNDS = 100_000
# Sizes beyond which a run cannot start in reasonable time: the clients a
# task builds (listing 10^9 client ids alone takes minutes; Stack Overflow,
# the largest population here, has 342,477) and the canaries of an audit
# (each round draws about 2K model-sized candidates; docs/audit.md uses 50
# to 100).
MAX_NUM_CLIENTS = 1_000_000
MAX_AUDIT_CANARIES = 10_000


def is_real(value) -> bool:
  """A Python or numpy real number (bools are not numbers here)."""
  return not isinstance(value, (bool, np.bool_)) and isinstance(
      value, (int, float, np.integer, np.floating))


def _as_number(value, label: str):
  if not is_real(value):
    raise TypeError(f'`{label}` must be a float; got {value!r}.')
  try:
    return float(value)
  except OverflowError:  # An int beyond any float.
    raise ValueError(f'`{label}` must be a finite float; got {value!r}.'
                     ) from None


def _cast(value: float, label: str, dtype) -> float:
  with np.errstate(over='ignore', under='ignore'):
    cast = float(np.asarray(value, dtype))
  if not math.isfinite(cast):
    raise ValueError(f'`{label}` = {value!r} overflows {np.dtype(dtype).name}'
                     ', the dtype it is used in.')
  if value != 0 and cast == 0:
    raise ValueError(f'`{label}` = {value!r} underflows to 0 in '
                     f'{np.dtype(dtype).name}, the dtype it is used in.')
  return cast


def positive_float(value, label: str, dtype=np.float32) -> float:
  """`value` as a float: TypeError if not a number, ValueError unless > 0,
  finite, and still > 0 and finite in `dtype`."""
  number = _as_number(value, label)
  if not math.isfinite(number) or number <= 0:
    raise ValueError(
        f'`{label}` must be a positive finite float; got {value!r}.')
  _cast(number, label, dtype)
  return number


def nonnegative_float(value, label: str, dtype=np.float32) -> float:
  """`value` as a float: TypeError if not a number, ValueError unless >= 0,
  finite, and finite in `dtype` (a positive value must stay positive)."""
  number = _as_number(value, label)
  # -0.0 is refused too: a sign bit in a norm or a std is a bug upstream.
  if not math.isfinite(number) or number < 0 or math.copysign(1.0,
                                                               number) < 0:
    raise ValueError(f'`{label}` must be a finite float >= 0; got {value!r}.')
  _cast(number, label, dtype)
  return number


def normal_float(value: float, label: str, dtype=np.float32) -> float:
  """`value` (a checked positive float) if it is a normal number of `dtype`.

  Subnormal values survive a cast, but TensorFlow computes with
  flush-to-zero on: a clip norm or noise scale there acts as 0.
  """
  tiny = float(np.finfo(dtype).tiny)
  if value < tiny:
    raise ValueError(
        f'`{label}` = {value!r} is subnormal in {np.dtype(dtype).name} '
        f'(below {tiny:.3g}), where TensorFlow flushes it to 0; give a value '
        f'>= {tiny:.3g}.')
  return value


def probability(value, label: str, low_open: bool = True,
                high_open: bool = True, dtype=np.float64) -> float:
  """`value` as a float in (0, 1) (a closed end where `*_open` is False):
  TypeError if not a number, ValueError outside the interval. The rule of
  every number in the unit interval (probabilities, fractions, decays)."""
  number = _as_number(value, label)
  low_ok = number > 0 if low_open else number >= 0
  high_ok = number < 1 if high_open else number <= 1
  if not (low_ok and high_ok):  # False for NaN too.
    interval = f'{"(" if low_open else "["}0, 1{")" if high_open else "]"}'
    raise ValueError(f'`{label}` must be in {interval}; got {value!r}.')
  if number > 0:
    _cast(number, label, dtype)
  return number


def ascii_number(text: str, kind=float):
  """`kind(text)` (int or float) of ASCII text only; ValueError otherwise.

  Python's int() and float() also read other scripts' digits ('٣' is 3,
  a fullwidth '１' is 1) and underscores ('1_0' is 10): on a command line
  these are typos or look-alikes, and a flag's value must be what it reads.
  """
  text = str(text)
  if not text.isascii() or '_' in text:
    raise ValueError(f'not an ASCII number without underscores: {text!r}')
  return kind(text)


def delta(value, label: str = 'delta') -> float:
  """A DP delta: a float in (0, `MAX_DELTA`], where the accountants answer."""
  number = probability(value, label)
  if number > MAX_DELTA:
    raise ValueError(
        f'`{label}` must be in (0, {MAX_DELTA:g}] (the chance that the '
        'guarantee fails; meaningful values are far below 1/population, '
        f'and above {MAX_DELTA:g} the accountants cannot answer in bounded '
        f'time); got {value!r}.')
  return number


def rounds(value, label: str = 'rounds') -> int:
  """A number of rounds accounted: an int in [1, `MAX_ROUNDS`]."""
  number = integer(value, label, minimum=1)
  if number > MAX_ROUNDS:
    raise ValueError(
        f'`{label}` must be at most {MAX_ROUNDS:,} (PLD accounting of more '
        f'rounds does not finish in bounded time); got {value!r}.')
  return number


def integer(value, label: str, minimum: int = 0,
            maximum: int = INT64_MAX) -> int:
  """`value` as an int in [minimum, maximum] (int64 by default)."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(
      value, numbers.Integral):
    raise TypeError(f'`{label}` must be an integer; got {value!r}.')
  if not minimum <= value <= maximum:
    wanted = (f'an integer in [{minimum}, {maximum}]' if maximum < INT64_MAX
              else 'a positive integer' if minimum == 1 else
              f'an integer >= {minimum}')
    raise ValueError(f'`{label}` must be {wanted}; got {value!r}.')
  return int(value)


def one_of(value, label: str, choices) -> str:
  """`value` if it is one of `choices` (names); ValueError listing them."""
  choices = tuple(choices)
  if not isinstance(value, str) or value not in choices:
    raise ValueError(f'`{label}` must be one of {", ".join(choices)}; got '
                     f'{value!r}.')
  return value


def boolean(value, label: str) -> bool:
  """`value` if it is a bool (True/False, not 'no' or 0)."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f'`{label}` must be True or False; got {value!r}.')
  return bool(value)


# A file name's most bytes on Linux file systems (NAME_MAX), and a path's.
NAME_MAX = 255
PATH_MAX = 4095


def path_text(path: str, label: str) -> str:
  """A path a run directory can have: printable, within the OS limits."""
  control = [c for c in path if ord(c) < 32 or 127 <= ord(c) < 160]
  if control:
    raise ValueError(f'`{label}` must be printable; it holds the control '
                     f'character {control[0]!r}.')
  try:
    encoded = path.encode()
  except UnicodeEncodeError:
    raise ValueError(f'`{label}` is not valid text: {path!r}.') from None
  longest = max(len(part.encode()) for part in path.split(os.sep))
  if longest > NAME_MAX or len(encoded) > PATH_MAX:
    raise ValueError(
        f'`{label}` is too long for a file system: a name may have at most '
        f'{NAME_MAX} bytes and a path {PATH_MAX}; got a name of {longest} '
        f'bytes in a path of {len(encoded)}.')
  return path
