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
durable). An append to the log is flushed, and fsynced before the call
returns (a release of many rounds fsyncs once, when all are appended). A
write that fails (a full disk, a read-only file system) raises
`RunRecordError` naming the path; nothing already written is touched.

Each per-round operation costs O(1) in the number of rounds: one line
appended to the log and to `metrics.csv`, one checkpoint of fixed size.

Only its owner controls a run directory (`tff_clip.program.ownership`,
whose names this module re-exports): every file here is opened with
`open_file` (never through a symbolic link, a regular file of the user's
that no one else may write) and created writable by its owner alone (0644,
the lock and checkpoints 0600).

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
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

# Re-exported: the records are opened and placed as `ownership` says.
from tff_clip.program.ownership import DIR_MODE, FILE_MODE
from tff_clip.program.ownership import LocationError, RunRecordError
from tff_clip.program.ownership import UnsafeFileError, check_location
from tff_clip.program.ownership import check_tree, ensure_dir, open_file
from tff_clip.program.ownership import read_bytes, tfrecords

__all__ = [
    'DIR_MODE', 'FILE_MODE', 'LocationError', 'ReleaseLog', 'RunRecordError',
    'UnsafeFileError', 'atomic_write', 'atomic_write_with', 'check_location',
    'check_tree', 'ensure_dir', 'fsync_dir', 'open_file', 'read_bytes',
    'read_json', 'strict_json', 'tfrecords', 'write_error', 'write_json',
]

