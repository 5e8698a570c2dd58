"""A cohort's shuffles drawn in NumPy, as NumPy and tf.data draw them.

The batched client path (`tff_clip.runtime.client_data.ClientDatasets.
cohort_batches`) gives every client of a round the batches its `tf.data`
pipeline would yield, without running one: the clients' shuffle seeds
(`round_seeds`: NumPy's `default_rng(...).integers(2**31)`, the formula of
`client_data.round_seed`) and their shuffles (`shuffled_batches`: tf.data's
seeded `shuffle`) are computed for the whole cohort in a few array
operations. Both are exact: `tests/test_client_data.py` compares them with
NumPy's and tf.data's own draws.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

__all__ = ['client_word', 'round_seeds', 'shuffled_batches']


def client_word(client_id) -> int:
  """The 32-bit word a client id adds to its shuffle seed (crc32 of its
  string: str hashes are salted per process)."""
  return zlib.crc32(str(client_id).encode())


# ----------------------------------------------------------------------------
# NumPy's `default_rng(entropy).integers(2**31)` for a column of entropies:
# SeedSequence's mixing (O'Neill's seed_seq alternative, NumPy's
# `bit_generator.pyx`), PCG64's seeding and first output (XSL-RR 128/64), and
# the bounded draw of `Generator.integers` (Lemire's method on a 32-bit draw,
# which for a bound of 2^31 never rejects: the draw's low word shifted
# right by one).

_U32 = np.uint64(0xFFFFFFFF)
_HASH_A = (0x43B0D7E5, 0x931E8875)  # (init, multiplier) of the mixing.
_HASH_B = (0x8B51F9DD, 0x58F38DED)  # ... and of the state's generation.
_MIX = (0xCA01F9DD, 0x4973F715)  # The left and right multipliers of mix.
_POOL = 4  # SeedSequence's default pool size.
# PCG's 128-bit default multiplier as (high, low) words.
_PCG_MULTIPLIER = (np.uint64(2549297995355413924),
                   np.uint64(4865540595714422341))


def _words(n: int) -> list[int]:
  """A non-negative int as NumPy's SeedSequence reads it: 32-bit words,
  least significant first (0 is one word)."""
  if n < 0:
    raise ValueError(f'A seed is non-negative; got {n}.')
  words = [n & 0xFFFFFFFF]
  n >>= 32
  while n:
    words.append(n & 0xFFFFFFFF)
    n >>= 32
  return words


def _xorshift16(value):
  return value ^ (value >> np.uint64(16))


@functools.lru_cache(maxsize=16)
def _hashes(init: int, multiplier: int, count: int):
  """The first `count` hash constants a SeedSequence pass uses (one per
  value hashed, in order) and each one's multiplier, as [count, 1]."""
  constants, constant = [], init
  for _ in range(count):
    constants.append(constant)
    constant = (constant * multiplier) & 0xFFFFFFFF
  return (np.array(constants, np.uint64)[:, None],
          np.array([(c * multiplier) & 0xFFFFFFFF for c in constants],
                   np.uint64)[:, None])


def _hash(values, hashes, start: int, count: int):
  """[count, N]: `values` ([count, N], or [1, N]: one value hashed `count`
  times) hashed with the constants of `hashes` from `start` on."""
  constants, multipliers = hashes
  end = start + count
  return _xorshift16((values ^ constants[start:end]) *
                     multipliers[start:end] & _U32)


def _mix(x, y):
  return _xorshift16(
      (np.uint64(_MIX[0]) * x - np.uint64(_MIX[1]) * y) & _U32)


def _pool(entropy: list) -> np.ndarray:
  """SeedSequence's `mix_entropy` on [N] columns of 32-bit words: the [4, N]
  pool. A value hashed with consecutive constants (a source mixed into each
  other word of the pool) is hashed once for them all: [K, N] operations."""
  hashes = _hashes(*_HASH_A, _POOL * _POOL +
                   _POOL * max(len(entropy) - _POOL, 0))
  zero = np.zeros_like(entropy[0])
  pool = _hash(np.stack([entropy[i] if i < len(entropy) else zero
                         for i in range(_POOL)]), hashes, 0, _POOL)
  used = _POOL
  for source in range(_POOL):
    targets = [t for t in range(_POOL) if t != source]
    pool[targets] = _mix(pool[targets], _hash(
        pool[source][None], hashes, used, len(targets)))
    used += len(targets)
  for source in range(_POOL, len(entropy)):
    pool = _mix(pool, _hash(entropy[source][None], hashes, used, _POOL))
    used += _POOL
  return pool


