"""Searching what a run released for a secret key, in every encoding.

A secret here is an int64 vector: a DP query's noise key (two draws from
OS entropy over all of int64), the audit seed (two 62-bit draws), or the
secret half of a key derived from them (one Philox output). A leak
could write it, or one of its entries, cast to any dtype, as raw bytes (an
array saved, a tensor summary), as a protobuf varint (an int64 field of
TensorBoard's TensorProto), as text (JSON, CSV, a log line) or as a number
among other numbers. Two searches, each with a false-alarm chance the test
can compute and bound, since the key is random and independent of what an
honest run writes:

* Bytes: every encoding that carries >= 48 bits of the key's randomness:
  the key as int64/uint64, int32/uint32 and float32 (each entry cast) and
  float64, little and big endian; each entry as int64, uint64 and float64
  bytes, as varint and zigzag varint, and as decimal and hexadecimal text.
  A pattern equal to any fixed bytes with probability at most p is found by
  chance in n bytes with probability at most n p.
* Numbers: every number a file states (CSV cells, JSON values, TensorBoard
  tensors of any dtype) is compared with each entry cast to int64, uint64,
  float32 and float64, and a TensorBoard tensor of int32/uint32 also with
  the entry cast to its dtype. One entry's float32 cast carries only 24
  bits, too few for a byte search (a 4-byte pattern is in 60 KB by chance
  with probability 1e-5), but a number equals float32(k) only if it is as
  large as the key; each comparison's chance is its preimage count over
  2^62. Not searched: an entry cast to a 32-bit integer and written as text. Its
  32 random bits would match one of the run's own integers (summary.json
  states 1,000,000) with chance 2^-32 each; a test that may fail by chance
  once in 10^9 cannot look for it.

Entries are assumed to carry at least 62 random bits (the audit seed's; a
noise key's carry 64), so the bounds are conservative.
"""

from __future__ import annotations

import csv
import io
import json
import math
import pathlib
import re
from typing import Iterator

import numpy as np

ENTROPY_BITS = 62


def _varint(value: int) -> bytes:
  """Protobuf varint of a 64-bit two's complement value."""
  value &= 2**64 - 1
  out = bytearray()
  while True:
    byte, value = value & 0x7F, value >> 7
    out.append(byte | (0x80 if value else 0))
    if not value:
      return bytes(out)


def _zigzag(value: int) -> int:
  return ((value << 1) ^ (value >> 63)) & (2**64 - 1)


def byte_patterns(key: np.ndarray) -> dict[bytes, tuple[str, float, bool]]:
  """Bytes -> (name, chance, short) for every encoding of `key` (int64
  entries) searched: chance bounds P(encoding == s) for any fixed bytes s
  over a random key; short marks the float32 key (2 x 24 bits)."""
  key = np.asarray(key, np.int64).reshape(-1)
  value = 2.0**-ENTROPY_BITS  # One entry's chance of one value.
  # A float64 (53-bit mantissa) holds at most 2^9 integers below 2^62, a
  # float32 (24 bits) at most 2^38.
  float64, float32 = 2.0**(9 - ENTROPY_BITS), 2.0**(38 - ENTROPY_BITS)
  candidates = []
  whole = {'int64': (key, value), 'uint64': (key.view(np.uint64), value),
           'float64': (key.astype(np.float64), float64**key.size)}
  if key.size >= 2:  # Each entry's low 32 bits: 2 x 32 random bits.
    whole['int32'] = (key.astype(np.int32), 2.0**(-32 * key.size))
    whole['uint32'] = (key.astype(np.uint32), 2.0**(-32 * key.size))
    whole['float32'] = (key.astype(np.float32), float32**key.size)
  for dtype, (values, chance) in whole.items():
    for order in '<>':
      candidates.append((values.astype(values.dtype.newbyteorder(order))
                         .tobytes(), f'key as {dtype}{order}', chance))
  for i, entry in enumerate(key):
    entry = int(entry)
    unsigned = entry & (2**64 - 1)
    arrays = {'int64': (np.array([entry], np.int64), value),
              'uint64': (np.array([unsigned], np.uint64), value),
              'float64': (np.array([entry], np.float64), float64)}
    for dtype, (array, chance) in arrays.items():
      for order in '<>':
        candidates.append((array.astype(array.dtype.newbyteorder(order))
                           .tobytes(), f'entry {i} as {dtype}{order}', chance))
    # Variable length (at most 20 bytes), one-to-one.
    for name, pattern in (('varint', _varint(entry)),
                          ('zigzag varint', _varint(_zigzag(entry))),
                          ('decimal', str(entry).encode()),
                          ('unsigned decimal', str(unsigned).encode()),
                          ('hex', f'{unsigned:x}'.encode()),
                          ('HEX', f'{unsigned:X}'.encode())):
      candidates.append((pattern, f'entry {i} as {name}', 20 * value))
  patterns = {}
  for pattern, name, chance in candidates:
    if pattern not in patterns or patterns[pattern][1] < chance:
      patterns[pattern] = (name, chance, 'float32' in name)
  return patterns