RELEASES = 'releases.jsonl'
_GENESIS = '0' * 64


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

  The directory is checked first (`check_location`), and the lock is opened
  with `open_file`: a `.lock` that is a symbolic link is refused, and
  nothing is created or truncated through one.
  """
  check_location(directory)
  path = os.path.join(directory, LOCK)
  try:
    lock = open_file(path, 'r+b', create_mode=0o600, buffering=0)
  except OSError as e:
    raise write_error(path, e) from None
  fd = lock.fileno()
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
    lock.close()  # Releases the lock.


# ----------------------------------------------------------------------------
# Atomic, durable writes.


def fsync_dir(directory: str) -> None:
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


def write_error(path: str, error: OSError) -> RunRecordError:
  reason = os.strerror(error.errno) if error.errno else str(error)
  hint = (' Free some space and rerun the same command: the run resumes.'
          if error.errno in (errno.ENOSPC, errno.EDQUOT) else '')
  return RunRecordError(f'cannot write {path}: {reason}. Nothing already '
                        f'written was changed.{hint}')


def atomic_write(path: str, data: bytes, mode: int = FILE_MODE) -> None:
  """Writes `data` to `path` atomically and durably (tmp, fsync, rename).

  The file has permissions `mode` from its first byte (the temporary file is
  created with them, so a secret is never readable by others, not even
  while it is written); the umask can only narrow them.
  """
  atomic_write_with(path, lambda f: f.write(data), mode)


def atomic_write_with(path: str, write, mode: int = FILE_MODE) -> None:
  """`atomic_write` of what `write(file)` writes to the open binary file:
  written as it is produced, never held whole in memory (a checkpoint is
  the size of the model and the noise mechanism's state).

  The temporary file is created with `O_EXCL | O_NOFOLLOW` (never through a
  link), and the rename replaces `path` itself, a link included, never
  what a link points to."""
  directory = os.path.dirname(os.path.abspath(path))
  tmp = os.path.join(directory, f'.{os.path.basename(path)}.tmp')
  try:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)  # A killed write's leftover, perhaps with other modes.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                 os.O_NOFOLLOW | os.O_CLOEXEC, mode)
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
      raise write_error(path, e) from None
    raise
  fsync_dir(directory)


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
  """The JSON at `path`, or `RunRecordError` naming it (never a traceback).

  Read with `open_file`: a link or a file another user may write is refused.
  """
  try:
    text = read_bytes(path)
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
  fields. Opening a log verifies every line and writes nothing. A last line
  cut by a kill (no newline, or not JSON) was never released: it is left
  out, and the caller's checkpoint still holds that round's row; the file
  loses it only when a round is appended (or the log truncated), so a run
  refused after reading the log leaves every byte of it in place. A
  complete line that does not verify raises `RunRecordError` naming the file
  and line.
  """

  def __init__(self, run_dir: str):
    self.path = os.path.join(run_dir, RELEASES)
    self._records: list[dict[str, Any]] = []
    self._hashes: list[str] = []
    self._new_file = False  # Its directory entry not yet fsynced.
    self.dropped_torn_line = False
    if os.path.isdir(self.path) and not os.path.islink(self.path):
      raise RunRecordError(f'{self.path} is a directory, not the log of '
                           'released rounds.')
    if os.path.lexists(self.path):
      self._load()

  def _load(self) -> None:
    try:
      data = read_bytes(self.path)
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
      self.dropped_torn_line = True  # Cut from the file at the next append.

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
             event: Optional[Mapping[str, Any]], sync: bool = True) -> None:
    """Releases round `round_num` (the next one): one line, written and
    flushed, and durable (fsynced) before the call returns; with `sync`
    False, at the next `sync()` (a release of many rounds syncs once)."""
    if round_num != self.last_round + 1:
      raise RunRecordError(
          f'{self.path}: round {round_num} cannot follow round '
          f'{self.last_round} (a round is released once, in order).')
    fields = {'round': round_num, 'row': strict_json(dict(row)),
              'event': event}
    body = _dumps(fields)
    record = dict(fields, hash=_line_hash(self.hash_at(self.last_round), body))
    line = (json.dumps(record) + '\n').encode()
    if self.dropped_torn_line:
      self._rewrite()  # The cut line goes before the next one is appended.
      self.dropped_torn_line = False
    try:
      with open_file(self.path, 'ab') as f:
        f.write(line)
        f.flush()
        if sync:
          os.fsync(f.fileno())
    except OSError as e:
      self._rewrite_quietly()
      raise write_error(self.path, e) from None
    self._new_file = self._new_file or not self._records
    self._records.append(record)
    self._hashes.append(record['hash'])
    if sync and self._new_file:
      fsync_dir(os.path.dirname(os.path.abspath(self.path)))
      self._new_file = False

  def sync(self) -> None:
    """Makes every line appended so far durable (the file, and the
    directory entry of a new log)."""
    if self._records:
      sync_file(self.path)
    if self._new_file:
      fsync_dir(os.path.dirname(os.path.abspath(self.path)))
      self._new_file = False

  def _rewrite_quietly(self) -> None:
    # A partial append (full disk) must not leave half a line behind.
    try:
      self._rewrite()
    except RunRecordError:
      pass  # Dropped as a torn line when the log is next opened.

  def truncate(self, last_round: int) -> None:
    """Forgets rounds after `last_round` (only for runs without DP)."""
    if last_round < self.last_round or self.dropped_torn_line:
      del self._records[last_round:]
      del self._hashes[last_round:]
      self._rewrite()
      self.dropped_torn_line = False


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
    if read_bytes(path) == metrics_csv(rows):
      return False
  except OSError:
    pass
  write_metrics_csv(path, rows)
  return True


def append_metrics_csv(path: str, rows: Sequence[Mapping[str, Any]],
                       sync: bool = True) -> None:
  """Appends the last of `rows` (or rebuilds the file if its columns grew);
  fsynced unless `sync` is False (`sync_file` later).

  O(1) in the number of rows: the file's header (written from the same rows,
  or rebuilt from the log on resume) is trusted unless the last row brings a
  column it lacks.
  """
  header = None
  if os.path.lexists(path):
    with open_file(path, 'r', newline='') as f:
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
    with open_file(path, 'a', newline='') as f:
      f.write(buffer.getvalue())
      f.flush()
      if sync:
        os.fsync(f.fileno())
  except OSError as e:
    raise write_error(path, e) from None


def sync_file(path: str) -> None:
  """fsyncs the run file `path` (what was appended to it is durable)."""
  try:
    with open_file(path, 'a') as f:
      os.fsync(f.fileno())
  except OSError as e:
    raise write_error(path, e) from None


def _fieldnames(rows) -> list[str]:
  fields = ['round']
  for row in rows:
    fields.extend(k for k in row if k not in fields)
  return fields
