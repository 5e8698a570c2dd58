"""Only its owner controls a run directory: where a run may live, and how
its files are opened.

Whoever can write a run directory (or a directory above it) can replace its
records and checkpoints, and with them the DP noise key. As ssh's
StrictModes treats `~/.ssh`, `check_location` refuses a run directory that
another user owns or may write in (others, or a group that is not the
user's alone, by mode or by a POSIX ACL), or one under such a directory (a
sticky directory such as /tmp above it excepted), or a path through another
user's symbolic link (which its owner may repoint), and `open_file` opens a run file
only as a regular file owned by the user (or root) that no one else may
write, never through a symbolic link (`O_NOFOLLOW`, then `fstat`).
`check_tree` does the same for a directory a third-party writer fills
(TensorBoard's). Directories are made writable by their owner alone
(`DIR_MODE`, whatever the umask), files `FILE_MODE`.

The run directory's records themselves are `tff_clip.program.run_records`,
which re-exports these names. None of this imports TensorFlow.
"""

from __future__ import annotations

import errno
import functools
import grp
import os
import pwd
import stat
import struct
from typing import Optional

__all__ = [
    'DIR_MODE', 'FILE_MODE', 'LocationError', 'RunRecordError',
    'UnsafeFileError', 'absolute_path', 'check_location', 'check_tree',
    'ensure_dir', 'open_file', 'read_bytes', 'tfrecords',
]


class RunRecordError(Exception):
  """A run-directory file cannot be read, trusted or written (one line)."""


# Modes of what a run creates: writable by its owner alone (the umask can
# only narrow them).
DIR_MODE = 0o755
FILE_MODE = 0o644


class LocationError(RunRecordError):
  """A run directory that another user could change (one line)."""


class UnsafeFileError(RunRecordError):
  """A run file that is a link, not a regular file, or another user's to
  change: refused, never read or written (one line)."""


def _owner(uid: int) -> str:
  try:
    return f'{pwd.getpwuid(uid).pw_name} (uid {uid})'
  except KeyError:
    return f'uid {uid}'


def _group(gid: int) -> str:
  try:
    return f'{grp.getgrgid(gid).gr_name} (gid {gid})'
  except KeyError:
    return f'gid {gid}'


def _trusted_owner(uid: int) -> bool:
  return uid in (os.geteuid(), 0)


@functools.lru_cache(maxsize=None)
def _private_group(gid: int) -> bool:
  """Whether group `gid` is this user's alone (a user private group, as a
  umask of 002 assumes): no other user is a member of it or has it as their
  primary group."""
  me = os.geteuid()
  try:
    members = set(grp.getgrgid(gid).gr_mem)
    names = {pwd.getpwuid(me).pw_name}
    others = [u for u in pwd.getpwall() if u.pw_gid == gid and u.pw_uid != me]
  except KeyError:
    return False
  return members <= names and not others


# POSIX ACLs (acl(5)) as Linux stores them in extended attributes: a
# version, then (tag, permissions, id) entries. A named user's or group's
# write permission counts as far as the mask lets it.
_ACLS = ('system.posix_acl_access', 'system.posix_acl_default')
_ACL_USER, _ACL_GROUP, _ACL_MASK, _ACL_WRITE = 0x02, 0x08, 0x10, 0x02


def _acl_writer(target, directory: bool) -> Optional[str]:
  """Who other than this user (or root, or this user's own group) an ACL
  of `target` lets write, or None: a path (links not followed) or an open
  file descriptor; a directory's default ACL (what its new entries get)
  counts too. The mode bits show only the ACL's mask: `chmod` alone cannot
  tell."""
  for name in _ACLS[:2 if directory else 1]:
    try:
      data = (os.getxattr(target, name) if isinstance(target, int) else
              os.getxattr(target, name, follow_symlinks=False))
    except OSError:  # No ACL (ENODATA), or none possible here (ENOTSUP).
      continue
    entries = [struct.unpack_from('<HHI', data, at)
               for at in range(4, len(data) - 7, 8)]
    mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), 7)
    for tag, perm, ident in entries:
      if not perm & mask & _ACL_WRITE:
        continue
      if tag == _ACL_USER and not _trusted_owner(ident):
        return f'user {_owner(ident)} ({name})'
      if tag == _ACL_GROUP and not _private_group(ident):
        return f'group {_group(ident)} ({name})'
  return None