def byte_chance(haystack_bytes: int, key: np.ndarray) -> float:
  """Bound on the chance that any byte pattern of a random key is found in
  `haystack_bytes` bytes that do not depend on the key."""
  return sum(haystack_bytes * chance
             for _, chance, _ in byte_patterns(key).values())


def found_bytes(data: bytes, key: np.ndarray) -> list[str]:
  """The names of `key`'s byte patterns that occur in `data`."""
  return [name for pattern, (name, _, _) in byte_patterns(key).items()
          if pattern in data]


def search_file(path: pathlib.Path, key: np.ndarray,
                label: bytes = b'') -> tuple[list[str], float]:
  """(what of `key` a released file holds, the chance of a false alarm).

  Its bytes (and `label`, e.g. its name) are searched for every pattern,
  and the numbers it states compared with every cast. A PNG's image data
  (IDAT) is deflated pixels, where no value's bytes survive: the float32
  key, whose 48 random bits 60 KB of such data would match by chance
  with probability 2e-10, is looked for in its other chunks only.
  """
  data = path.read_bytes()
  short_haystack = (_png_without_image(data) if path.suffix == '.png'
                    else data) + b'\n' + label
  data += b'\n' + label
  found, chance = [], 0.0
  for pattern, (name, pattern_chance, short) in byte_patterns(key).items():
    haystack = short_haystack if short else data
    chance += len(haystack) * pattern_chance
    if pattern in haystack:
      found.append(name)
  numbers = released_numbers(path)
  return (found + found_numbers(numbers, key),
          chance + number_chance(numbers, key))


# ----------------------------------------------------------------------------
# Numbers: (value, dtype) pairs, dtype 'text' for a number written as text.

CASTS = ('int64', 'uint64', 'int32', 'uint32', 'float32', 'float64')
# Casts a number written as text is compared with. Not the 32-bit integer
# casts: their 32 random bits would match one of the run's own integers
# (summary.json states 1,000,000) with chance 2^-32 each.
TEXT_CASTS = ('int64', 'uint64', 'float32', 'float64')


def _casts(entry: int) -> dict[str, float | int]:
  array = np.array([entry], np.int64)
  return {'int64': int(entry), 'uint64': int(array.view(np.uint64)[0]),
          'int32': int(array.astype(np.int32)[0]),
          'uint32': int(array.astype(np.uint32)[0]),
          'float32': float(array.astype(np.float32)[0]),
          'float64': float(array.astype(np.float64)[0])}


def _compared_casts(dtype: str) -> tuple[str, ...]:
  if dtype == 'text':
    return TEXT_CASTS
  return tuple(c for c in CASTS if c == dtype or (
      dtype in ('int64', 'uint64') and c in ('int64', 'uint64')))


def _is_integral(number) -> bool:
  return isinstance(number, int) or (math.isfinite(number) and
                                     float(number).is_integer())


def _comparison_chance(cast: str, number) -> float:
  """Bound on P(cast(k) == number) for a random key entry k."""
  if not _is_integral(number):
    return 0.0  # Every cast of an integer key is an integer.
  number = abs(number)
  if cast in ('int32', 'uint32'):
    return 2.0**32 / 2.0**ENTROPY_BITS
  if cast in ('float32', 'float64'):
    mantissa = 24 if cast == 'float32' else 53
    if number < 2**mantissa:
      return 2.0**-ENTROPY_BITS
    # Integers rounding to `number`: one ulp of it.
    return 2.0**(math.frexp(number)[1] - mantissa) / 2.0**ENTROPY_BITS
  return 2.0**-ENTROPY_BITS


