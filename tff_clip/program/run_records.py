"""A run directory as a checked record: atomic files, a hash-chained log of
released rounds, and flat-array checkpoints that name the release they cover.

What a training run has released is what its privacy guarantee must count,
so the run directory keeps it in one append-only file, `releases.jsonl`: one
line per released round with the round's row (what was published) and its
DP event (what was spent), each line carrying the SHA-256 of the previous
line's hash and its own content. `metrics.csv` is a view of that log, rebuilt
from it whenever it could be stale or damaged. A checkpoint
(`checkpoints/round_NNNNNN.npz`: the state's leaves as arrays and a small JSON
header) records the log hash of the last round it covers, so resuming from a
checkpoint that does not belong to the log is detected.

Every file is written atomically: a temporary file in the same directory,
flushed and fsynced, renamed over the target, and the directory fsynced
(POSIX rename is atomic; the directory fsync makes the rename itself
durable). An append to the log is flushed and fsynced before the call
returns. A write that fails (a full disk, a read-only file system) raises
`RunRecordError` naming the path; nothing already written is touched.

Each per-round operation costs O(1) in the number of rounds: one line
appended to the log and to `metrics.csv`, one checkpoint of fixed size.

None of this imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import hashlib
import io
import json
import math
import os
import re
import shutil
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

__all__ = [
    'Checkpoints', 'ReleaseLog', 'RunRecordError', 'atomic_write',
    'read_json', 'share', 'strict_json', 'write_json',
]

RELEASES = 'releases.jsonl'
_GENESIS = '0' * 64


class RunRecordError(Exception):
  """A run-directory file cannot be read, trusted or written (one line)."""


# ----------------------------------------------------------------------------
# One writer per run directory.

LOCK = '.lock'


@contextlib.contextmanager
def exclusive(directory: str):
  """Holds `directory`'s run lock, or refuses: one process trains a run.

  Two processes training one run directory would interleave their releases
  and checkpoints (and compute released rounds again under a second noise
  draw); the records notice afterwards, this refuses before. The lock is an
  advisory `flock` on `directory/.lock`, released by the kernel however the
  holder ends, so a killed run never leaves a stale lock.
  """
  path = os.path.join(directory, LOCK)
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  except OSError as e:
    raise _write_error(path, e) from None
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(fd, 32, 0).decode(errors='replace').strip()
      raise RunRecordError(
          f'{directory}: another process (pid {holder or "unknown"}) is '
          'training this run; nothing was changed.') from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    yield
  finally:
    os.close(fd)  # Releases the lock.


# ----------------------------------------------------------------------------
# Atomic, durable writes.


def _fsync_dir(directory: str) -> None:
  try:
    fd = os.open(directory or '.', os.O_RDONLY)
  except OSError:
    return  # Not every platform opens directories; the rename still holds.
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def _write_error(path: str, error: OSError) -> RunRecordError:
  reason = os.strerror(error.errno) if error.errno else str(error)
  hint = (' Free some space and rerun the same command: the run resumes.'
          if error.errno in (errno.ENOSPC, errno.EDQUOT) else '')
  return RunRecordError(f'cannot write {path}: {reason}. Nothing already '
                        f'written was changed.{hint}')


def atomic_write(path: str, data: bytes, mode: int = 0o666) -> None:
  """Writes `data` to `path` atomically and durably (tmp, fsync, rename).

  The file has permissions `mode` from its first byte (the temporary file is
  created with them, so a secret is never readable by others, not even
  while it is written); the umask can only narrow them.
  """
  atomic_write_with(path, lambda f: f.write(data), mode)


def atomic_write_with(path: str, write, mode: int = 0o666) -> None:
  """`atomic_write` of what `write(file)` writes to the open binary file:
  written as it is produced, never held whole in memory (a checkpoint is
  the size of the model and the noise mechanism's state)."""
  directory = os.path.dirname(os.path.abspath(path))
  tmp = os.path.join(directory, f'.{os.path.basename(path)}.tmp')
  try:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)  # A killed write's leftover, perhaps with other modes.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with open(fd, 'wb') as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException as e:  # E.g. numpy's error: no partial file left.
    try:
      os.remove(tmp)
    except OSError:
      pass
    if isinstance(e, OSError):
      raise _write_error(path, e) from None
    raise
  _fsync_dir(directory)


