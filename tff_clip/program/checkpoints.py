"""Checkpoints of a run directory, and what of a run may be shared.

`Checkpoints` writes `checkpoints/round_NNNNNN.npz` atomically, owner-only
(the DP noise key and correlated noise's past vectors are secrets), and a
banded ring of past noise vectors one new vector a round
(`slices_NNNNNN.npz`). `share` copies what a run released, and the
released model, to a directory others may read.

None of this imports TensorFlow.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from tff_clip.program import ownership
from tff_clip.program import run_records

__all__ = ['Checkpoints', 'SECRET_DIR_MODE', 'SECRET_FILE_MODE',
           'pending_rounds', 'share']

_CHECKPOINT = re.compile(r'^round_(\d{6,})\.npz$')
_SLICES = re.compile(r'^slices_(\d{6,})\.npz$')


# A checkpoint holds secrets (the DP noise key; for correlated noise, past
# noise vectors; the row of a round not yet released, with metrics epsilon
# does not cover): the directory is its owner's only (0700), every file in
# it 0600.
SECRET_DIR_MODE = 0o700
SECRET_FILE_MODE = 0o600


def _digest(array: np.ndarray) -> bytes:
  """SHA-256 of an array's dtype, shape and bytes: whether a ring shifted.

  One pass over the bytes of a whole stack of vectors: `_digest(leaf[1:])
  == _digest(last[:-1])` holds exactly when each of the leaf's vectors 1..
  is the last leaf's vector before it (same dtype, vector shape and count,
  same bytes), at the cost of two hashes a leaf, not one a vector."""
  h = hashlib.sha256(f'{array.dtype.str}{array.shape}'.encode())
  h.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
  return h.digest()


def _vectors(leaf: np.ndarray) -> bool:
  """Whether a leaf could be a ring: two or more vectors along axis 0."""
  return leaf.ndim >= 2 and leaf.shape[0] >= 2


def _remembered(leaf: np.ndarray, where):
  """What the next save compares a leaf with (`Checkpoints._last`)."""
  return (_digest(leaf[:-1]), where) if _vectors(leaf) else None


def pending_rounds(header: Mapping[str, Any], version: int
                   ) -> list[tuple[int, Any, Any]]:
  """[(round, row, event), ...]: the DP rounds a checkpoint of round
  `version` holds before their release, oldest first (the rounds up to
  `version`, one after another); [] when it holds none.

  The header's `pending` is a list of {round, row, event}; a checkpoint of
  an earlier version holds one round's {row, event}, read as `version`'s.
  A list that is not those rounds raises ValueError.
  """
  pending = header.get('pending')
  if not pending:
    return []
  if isinstance(pending, Mapping):
    pending = [dict(pending, round=version)]
  if not isinstance(pending, list) or not all(
      isinstance(p, Mapping) for p in pending):
    raise ValueError('its pending rounds are not a list of rounds')
  rounds = [p.get('round') for p in pending]
  if rounds != list(range(version - len(pending) + 1, version + 1)):
    raise ValueError(f'its pending rounds {rounds} do not end at {version}')
  return [(p['round'], p.get('row'), p.get('event')) for p in pending]


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
    # Per leaf of the last checkpoint saved or loaded: None when it is no
    # stack of vectors, else (the digest of its vectors but the last, where
    # each vector was written: [(slices file's round, row), ...], or None
    # when the leaf was written inline).
    self._last: list[Optional[tuple[bytes,
                                    Optional[list[tuple[int, int]]]]]] = []

  def _make_private(self) -> None:
    """Creates the directory (0700), or narrows an existing one and its files.

    Never through a link: the directory and its entries are checked first
    (`run_records.check_tree`), each file narrowed through a descriptor
    opened with `O_NOFOLLOW`."""
    try:
      if not os.path.lexists(self.directory):
        os.makedirs(self.directory, mode=SECRET_DIR_MODE)
      run_records.check_tree(self.directory)
      os.chmod(self.directory, SECRET_DIR_MODE)
      for name in os.listdir(self.directory):
        fd = os.open(os.path.join(self.directory, name),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK |
                     os.O_CLOEXEC)
        try:
          os.fchmod(fd, SECRET_FILE_MODE)
        finally:
          os.close(fd)
    except OSError as e:
      raise run_records.write_error(self.directory, e) from None

  def path(self, round_num: int) -> str:
    """The file of round `round_num`'s checkpoint."""
    return os.path.join(self.directory, f'round_{round_num:06d}.npz')

  def slices_path(self, round_num: int) -> str:
    """The file of the ring vectors round `round_num` was the first to hold."""
    return os.path.join(self.directory, f'slices_{round_num:06d}.npz')

  def _listed(self, pattern) -> list[int]:
    if not os.path.lexists(self.directory):
      return []
    run_records.check_tree(self.directory)  # No link, nothing foreign.
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
      before = self._last[i] if i < len(self._last) else None
      if (_vectors(leaf) and before is not None and
          _digest(leaf[1:]) == before[0]):
        if before[1] is not None:
          new[f'leaf_{i:05d}'] = leaf[:1]
          where = [(round_num, 0)] + before[1][:-1]
        else:  # The ring was inline: its vectors are written here once.
          new[f'leaf_{i:05d}'] = leaf
          where = [(round_num, j) for j in range(len(leaf))]
        flat += [i, len(where)] + [n for pair in where for n in pair]
      else:
        inline[f'leaf_{i:05d}'] = leaf
        where = None
      last.append(_remembered(leaf, where))
    return inline, new, flat, last

  def save(self, round_num: int, leaves: Sequence[Any],
           header: Mapping[str, Any]) -> None:
    self._make_private()
    arrays = [np.asarray(leaf) for leaf in leaves]
    inline, new, flat, last = self._plan(round_num, arrays)
    inline['header'] = np.asarray(json.dumps(  # Key order kept (rows).
        run_records.strict_json(dict(header, round=round_num)), allow_nan=False))
    if flat:
      inline['slices'] = np.asarray(flat, np.int64)
    # The vectors first: a checkpoint never refers to a file not written.
    if new:
      run_records.atomic_write_with(self.slices_path(round_num),
                                    lambda f: np.savez(f, **new),
                                    mode=SECRET_FILE_MODE)
    run_records.atomic_write_with(self.path(round_num),
                                  lambda f: np.savez(f, **inline),
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
    slices = self._listed(_SLICES)
    if not slices:  # Nothing to tidy (no correlated noise's ring).
      return
    referenced = set()
    for version in self.versions():
      try:
        with _open(self.path(version)) as f, np.load(
            f, allow_pickle=False) as data:
          refs = _slice_refs(data)
      except Exception:  # pylint: disable=broad-except
        return
      referenced.update(at for ref in refs.values() for at, _ in ref)
    for version in slices:
      if version not in referenced:
        try:
          os.remove(self.slices_path(version))
        except OSError:
          pass

  def load(self, round_num: int) -> tuple[list[np.ndarray], dict[str, Any]]:
    path = self.path(round_num)
    try:
      with _open(path) as f, np.load(f, allow_pickle=False) as data:
        header = json.loads(str(data['header']))
        refs = _slice_refs(data)
        stored = {int(n[len('leaf_'):]): data[n] for n in data.files
                  if n.startswith('leaf_')}
    except run_records.UnsafeFileError:
      raise  # A link or a foreign file: refused, never read.
    except Exception as e:  # pylint: disable=broad-except
      raise run_records.RunRecordError(f'{path} is damaged ({type(e).__name__}).'
                           ) from None
    if header.get('round') != round_num:
      raise run_records.RunRecordError(f'{path} holds round {header.get("round")}, not '
                           f'{round_num}.')
    try:
      pending_rounds(header, round_num)
    except ValueError as e:
      raise run_records.RunRecordError(f'{path} is damaged ({e}).') from None
    for i, ref in refs.items():
      written = {at: self._vectors_of(path, i, at)
                 for at in {a for a, _ in ref}}
      try:
        stored[i] = np.stack([written[at][row] for at, row in ref])
      except IndexError:
        raise run_records.RunRecordError(f'{path} refers to vectors its slices files do '
                             'not hold (damaged).') from None
    leaves = [stored.get(i) for i in range(len(stored))]
    if any(leaf is None for leaf in leaves):
      raise run_records.RunRecordError(f'{path} is damaged (leaves missing).')
    self._last = [_remembered(leaf, refs.get(i))
                  for i, leaf in enumerate(leaves)]
    return leaves, header

  def _vectors_of(self, path: str, leaf: int, at: int) -> np.ndarray:
    """The vectors of leaf `leaf` that round `at` wrote, for `path`."""
    source = self.slices_path(at)
    try:
      with _open(source) as f, np.load(f, allow_pickle=False) as data:
        return data[f'leaf_{leaf:05d}']
    except run_records.UnsafeFileError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      raise run_records.RunRecordError(f'{path} refers to {source}, which is missing or '
                           f'damaged ({type(e).__name__}).') from None

  def load_latest(self, warn=print):
    """(round, leaves, header) of the newest readable checkpoint, or None.

    Reads only: what a killed save left is removed by `tidy`, once the
    caller has decided to go on (a refusal changes nothing)."""
    for version in reversed(self.versions()):
      try:
        leaves, header = self.load(version)
      except run_records.UnsafeFileError:
        raise  # A link or a foreign file: refused, never passed over.
      except run_records.RunRecordError as e:
        warn(f'{e} Trying an older checkpoint.')
        continue
      return version, leaves, header
    return None

  def tidy(self) -> None:
    """Before a run goes on from its checkpoints: narrows the directory and
    its files to their owner (as an older version may have left them),
    removes what a killed save left (its temporary files, the checkpoints
    and slices files its removals did not reach)."""
    if not os.path.lexists(self.directory):
      return
    self._make_private()
    for name in os.listdir(self.directory):
      if name.startswith('.') and name.endswith('.tmp'):
        os.remove(os.path.join(self.directory, name))  # A killed save.
    self._remove_old()


# ----------------------------------------------------------------------------
# What a run directory proves was released.

# Files a run writes only once a round was released.
RELEASED_FILES = ('metrics.csv', 'summary.json', 'ledger.json', 'plot.png',
                  'tensorboard')
# What a run directory may hand over: what its rounds released and the
# configuration they were released under. Never `checkpoints/` (the noise
# key) or the lock.
SHAREABLE = ('config.json', run_records.RELEASES) + RELEASED_FILES


MODEL = 'model.npz'


def _open(path: str):
  """A checkpoint's file, opened with `run_records.open_file`."""
  return run_records.open_file(path, 'rb')


def _write_released_model(run_dir: str, path: str) -> bool:
  """Writes the last released round's model weights alone to `path`.

  From the checkpoint of the round `releases.jsonl` ends with (a newer,
  pending one holds a model not yet released): its first leaves, as the
  checkpoint's header lays them out, saved as `trainable_NNNNN` and
  `non_trainable_NNNNN` arrays (the order of
  `tff.learning.models.ModelWeights`). False when no such checkpoint loads.
  """
  try:
    released = run_records.ReleaseLog(run_dir).last_round
  except run_records.RunRecordError:
    return False
  checkpoints = Checkpoints(os.path.join(run_dir, 'checkpoints'))
  if not released or released not in checkpoints.versions():
    return False
  try:
    leaves, header = checkpoints.load(released)
  except run_records.RunRecordError:
    return False
  layout = header.get('model')
  if not isinstance(layout, Mapping):
    return False
  n, m = layout.get('trainable', 0), layout.get('non_trainable', 0)
  arrays = {f'trainable_{i:05d}': leaves[i] for i in range(n)}
  arrays.update({f'non_trainable_{i:05d}': leaves[n + i] for i in range(m)})
  run_records.atomic_write_with(path, lambda f: np.savez(f, **arrays))
  return True


# What a run writes as a directory of released files; every other shared
# name is a file (a directory there, checkpoints/ renamed, is no release).
_RELEASED_DIRS = ('tensorboard',)


def _copy_regular(source: str, target: str, name: str,
                  copied: list[str], skipped: list[str]) -> None:
  """Copies the regular files under `source` to `target`, never through a
  link: a link, or anything but a regular file or a directory, is left out
  and named in `skipped` (as `name`, the path within the run directory),
  as is a directory outside `_RELEASED_DIRS` and a file another user owns
  or may write (`run_records.open_file`)."""
  try:
    st = os.lstat(source)
  except OSError as e:
    skipped.append(f'{name} ({e.strerror})')
    return
  if stat.S_ISDIR(st.st_mode):
    if name.split('/')[0] not in _RELEASED_DIRS:
      skipped.append(f'{name} (a directory, where a run writes a file)')
      return
    os.mkdir(target, 0o755)
    for entry in sorted(os.listdir(source)):
      _copy_regular(os.path.join(source, entry), os.path.join(target, entry),
                    f'{name}/{entry}', copied, skipped)
    return
  if stat.S_ISLNK(st.st_mode):
    skipped.append(f'{name} (a symbolic link)')
    return
  if not stat.S_ISREG(st.st_mode):
    skipped.append(f'{name} (not a regular file)')
    return
  if os.path.basename(name).startswith('.'):
    skipped.append(f'{name} (a hidden file)')
    return
  try:
    # As a run opens its files: no link, a regular file of the user's (or
    # root's) no one else may write; another's is theirs to have written.
    f = run_records.open_file(source, 'rb')
  except run_records.UnsafeFileError:
    skipped.append(f'{name} (not a regular file of yours that no one else '
                   'may write)')
    return
  except OSError as e:
    skipped.append(f'{name} ({e.strerror})')
    return
  with f:
    st = os.fstat(f.fileno())
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                  os.O_NOFOLLOW | os.O_CLOEXEC, stat.S_IMODE(st.st_mode))
    with open(out, 'wb') as g:
      shutil.copyfileobj(f, g)
  copied.append(name)