def _multiply_64(a, b):
  """(high, low) 64-bit words of the 128-bit products a * b."""
  a0, a1 = a & _U32, a >> np.uint64(32)
  b0, b1 = b & _U32, b >> np.uint64(32)
  p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
  middle = (p00 >> np.uint64(32)) + (p01 & _U32) + (p10 & _U32)
  low = (p00 & _U32) | (middle << np.uint64(32))
  high = (p11 + (p01 >> np.uint64(32)) + (p10 >> np.uint64(32)) +
          (middle >> np.uint64(32)))
  return high, low


def _pcg_step(state, increment):
  """state * multiplier + increment, mod 2^128, on (high, low) words."""
  (high, low), (m_high, m_low) = state, _PCG_MULTIPLIER
  product_high, product_low = _multiply_64(low, m_low)
  product_high = product_high + low * m_high + high * m_low
  return _add_128((product_high, product_low), increment)


def _add_128(a, b):
  low = a[1] + b[1]
  return a[0] + b[0] + (low < a[1]).astype(np.uint64), low


def round_seeds(seed: int, round_num: int, client_ids) -> np.ndarray:
  """[C] int64: `client_data.round_seed(seed, round_num, c)` of every
  client c of `client_ids`, computed for all of them at once."""
  words = np.array([client_word(c) for c in client_ids], np.uint64)
  entropy = [np.full(words.shape, word, np.uint64)
             for word in _words(int(seed)) + _words(int(round_num))]
  pool = _pool(entropy + [words])
  # `generate_state(4, np.uint64)`: 8 hashed words, paired little-endian.
  state = _hash(pool[np.arange(2 * _POOL) % _POOL], _hashes(*_HASH_B, 8),
                0, 8)
  seeds = [state[2 * k] | (state[2 * k + 1] << np.uint64(32))
           for k in range(4)]
  # PCG64: state 0, increment (seeds[2:] << 1) | 1, a step, the initial
  # state (seeds[:2]) added, a step; the first draw steps once more and
  # outputs the state's XSL-RR.
  increment = ((seeds[2] << np.uint64(1)) | (seeds[3] >> np.uint64(63)),
               (seeds[3] << np.uint64(1)) | np.uint64(1))
  zero = np.zeros_like(words)
  pcg = _pcg_step(_add_128(_pcg_step((zero, zero), increment),
                           (seeds[0], seeds[1])), increment)
  high, low = _pcg_step(pcg, increment)
  folded, rotation = high ^ low, high >> np.uint64(58)
  draw = ((folded >> rotation) |
          (folded << ((np.uint64(64) - rotation) & np.uint64(63))))
  return ((draw & _U32) >> np.uint64(1)).astype(np.int64)


# ----------------------------------------------------------------------------
# tf.data's shuffle, drawn as tf.data draws it, for a whole cohort at once.

_PHILOX_ROUNDS = 10
# Philox4x32's multipliers, of words 0 and 2, and its key's increments (of
# key words 0 and 1), as columns.
_PHILOX_MULTIPLIERS = np.array([[0xD2511F53], [0xCD9E8D57]], np.uint64)
_PHILOX_KEY_STEPS = (np.arange(_PHILOX_ROUNDS, dtype=np.uint64)[:, None, None] *
                     np.array([[0x9E3779B9], [0xBB67AE85]], np.uint64))


def _philox(counter, key):
  """Philox4x32-10 (TF's `random::PhiloxRandom`) on [N] uint64 words.

  Words 0 and 2 (the multiplied ones) and words 1 and 3 travel as [2, N]
  pairs, and the rounds' keys are made at once: five array operations a
  round."""
  multiplied = np.stack([counter[0], counter[2]])
  other = np.stack([counter[1], counter[3]])
  keys = (np.stack(key)[None] + _PHILOX_KEY_STEPS) & _U32  # [rounds, 2, N]
  for r in range(_PHILOX_ROUNDS):
    product = _PHILOX_MULTIPLIERS * multiplied
    # (hi(p1) ^ c1 ^ k0, lo(p1), hi(p0) ^ c3 ^ k1, lo(p0)).
    multiplied, other = ((product >> np.uint64(32))[::-1] ^ other ^ keys[r],
                         (product & _U32)[::-1])
  return [multiplied[0], other[0], multiplied[1], other[1]]