def strict_json(value):
  """JSON-safe: non-finite floats become null (strict JSON has no NaN)."""
  if isinstance(value, Mapping):
    return {str(k): strict_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [strict_json(v) for v in value]
  if isinstance(value, (float, np.floating)):
    return float(value) if math.isfinite(value) else None
  if isinstance(value, np.integer):
    return int(value)
  if isinstance(value, np.bool_):
    return bool(value)
  return value


def _dumps(value, **kwargs) -> str:
  return json.dumps(strict_json(value), sort_keys=True, allow_nan=False,
                    **kwargs)


def write_json(path: str, data) -> None:
  """Atomic, durable, strict JSON (no NaN/Infinity)."""
  atomic_write(path, (_dumps(data, indent=2) + '\n').encode())


def read_json(path: str, what: str = 'file'):
  """The JSON at `path`, or `RunRecordError` naming it (never a traceback)."""
  try:
    with open(path, 'rb') as f:
      text = f.read()
  except OSError as e:
    raise RunRecordError(f'{path}: cannot read this {what} '
                         f'({os.strerror(e.errno) if e.errno else e}).'
                         ) from None
  try:
    return json.loads(text)
  except ValueError:
    problem = 'is empty' if not text.strip() else 'is not valid JSON'
    raise RunRecordError(f'{path} {problem} (damaged or truncated {what}).'
                         ) from None


def _rows_from_json(row: Mapping[str, Any]) -> dict[str, Any]:
  return {k: math.nan if v is None else v for k, v in row.items()}


# ----------------------------------------------------------------------------
# The log of released rounds.


def _line_hash(previous: str, body: str) -> str:
  return hashlib.sha256((previous + body).encode()).hexdigest()


class ReleaseLog:
  """`releases.jsonl`: the rounds a run released, hash-chained, append-only.

  Each line is `{"round", "row", "event", "hash"}`: `event` is the round's
  DP event as `privacy_ledger.event_to_dict` writes it (None without DP),
  `hash` the SHA-256 of the previous line's hash and this line's other
  fields. Opening a log verifies every line. A last line cut by a kill
  (no newline, or not JSON) was never released: it is dropped, and the
  caller's checkpoint still holds that round's row. A complete line that
  does not verify raises `RunRecordError` naming the file and line.
  """

  def __init__(self, run_dir: str):
    self.path = os.path.join(run_dir, RELEASES)
    self._records: list[dict[str, Any]] = []
    self._hashes: list[str] = []
    self.dropped_torn_line = False
    if os.path.isdir(self.path):
      raise RunRecordError(f'{self.path} is a directory, not the log of '
                           'released rounds.')
    if os.path.exists(self.path):
      self._load()

  def _load(self) -> None:
    try:
      with open(self.path, 'rb') as f:
        data = f.read()
    except OSError as e:
      raise RunRecordError(f'{self.path}: cannot read the log of released '
                           f'rounds ({os.strerror(e.errno)}).') from None
    lines = data.split(b'\n')
    tail = lines.pop()  # b'' when the file ends with a newline.
    previous = _GENESIS
    for number, line in enumerate(lines, start=1):
      try:
        record = json.loads(line)
        body = _dumps({k: record[k] for k in ('round', 'row', 'event')})
        expected_round = len(self._records) + 1
        valid = (record['round'] == expected_round and
                 record['hash'] == _line_hash(previous, body))
      except (ValueError, KeyError, TypeError):
        valid = False
      if not valid:
        raise RunRecordError(
            f'{self.path}, line {number}: damaged or edited (its hash chain '
            'does not verify). The run cannot be trusted or continued; '
            'nothing was changed.')
      previous = record['hash']
      self._hashes.append(previous)
      self._records.append(record)
    if tail:
      self.dropped_torn_line = True
    if self.dropped_torn_line:
      self._rewrite()

  def _rewrite(self) -> None:
    atomic_write(self.path, b''.join(
        (json.dumps(r) + '\n').encode()
        for r in self._records))

  def __len__(self) -> int:
    return len(self._records)

  @property
  def last_round(self) -> int:
    """The last released round (0 when none)."""
    return len(self._records)

  def hash_at(self, round_num: int) -> str:
    """The chain hash after round `round_num` (the genesis hash for 0)."""
    return self._hashes[round_num - 1] if round_num else _GENESIS

  @property
  def records(self) -> Sequence[Mapping[str, Any]]:
    return tuple(self._records)

  def rows(self) -> list[dict[str, Any]]:
    """The released rows, NaN where a value was not finite."""
    return [_rows_from_json(r['row']) for r in self._records]

  def row(self, round_num: int) -> dict[str, Any]:
    """The row released for `round_num`, as `rows` gives it."""
    return _rows_from_json(self._records[round_num - 1]['row'])

  def events(self) -> list[tuple[int, Optional[Mapping[str, Any]]]]:
    return [(r['round'], r['event']) for r in self._records]

  def append(self, round_num: int, row: Mapping[str, Any],
             event: Optional[Mapping[str, Any]]) -> None:
    """Releases round `round_num` (the next one): one durable line."""
    if round_num != self.last_round + 1:
      raise RunRecordError(
          f'{self.path}: round {round_num} cannot follow round '
          f'{self.last_round} (a round is released once, in order).')
    fields = {'round': round_num, 'row': strict_json(dict(row)),
              'event': event}
    body = _dumps(fields)
    record = dict(fields, hash=_line_hash(self.hash_at(self.last_round), body))
    line = (json.dumps(record) + '\n').encode()
    try:
      with open(self.path, 'ab') as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
    except OSError as e:
      self._rewrite_quietly()
      raise _write_error(self.path, e) from None
    if len(self._records) == 0:
      _fsync_dir(os.path.dirname(os.path.abspath(self.path)))
    self._records.append(record)
    self._hashes.append(record['hash'])

  def _rewrite_quietly(self) -> None:
    # A partial append (full disk) must not leave half a line behind.
    try:
      self._rewrite()
    except RunRecordError:
      pass  # Dropped as a torn line when the log is next opened.

  def truncate(self, last_round: int) -> None:
    """Forgets rounds after `last_round` (only for runs without DP)."""
    if last_round < self.last_round:
      del self._records[last_round:]
      del self._hashes[last_round:]
      self._rewrite()


def metrics_csv(rows: Iterable[Mapping[str, Any]]) -> bytes:
  """The text of `metrics.csv` for the released rows (a view of the log)."""
  rows = list(rows)
  fields = _fieldnames(rows)
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator='\n')
  writer.writeheader()
  for row in rows:
    writer.writerow({k: row.get(k, '') for k in fields})
  return buffer.getvalue().encode()