def found_numbers(numbers, key: np.ndarray) -> list[str]:
  """'entry i as cast = number' for every released (number, dtype) equal to
  a cast of an entry of `key`."""
  found = []
  for i, entry in enumerate(np.asarray(key, np.int64).reshape(-1)):
    casts = _casts(int(entry))
    for number, dtype in numbers:
      for cast in _compared_casts(dtype):
        if number == casts[cast]:
          found.append(f'entry {i} as {cast} = {number!r} ({dtype})')
  return found


def number_chance(numbers, key: np.ndarray) -> float:
  """Bound on the chance that `found_numbers` finds a random key."""
  return np.asarray(key).size * sum(
      _comparison_chance(cast, number) for number, dtype in numbers
      for cast in _compared_casts(dtype))


def _json_numbers(value) -> Iterator:
  if isinstance(value, bool):
    return
  if isinstance(value, (int, float)):
    yield value, 'text'
  elif isinstance(value, dict):
    for item in value.values():
      yield from _json_numbers(item)
  elif isinstance(value, list):
    for item in value:
      yield from _json_numbers(item)


def _text_numbers(text: str) -> Iterator:
  for token in re.findall(r'[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?', text):
    try:
      yield int(token), 'text'
    except ValueError:
      yield float(token), 'text'


def _tensorboard_numbers(path: pathlib.Path) -> Iterator:
  """Every value of every summary, in its dtype (wall times and steps are
  the writer's own)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for record in tf.data.TFRecordDataset(str(path)):
    event = tf.compat.v1.Event.FromString(record.numpy())
    for value in event.summary.value:
      if value.HasField('tensor'):
        array = tf.make_ndarray(value.tensor)
        if array.dtype.kind in 'iuf':
          yield from ((x.item(), array.dtype.name) for x in np.ravel(array))
      elif value.HasField('simple_value'):
        yield value.simple_value, 'float32'


def released_numbers(path: pathlib.Path) -> list:
  """The (number, dtype) pairs a released file states, by its kind."""
  if path.suffix == '.json':
    return list(_json_numbers(json.loads(path.read_text())))
  if path.suffix == '.jsonl':
    return [n for line in path.read_text().splitlines() if line
            for n in _json_numbers(json.loads(line))]
  if path.suffix == '.csv':
    rows = list(csv.reader(io.StringIO(path.read_text())))
    return [n for row in rows for cell in row for n in _text_numbers(cell)]
  if 'tfevents' in path.name:
    return list(_tensorboard_numbers(path))
  if path.suffix == '.png':
    return [n for text in png_texts(path.read_bytes())
            for n in _text_numbers(text)]
  raise ValueError(f'no reader for released file {path}')


def _png_chunks(data: bytes) -> Iterator[tuple[bytes, bytes]]:
  assert data[:8] == b'\x89PNG\r\n\x1a\n'
  offset = 8
  while offset < len(data):
    length = int.from_bytes(data[offset:offset + 4], 'big')
    yield data[offset + 4:offset + 8], data[offset + 8:offset + 8 + length]
    offset += 12 + length


def _png_without_image(data: bytes) -> bytes:
  return b''.join(kind + body for kind, body in _png_chunks(data)
                  if kind != b'IDAT')


def png_texts(data: bytes) -> list[str]:
  """The text chunks (tEXt, iTXt; zTXt decompressed) of a PNG."""
  import zlib  # pylint: disable=g-import-not-at-top
  texts = []
  for kind, body in _png_chunks(data):
    if kind in (b'tEXt', b'iTXt'):
      texts.append(body.decode('latin-1'))
    elif kind == b'zTXt':
      keyword, _, rest = body.partition(b'\0')
      texts.append(keyword.decode('latin-1') + ' ' +
                   zlib.decompress(rest[1:]).decode('latin-1'))
  return texts
