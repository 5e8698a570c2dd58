"""The traced graphs of a run's processes, cached on disk across runs.

Tracing a learning process with TFF and compiling it to its
`MapReduceForm` takes seconds; the result, a handful of serialized
computations (`tff_clip.runtime.simulation.process_graphs`), is a pure
function of what built it. An entry is stored under a key that hashes
everything that shapes the graphs: the caller's description of what it built
(the configuration's fields that shape the graphs, the noise multiplier; not
the seed or other fields that only choose data, so a sweep's seeds share one
entry), the source of every tff_clip module, and the versions of TensorFlow,
TFF and Python.

An entry is trusted only when its header names the key asked for and its
payload matches the SHA-256 checksum stored with it; anything else (a
damaged, truncated, stale or unreadable file) is ignored and rebuilt. Files
are written atomically (a temporary file renamed over the entry), readable by
their owner only, and read only where no one else could have written them:
the folder and the file owned by the user and writable by no one else, the
file not reached through a link (`read_private`).

Where: `$TFF_CLIP_GRAPH_CACHE` (a directory, or `off` to disable), else
`$XDG_CACHE_HOME/tff_clip/graphs`, else `~/.cache/tff_clip/graphs`.

No secret goes in: an entry is refused (`store` returns False) when a graph
holds a random op with a seed fixed at tracing, and the callers never cache a
graph built with a fixed noise seed (`--noise_seed`), which is a constant of
the graph.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import pathlib
import platform
import stat
import struct
import tempfile
from typing import Mapping, Optional

from absl import logging

__all__ = ['ENV', 'directory', 'entry_key', 'entry_lock', 'library_hash',
           'load', 'store', 'has_baked_seed', 'read_private', 'write_private']

ENV = 'TFF_CLIP_GRAPH_CACHE'
_OFF = ('off', '0', 'false', 'no', '')
_MAGIC = b'tff_clip graph cache 1\n'
_LIBRARY = pathlib.Path(__file__).resolve().parent.parent


def directory() -> Optional[pathlib.Path]:
  """Where entries live, or None where the cache is switched off."""
  value = os.environ.get(ENV)
  if value is not None:
    return None if value.strip().lower() in _OFF else pathlib.Path(value)
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(
      os.path.expanduser('~'), '.cache')
  return pathlib.Path(base) / 'tff_clip' / 'graphs'


@functools.lru_cache(maxsize=1)
def library_hash() -> str:
  """SHA-256 over the path and bytes of every tff_clip source file."""
  return sources_hash([_LIBRARY])


def sources_hash(packages) -> str:
  """SHA-256 over the path and bytes of every source file of `packages`
  (directories, or a module's file)."""
  digest = hashlib.sha256()
  for package in packages:
    package = pathlib.Path(package)
    files = [package] if package.is_file() else sorted(package.rglob('*.py'))
    for path in files:
      name = (package.name if path == package else
              f'{package.name}/{path.relative_to(package)}')
      digest.update(name.encode() + b'\0')
      digest.update(path.read_bytes() + b'\0')
  return digest.hexdigest()


def entry_key(description: str) -> str:
  """The key of the graphs `description` built, with this library and TF."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  return hashlib.sha256(json.dumps({
      'description': description,
      'library': library_hash(),
      'tensorflow': tf.__version__,
      'tensorflow_federated': tff.__version__,
      'python': platform.python_version(),
  }, sort_keys=True).encode()).hexdigest()


def _path(key: str) -> Optional[pathlib.Path]:
  root = directory()
  return None if root is None else root / f'{key}.graphs'


def _pack(entries: Mapping[str, bytes]) -> bytes:
  parts = []
  for name in sorted(entries):
    encoded = name.encode()
    parts += [struct.pack('>I', len(encoded)), encoded,
              struct.pack('>Q', len(entries[name])), entries[name]]
  return b''.join(parts)


def _unpack(payload: bytes) -> dict[str, bytes]:
  entries, offset = {}, 0
  while offset < len(payload):
    (size,) = struct.unpack_from('>I', payload, offset)
    name = payload[offset + 4:offset + 4 + size].decode()
    offset += 4 + size
    (size,) = struct.unpack_from('>Q', payload, offset)
    entries[name] = payload[offset + 8:offset + 8 + size]
    offset += 8 + size
    if offset > len(payload):
      raise ValueError('truncated payload')
  return entries


@contextlib.contextmanager
def entry_lock(key: str):
  """Held while this process traces the entry `key`: another process that
  needs the same entry (a sweep's other job, starting the same method)
  waits, then loads it, instead of tracing it too. An advisory `flock` on
  an owner-only file beside the entry, released when the block ends or the
  process dies; no lock where the cache is off or the file cannot be made,
  nor in a folder others may write (a lock file made and held there by
  another user would make this run wait forever; no entry there is ever
  loaded either, `read_private`)."""
  path = _path(key)
  descriptor = None
  if path is not None:
    try:
      path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
      if not _private(os.stat(path.parent)):
        raise PermissionError('the folder is not private to this user')
      descriptor = os.open(path.with_suffix('.lock'),
                           os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
      fcntl.flock(descriptor, fcntl.LOCK_EX)
    except OSError as e:
      logging.warning('Graph cache: cannot lock %s (%s).', path, e)
      if descriptor is not None:
        os.close(descriptor)
      descriptor = None
  try:
    yield
  finally:
    if descriptor is not None:
      os.close(descriptor)  # Releases the lock.


def load(key: str) -> Optional[dict[str, bytes]]:
  """The entry stored under `key`, or None: missing, damaged, stale or off."""
  path = _path(key)
  if path is None:
    return None
  try:
    data = read_private(path)
  except FileNotFoundError:
    return None
  except OSError as e:
    logging.warning('Graph cache: cannot read %s (%s); rebuilding.', path, e)
    return None
  if data is None:
    logging.warning('Graph cache: %s or its folder is not private to this '
                    'user (another owner, writable by others, or a link); '
                    'not used.', path)
    return None
  header = len(_MAGIC) + 2 * 65
  stored_key = data[len(_MAGIC):len(_MAGIC) + 64]
  checksum = data[len(_MAGIC) + 65:header - 1]
  payload = data[header:]
  if (not data.startswith(_MAGIC) or stored_key != key.encode() or
      checksum != hashlib.sha256(payload).hexdigest().encode()):
    logging.warning('Graph cache: %s is damaged or stale; rebuilding.', path)
    return None
  try:
    return _unpack(payload)
  except (ValueError, struct.error, UnicodeDecodeError):
    logging.warning('Graph cache: %s is malformed; rebuilding.', path)
    return None


def _private(st: os.stat_result) -> bool:
  return st.st_uid in (os.getuid(), 0) and not st.st_mode & 0o022


def read_private(path: pathlib.Path) -> Optional[bytes]:
  """The file's bytes where only this user (or root) could have written it:
  a regular file, not reached through a link, it and its folder owned by
  the user and writable by no one else; None otherwise. An entry's graphs
  run with the DP state, so a graph planted in a shared folder (say
  `TFF_CLIP_GRAPH_CACHE=/tmp/graphs`, made first by another user) could
  drop the noise: it is never loaded."""
  if not _private(os.stat(path.parent)):
    return None
  descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
  with os.fdopen(descriptor, 'rb') as f:
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode) or not _private(st):
      return None
    return f.read()


def store(key: str, entries: Mapping[str, bytes]) -> bool:
  """Writes the entry atomically (owner-only); False where it was not."""
  path = _path(key)
  if path is None:
    return False
  payload = _pack(entries)
  data = b''.join([_MAGIC, key.encode(), b'\n',
                   hashlib.sha256(payload).hexdigest().encode(), b'\n',
                   payload])
  return write_private(path, data, 'Graph cache')


def write_private(path: pathlib.Path, data: bytes, what: str) -> bool:
  """`data` at `path`, atomically (a temporary file renamed over it),
  owner-only (the folder 0700, the file 0600); False (and a warning naming
  `what`) where it could not be written."""
  try:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent,
                                             prefix='.writing-')
    try:
      with os.fdopen(descriptor, 'wb') as f:  # mkstemp: mode 0600.
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
      os.replace(temporary, path)
    except BaseException:
      os.unlink(temporary)
      raise
  except OSError as e:
    logging.warning('%s: cannot write %s (%s).', what, path, e)
    return False
  return True


def has_baked_seed(computations) -> bool:
  """Whether a TF computation (`pb.Computation`) holds a random op whose
  seed was fixed at tracing (e.g. under `tf.random.set_seed`): such a graph
  draws the same numbers in every run, and is never cached."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for computation in computations:
    graph_def = tf.compat.v1.GraphDef()
    computation.tensorflow.graph_def.Unpack(graph_def)
    if graph_def_has_baked_seed(graph_def):
      return True
  return False


def graph_def_has_baked_seed(graph_def) -> bool:
  """`has_baked_seed` of a `GraphDef` (its functions' nodes included)."""
  nodes = list(graph_def.node)
  for function in graph_def.library.function:
    nodes.extend(function.node_def)
  return any(any(name in node.attr and node.attr[name].i != 0
                 for name in ('seed', 'seed2')) for node in nodes)