def _idle_run(run_dir: str):
  """A shared hold on `run_dir`'s run lock (`run_records.exclusive`), to
  close when the run is copied (None: no lock file): a run training there,
  whose files change as it runs (a release line half written), is refused,
  and none starts until the copy ends. Nothing is created in `run_dir`; a
  `.lock` that is not a regular file locks nothing (the run refuses it)."""
  try:
    fd = os.open(os.path.join(run_dir, run_records.LOCK),
                 os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
  except OSError:  # No run has trained there; or a link: ELOOP.
    return None
  lock = open(fd, 'rb', buffering=0)
  try:
    if stat.S_ISREG(os.fstat(fd).st_mode):
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = lock.read(32).decode(errors='replace').strip()
    lock.close()
    raise run_records.RunRecordError(
        f'{run_dir}: a process (pid {holder or "unknown"}) is training this '
        'run, and its files change as it runs; nothing was copied. Share it '
        'when the run stops.') from None
  return lock


def _added_noise(shared: str) -> bool:
  """Whether the run copied to `shared` added noise: its config.json sets
  --noise_multiplier or --target_epsilon. One that cannot be read counts as
  noised (its TensorBoard files are then checked, never waved through)."""
  try:
    with open(os.path.join(shared, 'config.json'), encoding='utf-8') as f:
      config = json.load(f)
    return (config.get('noise_multiplier') is not None or
            config.get('target_epsilon') is not None)
  except (OSError, ValueError, AttributeError):
    return True


def _on_the_round_clock(path: str) -> bool:
  """Whether `path` is a TensorBoard event file as a noised run's view
  writes it (`release_managers.round_clock`): named `events.out.tfevents.*`,
  holding events only, each with its step as its wall_time. TensorFlow's
  writer (and an older tff_clip's) stamps every event with the time it was
  written: their differences show the round times, which a noised run
  withholds (they grow with the cohort, outside epsilon)."""
  from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
  if not os.path.basename(path).startswith('events.out.tfevents.'):
    return False
  records = list(run_records.tfrecords(path))
  if not records and os.path.getsize(path):
    return False  # Bytes that are no TFRecord: nothing read is no proof.
  for record in records:
    try:
      event = event_pb2.Event.FromString(record)
    except Exception:  # pylint: disable=broad-except
      return False  # A record that is no event.
    if event.wall_time != float(event.step):
      return False
  return True


def _leave_out_clocked_events(shared: str, copied: list[str],
                              skipped: list[str]) -> None:
  """Removes from the copy `shared` of a noised run each file under
  `tensorboard/` that is not on the round clock (`_on_the_round_clock`),
  naming it in `skipped`."""
  for name in [n for n in copied if n.startswith('tensorboard/')]:
    if not _on_the_round_clock(os.path.join(shared, name)):
      os.remove(os.path.join(shared, name))
      copied.remove(name)
      skipped.append(f'{name} (not events stamped with their round: a '
                     "noised run's TensorBoard holds no clock)")


def share(run_dir: str, destination: str) -> tuple[list[str], list[str]]:
  """Copies a run's released outputs, and nothing secret, to `destination`.

  `destination` must not exist (nothing is overwritten); it appears whole or
  not at all (the copy is made beside it and renamed). The last released
  round's model weights, alone, go to `model.npz`. Returns (the names
  written, what was left out and why). `checkpoints/` (the DP noise key,
  and the row of a round not yet released) and anything `SHAREABLE` does
  not name stay behind; of what it names only regular files are copied,
  never through a symbolic link (a link in `tensorboard/` to a checkpoint
  copies nothing of it): links, hidden files and anything else are left
  out and named. A run directory another user could change is refused
  (`run_records.check_location`), as training refuses it.
  """
  # As training does (StrictModes): whoever else may write the run
  # directory may rename its checkpoints/ to a name copied here.
  run_records.check_location(run_dir, '--run_dir')
  config = os.path.join(run_dir, 'config.json')
  if not os.path.isfile(config) or os.path.islink(config):
    raise run_records.RunRecordError(f'{run_dir!r} holds no tff_clip run (no '
                         'config.json); nothing was copied.')
  if os.path.lexists(destination):
    raise run_records.RunRecordError(f'{destination!r} exists; nothing was copied or '
                         'overwritten. Name a new directory.')
  # Where the kernel puts it: a '..' after a link is its target's parent.
  parent = os.path.dirname(ownership.absolute_path(destination))
  inside = os.path.realpath(parent)
  if os.path.commonpath([inside, os.path.realpath(run_dir)]) == (
      os.path.realpath(run_dir)):
    raise run_records.RunRecordError(
        f'{destination!r} is inside the run directory {run_dir!r}, whose '
        'records it would change; nothing was copied. Name a directory '
        'outside it.')
  run_lock = _idle_run(run_dir)
  tmp = None
  try:
    # A name of its own (never another's directory, which it would delete).
    tmp = tempfile.mkdtemp(prefix=f'.{os.path.basename(destination)}.',
                           suffix='.tmp', dir=parent)
    os.chmod(tmp, 0o755)  # As os.makedirs makes it; mkdtemp's is 0o700.
    copied, skipped, names = [], [], []
    for name in SHAREABLE:
      source = os.path.join(run_dir, name)
      if not os.path.lexists(source):
        continue
      before = len(copied)
      _copy_regular(source, os.path.join(tmp, name), name, copied, skipped)
      if len(copied) > before or os.path.isdir(os.path.join(tmp, name)):
        names.append(name)
    if _added_noise(tmp):
      _leave_out_clocked_events(tmp, copied, skipped)
    if _write_released_model(run_dir, os.path.join(tmp, MODEL)):
      names.append(MODEL)
    os.rename(tmp, destination)
  except BaseException as e:  # A refusal too: no partial copy is left.
    if tmp is not None:
      shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(e, OSError):
      raise run_records.write_error(destination, e) from None
    raise
  finally:
    if run_lock is not None:
      run_lock.close()
  run_records.fsync_dir(parent)
  return names, skipped