def write_metrics_csv(path: str, rows: Iterable[Mapping[str, Any]]) -> None:
  """`metrics.csv` from the released rows, atomically."""
  atomic_write(path, metrics_csv(rows))


def repair_metrics_csv(path: str, rows: Sequence[Mapping[str, Any]]) -> bool:
  """Rebuilds `path` from `rows` unless it already holds them; True if so."""
  try:
    with open(path, 'rb') as f:
      if f.read() == metrics_csv(rows):
        return False
  except OSError:
    pass
  write_metrics_csv(path, rows)
  return True


def append_metrics_csv(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
  """Appends the last of `rows` (or rebuilds the file if its columns grew).

  O(1) in the number of rows: the file's header (written from the same rows,
  or rebuilt from the log on resume) is trusted unless the last row brings a
  column it lacks.
  """
  header = None
  if os.path.exists(path):
    with open(path, newline='') as f:
      header = next(csv.reader(f), None)
  if not header or header[0] != 'round' or any(
      k not in header for k in rows[-1]):
    write_metrics_csv(path, rows)
    return
  fields = header
  buffer = io.StringIO()
  csv.DictWriter(buffer, fieldnames=fields, lineterminator='\n').writerow(
      {k: rows[-1].get(k, '') for k in fields})
  try:
    with open(path, 'a', newline='') as f:
      f.write(buffer.getvalue())
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:
    raise _write_error(path, e) from None


def _fieldnames(rows) -> list[str]:
  fields = ['round']
  for row in rows:
    fields.extend(k for k in row if k not in fields)
  return fields


# ----------------------------------------------------------------------------
# Checkpoints.

_CHECKPOINT = re.compile(r'^round_(\d{6,})\.npz$')
_SLICES = re.compile(r'^slices_(\d{6,})\.npz$')


# A checkpoint holds secrets (the DP noise key; for correlated noise, past
# noise vectors; the row of a round not yet released, with metrics epsilon
# does not cover): the directory is its owner's only (0700), every file in
# it 0600.
SECRET_DIR_MODE = 0o700
SECRET_FILE_MODE = 0o600


def _digest(array: np.ndarray) -> bytes:
  """SHA-256 of an array's dtype, shape and bytes: whether a ring shifted."""
  h = hashlib.sha256(f'{array.dtype.str}{array.shape}'.encode())
  h.update(np.ascontiguousarray(array).tobytes())
  return h.digest()


def _vectors(leaf: np.ndarray) -> bool:
  """Whether a leaf could be a ring: two or more vectors along axis 0."""
  return leaf.ndim >= 2 and leaf.shape[0] >= 2


def _slice_refs(data) -> dict[int, list[tuple[int, int]]]:
  """{leaf: [(slices file's round, row in its array), ...]} of a checkpoint,
  stored as int64s: leaf, count, then (round, row) pairs, leaf after leaf."""
  if 'slices' not in data.files:
    return {}
  flat, refs, at = data['slices'].tolist(), {}, 0
  while at < len(flat):
    leaf, count = flat[at], flat[at + 1]
    pairs = flat[at + 2:at + 2 + 2 * count]
    refs[leaf] = list(zip(pairs[::2], pairs[1::2]))
    at += 2 + 2 * count
  return refs


class Checkpoints:
  """`checkpoints/round_NNNNNN.npz`: a state's leaves and a JSON header.

  `save` writes atomically and keeps the newest `keep`; `load_latest`
  returns the newest readable one, skipping (and naming) damaged ones. The
  directory and its files are readable by their owner only
  (`SECRET_DIR_MODE`, `SECRET_FILE_MODE`): a checkpoint of a DP run holds
  the noise key, from which the noise of every round can be regenerated and
  subtracted from the released model.

  A leaf that is a ring of past vectors (banded noise's last b - 1 noise
  vectors: each round shifts it by one and puts the new vector first) is
  not written whole each round: its new vector goes to
  `slices_NNNNNN.npz`, written before the checkpoint that refers to it, and
  the checkpoint names the earlier rounds' files that hold the rest (8
  bytes a vector). A slices file is removed only once no kept checkpoint
  refers to it. So a round writes the model, the rest of the state and one
  new vector per ring, whatever the ring's length; a kill between any two
  writes leaves the newest complete checkpoint loadable with every file it
  refers to, and an older one too.
  """

  def __init__(self, directory: str, keep: int = 2):
    self.directory = directory
    self._keep = keep
    # Per leaf of the last checkpoint saved or loaded, per axis-0 vector:
    # (its digest, (slices file's round, row) or None when written inline).
    self._last: list[list[tuple[bytes, Optional[tuple[int, int]]]]] = []

  def _make_private(self) -> None:
    """Creates the directory (0700), or narrows an existing one and its files."""
    try:
      os.makedirs(self.directory, mode=SECRET_DIR_MODE, exist_ok=True)
      os.chmod(self.directory, SECRET_DIR_MODE)
      for name in os.listdir(self.directory):
        path = os.path.join(self.directory, name)
        if os.path.isfile(path) and not os.path.islink(path):
          os.chmod(path, SECRET_FILE_MODE)
    except OSError as e:
      raise _write_error(self.directory, e) from None

  def path(self, round_num: int) -> str:
    """The file of round `round_num`'s checkpoint."""
    return os.path.join(self.directory, f'round_{round_num:06d}.npz')

  def slices_path(self, round_num: int) -> str:
    """The file of the ring vectors round `round_num` was the first to hold."""
    return os.path.join(self.directory, f'slices_{round_num:06d}.npz')

  def _listed(self, pattern) -> list[int]:
    if not os.path.isdir(self.directory):
      return []
    return sorted(int(m.group(1)) for m in map(
        pattern.match, os.listdir(self.directory)) if m)

  def versions(self) -> list[int]:
    return self._listed(_CHECKPOINT)

  def _plan(self, round_num, arrays):
    """(inline leaves, new vectors, refs): a leaf whose vectors 1.. are the
    last checkpoint's vectors 0..-2 of that leaf (a shifted ring) refers to
    them where they were written."""
    inline, new, flat, last = {}, {}, [], []
    for i, leaf in enumerate(arrays):
      digests = [_digest(v) for v in leaf] if _vectors(leaf) else []
      before = self._last[i] if i < len(self._last) else []
      if (digests and len(before) == len(digests) and
          digests[1:] == [d for d, _ in before[:-1]]):
        if all(where is not None for _, where in before[:-1]):
          new[f'leaf_{i:05d}'] = leaf[:1]
          where = [(round_num, 0)] + [w for _, w in before[:-1]]
        else:  # The ring was inline: its vectors are written here once.
          new[f'leaf_{i:05d}'] = leaf
          where = [(round_num, j) for j in range(len(leaf))]
        flat += [i, len(where)] + [n for pair in where for n in pair]
        last.append(list(zip(digests, where)))
      else:
        inline[f'leaf_{i:05d}'] = leaf
        last.append([(d, None) for d in digests])
    return inline, new, flat, last

  def save(self, round_num: int, leaves: Sequence[Any],
           header: Mapping[str, Any]) -> None:
    self._make_private()
    arrays = [np.asarray(leaf) for leaf in leaves]
    inline, new, flat, last = self._plan(round_num, arrays)
    inline['header'] = np.asarray(json.dumps(  # Key order kept (rows).
        strict_json(dict(header, round=round_num)), allow_nan=False))
    if flat:
      inline['slices'] = np.asarray(flat, np.int64)
    # The vectors first: a checkpoint never refers to a file not written.
    if new:
      atomic_write_with(self.slices_path(round_num),
                        lambda f: np.savez(f, **new), mode=SECRET_FILE_MODE)
    atomic_write_with(self.path(round_num), lambda f: np.savez(f, **inline),
                      mode=SECRET_FILE_MODE)
    self._last = last
    self._remove_old()

  def _remove_old(self) -> None:
    """Removes all but the newest `keep` checkpoints, then the slices files
    no kept checkpoint refers to (none when a kept one cannot be read)."""
    for old in self.versions()[:-self._keep]:
      try:
        os.remove(self.path(old))
      except OSError:
        pass
    referenced = set()
    for version in self.versions():
      try:
        with np.load(self.path(version), allow_pickle=False) as data:
          refs = _slice_refs(data)
      except Exception:  # pylint: disable=broad-except
        return
      referenced.update(at for ref in refs.values() for at, _ in ref)
    for version in self._listed(_SLICES):
      if version not in referenced:
        try:
          os.remove(self.slices_path(version))
        except OSError:
          pass

  def load(self, round_num: int) -> tuple[list[np.ndarray], dict[str, Any]]:
    path = self.path(round_num)
    try:
      with np.load(path, allow_pickle=False) as data:
        header = json.loads(str(data['header']))
        refs = _slice_refs(data)
        stored = {int(n[len('leaf_'):]): data[n] for n in data.files
                  if n.startswith('leaf_')}
    except Exception as e:  # pylint: disable=broad-except
      raise RunRecordError(f'{path} is damaged ({type(e).__name__}).'
                           ) from None
    if header.get('round') != round_num:
      raise RunRecordError(f'{path} holds round {header.get("round")}, not '
                           f'{round_num}.')
    for i, ref in refs.items():
      written = {at: self._vectors_of(path, i, at)
                 for at in {a for a, _ in ref}}
      try:
        stored[i] = np.stack([written[at][row] for at, row in ref])
      except IndexError:
        raise RunRecordError(f'{path} refers to vectors its slices files do '
                             'not hold (damaged).') from None
    leaves = [stored.get(i) for i in range(len(stored))]
    if any(leaf is None for leaf in leaves):
      raise RunRecordError(f'{path} is damaged (leaves missing).')
    self._last = [
        [(_digest(v), refs[i][j] if i in refs else None)
         for j, v in enumerate(leaf)] if _vectors(leaf) else []
        for i, leaf in enumerate(leaves)]
    return leaves, header

  def _vectors_of(self, path: str, leaf: int, at: int) -> np.ndarray:
    """The vectors of leaf `leaf` that round `at` wrote, for `path`."""
    source = self.slices_path(at)
    try:
      with np.load(source, allow_pickle=False) as data:
        return data[f'leaf_{leaf:05d}']
    except Exception as e:  # pylint: disable=broad-except
      raise RunRecordError(f'{path} refers to {source}, which is missing or '
                           f'damaged ({type(e).__name__}).') from None

  def load_latest(self, warn=print):
    """(round, leaves, header) of the newest readable checkpoint, or None."""
    if os.path.isdir(self.directory):
      self._make_private()  # Checkpoints written by an older version.
      for name in os.listdir(self.directory):
        if name.startswith('.') and name.endswith('.tmp'):
          os.remove(os.path.join(self.directory, name))  # A killed save.
    for version in reversed(self.versions()):
      try:
        leaves, header = self.load(version)
      except RunRecordError as e:
        warn(f'{e} Trying an older checkpoint.')
        continue
      if version == self.versions()[-1]:
        self._remove_old()  # What a save killed before its removals left.
      return version, leaves, header
    return None


# ----------------------------------------------------------------------------
# What a run directory proves was released.

# Files a run writes only once a round was released.
RELEASED_FILES = ('metrics.csv', 'summary.json', 'ledger.json', 'plot.png',
                  'tensorboard')
# What a run directory may hand over: what its rounds released and the
# configuration they were released under. Never `checkpoints/` (the noise
# key) or the lock.
SHAREABLE = ('config.json', RELEASES) + RELEASED_FILES


MODEL = 'model.npz'


def _write_released_model(run_dir: str, path: str) -> bool:
  """Writes the last released round's model weights alone to `path`.

  From the checkpoint of the round `releases.jsonl` ends with (a newer,
  pending one holds a model not yet released): its first leaves, as the
  checkpoint's header lays them out, saved as `trainable_NNNNN` and
  `non_trainable_NNNNN` arrays (the order of
  `tff.learning.models.ModelWeights`). False when no such checkpoint loads.
  """
  try:
    released = ReleaseLog(run_dir).last_round
  except RunRecordError:
    return False
  checkpoints = Checkpoints(os.path.join(run_dir, 'checkpoints'))
  if not released or released not in checkpoints.versions():
    return False
  try:
    leaves, header = checkpoints.load(released)
  except RunRecordError:
    return False
  layout = header.get('model')
  if not isinstance(layout, Mapping):
    return False
  n, m = layout.get('trainable', 0), layout.get('non_trainable', 0)
  arrays = {f'trainable_{i:05d}': leaves[i] for i in range(n)}
  arrays.update({f'non_trainable_{i:05d}': leaves[n + i] for i in range(m)})
  atomic_write_with(path, lambda f: np.savez(f, **arrays))
  return True


def share(run_dir: str, destination: str) -> list[str]:
  """Copies a run's released outputs, and nothing secret, to `destination`.

  `destination` must not exist (nothing is overwritten); it appears whole or
  not at all (the copy is made beside it and renamed). The last released
  round's model weights, alone, go to `model.npz`. Returns the names
  written. `checkpoints/` (the DP noise key, and the row of a round not yet
  released) and anything `SHAREABLE` does not name stay behind.
  """
  if not os.path.isfile(os.path.join(run_dir, 'config.json')):
    raise RunRecordError(f'{run_dir!r} holds no tff_clip run (no '
                         'config.json); nothing was copied.')
  if os.path.lexists(destination):
    raise RunRecordError(f'{destination!r} exists; nothing was copied or '
                         'overwritten. Name a new directory.')
  parent = os.path.dirname(os.path.abspath(destination))
  tmp = os.path.join(parent, f'.{os.path.basename(destination)}.tmp')
  try:
    if os.path.lexists(tmp):
      shutil.rmtree(tmp)
    os.makedirs(tmp)
    copied = []
    for name in SHAREABLE:
      source = os.path.join(run_dir, name)
      if os.path.islink(source) or not os.path.exists(source):
        continue
      if os.path.isdir(source):
        shutil.copytree(source, os.path.join(tmp, name), symlinks=False,
                        ignore=shutil.ignore_patterns('.*'))
      else:
        shutil.copy2(source, os.path.join(tmp, name))
      copied.append(name)
    if _write_released_model(run_dir, os.path.join(tmp, MODEL)):
      copied.append(MODEL)
    os.rename(tmp, destination)
  except OSError as e:
    shutil.rmtree(tmp, ignore_errors=True)
    raise _write_error(destination, e) from None
  _fsync_dir(parent)
  return copied