def _others_control(st: os.stat_result, sticky_ok: bool = False,
                    acl_of=None) -> Optional[str]:
  """Why another user could change what has this `stat`, or None.

  Owned by someone other than this user or root; or writable by others, or
  by a group that is not this user's alone, by its mode or by an ACL of
  `acl_of` (its path or file descriptor; `_acl_writer`); a sticky directory
  excepted where `sticky_ok`: there no one renames or removes another
  user's entries.
  """
  if not _trusted_owner(st.st_uid):
    you = 'root' if os.geteuid() == 0 else f'{_owner(os.geteuid())} or root'
    return f'belongs to {_owner(st.st_uid)}, not to you ({you})'
  if sticky_ok and st.st_mode & stat.S_ISVTX:
    return None
  writable = st.st_mode & stat.S_IWOTH or (
      st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid))
  if writable:
    return (f'is writable by others (mode {stat.S_IMODE(st.st_mode):04o}, '
            f'owner {_owner(st.st_uid)}, group {_group(st.st_gid)})')
  acl = None if acl_of is None else _acl_writer(acl_of,
                                                stat.S_ISDIR(st.st_mode))
  if acl is not None:
    return f'is writable by others (its ACL lets {acl} write)'
  return None


def _links(path: str) -> list[tuple[str, os.stat_result]]:
  """Each symbolic link that resolving the absolute `path` goes through
  (as the kernel resolves it, component by component), with its `lstat`."""
  found, resolved, pending = [], '/', path.split('/')
  while pending and len(found) <= 40:  # The kernel's limit: ELOOP.
    part = pending.pop(0)
    if part in ('', '.'):
      continue
    if part == '..':
      resolved = os.path.dirname(resolved)
      continue
    candidate = os.path.join(resolved, part)
    try:
      st = os.lstat(candidate)
    except OSError:  # Missing: made later, where `ensure_dir` checks it.
      resolved = candidate
      continue
    if not stat.S_ISLNK(st.st_mode):
      resolved = candidate
      continue
    found.append((candidate, st))
    target = os.readlink(candidate)
    resolved = '/' if target.startswith('/') else resolved
    pending = target.split('/') + pending
  return found


def absolute_path(path: str) -> str:
  """`path` made absolute, each '..' taken as the kernel takes it: the
  parent of where the path so far leads, its links followed (`abspath`
  drops the component before it, a link's parent instead)."""
  resolved = '/' if path.startswith('/') else os.getcwd()
  for part in path.split('/'):
    if part == '..':
      resolved = os.path.dirname(os.path.realpath(resolved))
    elif part not in ('', '.'):
      resolved = os.path.join(resolved, part)
  return resolved


def _chain(path: str) -> list[str]:
  """`path` and every directory above it, deepest first."""
  chain = [path]
  while os.path.dirname(chain[-1]) != chain[-1]:
    chain.append(os.path.dirname(chain[-1]))
  return chain


def check_location(directory: str, argument: str = '--root_output_dir'
                   ) -> None:
  """Refuses a run directory that another user could change.

  Like ssh's StrictModes: `directory` (where it exists) and every existing
  directory above it, as written and as its symbolic links resolve, must be
  owned by this user or root and writable by no one else (by mode or ACL),
  and every symbolic link on the way owned by this user or root; above the run
  directory a sticky directory (/tmp) may be writable by all, since no one
  may rename or remove the entries of another user there. Reads and writes
  nothing; `LocationError` (one line naming the directory and its owner or
  mode) where another user could change it.
  """
  path = absolute_path(directory)
  for link, st in _links(os.path.join(os.getcwd(), directory)):
    # Its owner may point it elsewhere at any time (even in a sticky /tmp):
    # which directory is the run's would be theirs to choose.
    if not _trusted_owner(st.st_uid):
      raise LocationError(
          f'{argument}: {link!r} is a symbolic link of {_owner(st.st_uid)}, '
          'who could point it at another directory at any time, so nothing '
          'was read or written. Give a path through directories and links '
          'of your own (or root\'s).')
  existing = path
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  real = os.path.realpath(existing)
  strict = {path, os.path.realpath(path)}
  for candidate in dict.fromkeys(_chain(path) + _chain(real)):
    try:
      st = os.stat(candidate)
    except OSError:
      continue  # Missing, or not a directory: refused where it is created.
    if not stat.S_ISDIR(st.st_mode):
      continue
    reason = _others_control(st, sticky_ok=candidate not in strict,
                             acl_of=os.path.realpath(candidate))
    if reason is not None:
      what = ('the run directory' if candidate in strict else
              'a directory above the run directory')
      raise LocationError(
          f'{argument}: {candidate!r} ({what}) {reason}: another user could '
          "replace the run's records or noise key, so nothing was read or "
          'written. A run directory and every directory above it must be '
          'writable by their owner only, you or root (chmod go-w; a sticky '
          'directory such as /tmp above it is allowed).')


