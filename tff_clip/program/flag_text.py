"""Flag text as `TrainConfig` values: --task_option and --lus_sparsity.

What `scripts.train` (and the benchmarks that take the same flags) parse
from the command line before a `TrainConfig` is made; a malformed value is
a `ConfigError` naming the flag.
"""

from __future__ import annotations

from tff_clip import checks
from tff_clip.program.config import ConfigError

__all__ = ['parse_lus_sparsity', 'parse_task_options']


def _option_value(text: str):
  """'1.5' -> 1.5, '3' -> 3, 'none' -> None, 'true' -> True, 'a,b' -> tuple."""
  if ',' in text:
    return tuple(_option_value(part) for part in text.split(','))
  lowered = text.strip().lower()
  if lowered in ('none', 'true', 'false'):
    return None if lowered == 'none' else lowered == 'true'
  for kind in (int, float):
    try:
      return checks.ascii_number(text, kind)
    except ValueError:
      pass
  return text.strip()


def parse_task_options(values) -> tuple:
  """`--task_option` values ['key=value', ...] -> ((key, value), ...)."""
  options = []
  for item in values:
    key, sep, value = item.partition('=')
    if not sep or not key.strip():
      raise ConfigError(f'--task_option must be key=value; got {item!r}.')
    options.append((key.strip(), _option_value(value)))
  return tuple(options)


def parse_lus_sparsity(text):
  """'0.7' -> 0.7; '0.5,0.7,0.9' -> (0.5, 0.7, 0.9) (one per layer)."""
  if text is None or str(text).strip().lower() in ('', 'none'):
    return None
  try:
    values = tuple(checks.ascii_number(v) for v in str(text).split(','))
  except ValueError:
    raise ConfigError('--lus_sparsity must be numbers in [0, 1) (one, or one '
                      f'per layer, comma-separated); got {text!r}.') from None
  return values[0] if len(values) == 1 else values