def _philox_stream(seed, seed2, count: int) -> np.ndarray:
  """[N, count]: the first `count` draws of TF's
  `SingleSampleAdapter<PhiloxRandom>(seed, seed2)`, one row per seed pair."""
  seed = np.asarray(seed).astype(np.uint64)
  seed2 = np.asarray(seed2).astype(np.uint64)
  blocks = -(-count // 4)
  if not blocks:
    return np.zeros([seed.shape[0], 0], np.uint64)
  # Every block of every row in one pass: [blocks * N] counters.
  tile = lambda a: np.tile(a, blocks)
  counter = np.repeat(np.arange(blocks, dtype=np.uint64), seed.shape[0])
  words = _philox(
      (counter, np.zeros_like(counter), tile(seed2 & _U32),
       tile(seed2 >> np.uint64(32))),
      (tile(seed & _U32), tile(seed >> np.uint64(32))))
  # [4, blocks, N] -> [N, blocks, 4] -> [N, 4 * blocks].
  stacked = np.stack(words).reshape(4, blocks, seed.shape[0])
  return stacked.transpose(2, 1, 0).reshape(seed.shape[0], -1)[:, :count]


def shuffled_batches(pairs, sizes, batch_size: int, num_epochs: int,
                      max_elements, local_steps) -> np.ndarray:
  """[C, S, B] positions (-1: padding) of each client's batches: what
  `client_data.ClientDatasets._pipeline` on `range(n)` yields, for clients
  of at most `client_data.SHUFFLE_BUFFER` examples, computed for all
  clients at once.

  tf.data's `ShuffleDatasetV3` (reshuffle each iteration) draws each
  iteration's seeds from a Philox stream keyed by the dataset's seed pair
  (two draws an iteration), then, with the whole client in its buffer, picks
  the k-th element at `k + draw_k % (n - k)` of the buffer and swaps it to
  position k. Each epoch (`num_epochs`), and each pass of `local_steps`'s
  repeat, is a new iteration; iterations start only when an element of them
  is asked for. `tests/test_client_data.py` checks the draws against
  tf.data's.
  """
  sizes = np.asarray(sizes, np.int64)
  num_clients = len(sizes)
  epoch_elements = sizes * num_epochs
  pass_len = (epoch_elements if max_elements is None else
              np.minimum(epoch_elements, max_elements))
  per_pass = -(-pass_len // batch_size)  # Batches in one pass.
  if local_steps is None:
    steps = per_pass
  else:
    steps = np.where(per_pass > 0, local_steps, 0)
  width = int(steps.max()) if num_clients else 0
  step = np.arange(width)[None, :, None]
  slot = np.arange(batch_size)[None, None, :]
  safe_per_pass = np.maximum(per_pass, 1)[:, None, None]
  passes = step // safe_per_pass
  t = (step % safe_per_pass) * batch_size + slot  # Position in the pass.
  valid = (step < steps[:, None, None]) & (t < pass_len[:, None, None])
  n = np.maximum(sizes, 1)[:, None, None]
  epochs_per_pass = -(-pass_len // np.maximum(sizes, 1))
  epoch = passes * epochs_per_pass[:, None, None] + t // n
  position = t % n
  if not valid.any():
    return np.full([num_clients, width, batch_size], -1, np.int64)
  num_iterations = int(epoch[valid].max()) + 1
  prefix = int(position[valid].max()) + 1
  seeds = _philox_stream(pairs[:, 0], pairs[:, 1], 2 * num_iterations)
  clients = np.arange(num_clients)
  orders = np.zeros([num_iterations, num_clients, prefix], np.int64)
  # Position k's pick, k + draw_k % (n - k), for every k at once (at most
  # the buffer's last: a client of fewer than `prefix` examples).
  ks = np.arange(prefix)
  left = np.maximum(sizes[:, None] - ks, 1).astype(np.uint64)  # [C, prefix]
  for e in range(num_iterations):
    draws = _philox_stream(seeds[:, 2 * e], seeds[:, 2 * e + 1], prefix)
    buffer = np.tile(np.arange(int(sizes.max())), (num_clients, 1))
    picks = np.minimum(ks + (draws % left).astype(np.int64),
                       buffer.shape[1] - 1)
    for k in range(prefix):
      pick = picks[:, k]
      chosen = buffer[clients, pick]
      orders[e, :, k] = chosen
      buffer[clients, pick] = buffer[clients, k]
      buffer[clients, k] = chosen
  index = orders[np.where(valid, epoch, 0), clients[:, None, None],
                 np.where(valid, position, 0)]
  return np.where(valid, index, -1)