def ensure_dir(path: str, argument: str = '--root_output_dir') -> None:
  """Creates `path` and the directories above it that are missing, each
  writable by its owner only (`DIR_MODE`), then `check_location`."""
  missing = []
  at = absolute_path(path)
  while not os.path.lexists(at):
    missing.append(at)
    at = os.path.dirname(at)
  for directory in reversed(missing):
    try:
      os.mkdir(directory, DIR_MODE)
    except FileExistsError:
      pass  # Made meanwhile: `check_location` says whose it is.
    except OSError as e:
      raise RunRecordError(f'cannot create {directory}: {e.strerror}. '
                           'Nothing already written was changed.') from None
  check_location(path, argument)


def _refused(path: str, reason: str) -> RunRecordError:
  return UnsafeFileError(
      f'{path} {reason}: a run file is opened only as a regular file of its '
      "owner's that no one else may write; nothing was changed.")


def _symlink(path: str) -> RunRecordError:
  return UnsafeFileError(
      f'{path} is a symbolic link: a run file is never opened through one; '
      'nothing was changed.')


_OPEN_FLAGS = {
    'r': os.O_RDONLY,
    'a': os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    'r+': os.O_RDWR | os.O_CREAT,
}


def open_file(path: str, mode: str = 'rb', *, create_mode: int = FILE_MODE,
              **kwargs):
  """`open(path, mode, **kwargs)` of a run file, never through a link.

  `mode` is 'r', 'a' or 'r+' (the last two create the file, `create_mode`),
  with 'b' for bytes. Opened with `O_NOFOLLOW` (a symbolic link, even one
  that points nowhere, is refused and nothing is created through it) and
  `O_NONBLOCK` (a FIFO does not hang the open), then checked with `fstat`:
  a regular file, owned by this user or root, writable by no one else,
  and, opened to write, of one name (no hard link). `RunRecordError` (one
  line naming the file) otherwise; `OSError` as `os.open` raises it (a
  missing file).
  """
  flags = _OPEN_FLAGS[mode.replace('b', '')]
  try:
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 create_mode)
  except OSError as e:
    if e.errno == errno.ELOOP:
      raise _symlink(path) from None
    raise
  try:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
      raise _refused(path, 'is not a regular file')
    reason = _others_control(st, acl_of=fd)
    if reason is None and flags != os.O_RDONLY and st.st_nlink != 1:
      # A hard link passes O_NOFOLLOW and the owner's checks, yet a write
      # (the lock's truncation, an append) changes the file's other name.
      reason = f'is a hard link ({st.st_nlink} names of one file)'
    if reason is not None:
      raise _refused(path, reason)
    os.set_blocking(fd, True)
    return open(fd, mode, **kwargs)
  except BaseException:
    os.close(fd)
    raise


def read_bytes(path: str) -> bytes:
  """The bytes of the run file `path` (`open_file`)."""
  with open_file(path, 'rb') as f:
    return f.read()


def _check_entry(path: str, directory: bool) -> None:
  try:
    st = os.lstat(path)
  except OSError as e:
    raise _refused(path, f'cannot be examined ({e.strerror})') from None
  if stat.S_ISLNK(st.st_mode):
    raise _symlink(path)
  if stat.S_ISDIR(st.st_mode):
    reason = _others_control(st, acl_of=path)
  elif stat.S_ISREG(st.st_mode) and not directory:
    # Its modes are the third-party writer's (the umask's): its owner counts.
    reason = None if _trusted_owner(st.st_uid) else _others_control(st)
  else:
    reason = 'is not a directory' if directory else (
        'is neither a regular file nor a directory')
  if reason is not None:
    raise _refused(path, reason)


def check_tree(directory: str) -> None:
  """Refuses a directory of run files that holds a link or a foreign entry.

  For what a third-party writer fills (`tensorboard/`): `directory` and
  every directory under it must be a real directory (never a symbolic
  link) of this user or root that no one else may write; every file a
  regular one of this user or root. Nothing is followed or changed; a
  missing `directory` passes.
  """
  if not os.path.lexists(directory):
    return
  _check_entry(directory, directory=True)
  for root, dirs, files in os.walk(directory):  # Links are not followed.
    for name in dirs + files:
      _check_entry(os.path.join(root, name), directory=False)


def tfrecords(path: str):
  """The records of a TFRecord file (TensorBoard's events), torn tail
  skipped; read with `open_file`.

  The framing: uint64 length, uint32 CRC of it, the data, uint32 CRC.
  """
  data = read_bytes(path)
  offset = 0
  while offset + 12 <= len(data):
    (length,) = struct.unpack_from('<Q', data, offset)
    start = offset + 12
    if start + length + 4 > len(data):
      return
    yield data[start:start + length]
    offset = start + length + 4
