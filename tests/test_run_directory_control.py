"""No one but its owner chooses or changes a run directory: through a POSIX
ACL or through a symbolic link.

docs/privacy.md: a run directory that another user owns or may write (or
one under such a directory, a sticky one such as /tmp excepted) is refused
before anything is read or written. The mode bits do not tell all: an ACL
entry lets a named user write while the mode shows only the ACL's mask, and
another user's symbolic link on the way (even in a sticky /tmp, where its
owner may replace it at any time) decides which directory is the run's.

Another uid (65534, nobody) plays the other user: these need root, as the
ownership tests of tests/test_run_records.py do. Oracle: what that user can
really do (setpriv), checked first.
"""

import json
import os
import pathlib
import shutil
import struct
import subprocess
import tempfile

import pytest

from tff_clip.program import ownership
from tff_clip.program import run_directory
from tff_clip.program import run_records
from tff_clip.program import training

NOBODY = 65534
_UNDEFINED = 0xFFFFFFFF
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 1, 2, 4, 8, 0x10, 0x20


def _as_nobody(*argv):
  return subprocess.run(['setpriv', f'--reuid={NOBODY}', f'--regid={NOBODY}',
                         '--clear-groups', *argv], capture_output=True,
                        text=True, check=False)


@pytest.fixture
def shared():
  """A directory other users can traverse (pytest's tmp_path is 0700)."""
  if os.geteuid() != 0 or not shutil.which('setpriv'):
    pytest.skip('needs root and setpriv (another uid plays the other user)')
  path = pathlib.Path(tempfile.mkdtemp())
  os.chmod(path, 0o755)
  yield path
  shutil.rmtree(path)


def _set_acl(path, entries, name='system.posix_acl_access'):
  value = struct.pack('<I', 2) + b''.join(
      struct.pack('<HHI', tag, perm, ident) for tag, perm, ident in entries)
  try:
    os.setxattr(path, name, value)
  except OSError as e:
    pytest.skip(f'no POSIX ACLs here ({e.strerror})')


def _acl_for(tag, ident, perm=7):
  return sorted([(USER_OBJ, 7, _UNDEFINED), (tag, perm, ident),
                 (GROUP_OBJ, 5, _UNDEFINED), (MASK, 7, _UNDEFINED),
                 (OTHER, 5, _UNDEFINED)])  # In tag order, as acl(5) wants.


def _config(root, **fields):
  return training.TrainConfig(root_output_dir=str(root), experiment_name='x',
                              rounds=1, progress=False, **fields)


@pytest.mark.parametrize('where', ['root', 'run'])
def test_a_directory_an_acl_lets_another_user_write_is_refused(shared, where):
  root = shared / 'runs'
  (root / 'x').mkdir(parents=True, mode=0o755)
  target = root if where == 'root' else root / 'x'
  _set_acl(target, _acl_for(USER, NOBODY))
  # What the mode shows (0775: the mask), and what nobody really can do.
  assert oct(os.stat(target).st_mode & 0o777) == '0o775'
  assert _as_nobody('mkdir', str(target / 'planted')).returncode == 0
  os.rmdir(target / 'planted')
  with pytest.raises(training.ConfigError,
                     match=r'writable by others \(its ACL lets user'):
    run_directory.check_location(_config(root))


def test_a_default_acl_that_would_let_another_group_write_new_files_is_refused(
    shared):
  root = shared / 'runs'
  root.mkdir(mode=0o755)
  _set_acl(root, _acl_for(GROUP, NOBODY), 'system.posix_acl_default')
  with pytest.raises(training.ConfigError, match='posix_acl_default'):
    run_directory.check_location(_config(root))


def test_an_acl_that_lets_no_one_else_write_is_allowed(shared):
  root = shared / 'runs'
  root.mkdir(mode=0o755)
  _set_acl(root, _acl_for(USER, NOBODY, perm=5))  # Read and enter only.
  run_directory.check_location(_config(root))
  _set_acl(root, [(USER_OBJ, 7, _UNDEFINED), (USER, 7, NOBODY),
                  (GROUP_OBJ, 5, _UNDEFINED), (MASK, 5, _UNDEFINED),
                  (OTHER, 5, _UNDEFINED)])  # Write masked off.
  run_directory.check_location(_config(root))


def test_a_run_file_an_acl_lets_another_user_write_is_never_opened(shared):
  path = shared / 'config.json'
  path.write_text('{}')
  os.chmod(path, 0o644)
  _set_acl(path, _acl_for(USER, NOBODY, perm=6))
  with pytest.raises(ownership.UnsafeFileError, match='its ACL lets user'):
    ownership.read_bytes(str(path))


@pytest.mark.parametrize('link', ['root', 'run'])
def test_a_path_through_another_users_link_in_a_sticky_directory_is_refused(
    shared, link):
  # /tmp-like: everyone may add an entry; only its owner may replace it.
  sticky = shared / 'tmp'
  sticky.mkdir()
  os.chmod(sticky, 0o1777)
  ours = shared / 'ours'
  ours.mkdir(mode=0o755)
  name = sticky / ('runs' if link == 'root' else 'x')
  assert _as_nobody('ln', '-s', str(ours), str(name)).returncode == 0
  assert os.lstat(name).st_uid == NOBODY
  with pytest.raises(run_records.LocationError,
                     match=r"'.*/tmp/(runs|x)' is a symbolic link of .*65534"):
    run_records.check_location(str(sticky / 'runs' / 'x') if link == 'root'
                               else str(name))
  # What its owner can do at any time: point it at another directory.
  other = shared / 'ours_too'
  other.mkdir(mode=0o755)
  assert _as_nobody('sh', '-c', f'rm {name} && ln -s {other} {name}'
                    ).returncode == 0
  assert os.path.realpath(name) == str(other)


def test_a_path_through_ones_own_links_is_allowed(shared):
  ours = shared / 'ours'
  ours.mkdir(mode=0o755)
  (shared / 'runs').symlink_to(ours)
  (ours / 'nested').symlink_to('../ours')  # Relative, resolved in turn.
  run_records.check_location(str(shared / 'runs' / 'nested' / 'x'))
  os.chown(ours, NOBODY, NOBODY)  # Where the links lead still counts.
  with pytest.raises(run_records.LocationError, match='belongs to'):
    run_records.check_location(str(shared / 'runs' / 'nested' / 'x'))


@pytest.mark.slow  # Two DP trainings, ~30 s.
def test_another_users_link_cannot_make_a_dp_run_train_from_round_1_again(
    shared):
  from scripts import program  # pylint: disable=g-import-not-at-top
  sticky = shared / 'tmp'
  sticky.mkdir()
  os.chmod(sticky, 0o1777)
  first, second = shared / 'a', shared / 'b'
  first.mkdir(mode=0o755)
  second.mkdir(mode=0o755)
  assert _as_nobody('ln', '-s', str(first), str(sticky / 'runs')
                    ).returncode == 0
  config = training.TrainConfig(rounds=2, clients_per_round=6, eval_every=2,
                                seed=3, progress=False, experiment_name='x',
                                root_output_dir=str(sticky / 'runs'))
  with pytest.raises(training.ConfigError, match='symbolic link of'):
    program.run(config)
  assert not any(first.iterdir()) and not any(second.iterdir())
  os.lchown(sticky / 'runs', 0, 0)  # Made ours: it runs.
  program.run(config)
  released = (first / 'x' / 'releases.jsonl').read_text().splitlines()
  assert [json.loads(line)['round'] for line in released] == [1, 2]


@pytest.mark.parametrize('name', ['.lock', 'releases.jsonl', 'metrics.csv'])
def test_a_run_file_hard_linked_to_another_file_is_never_written_through(
    tmp_path, name):
  """A hard link is a link too: a `.lock` (or a log a run appends to) that
  is another name of a file elsewhere (planted while the directory was
  open to others, where the kernel lets anyone link a file they can name,
  fs.protected_hardlinks=0) passes `O_NOFOLLOW` and `fstat`'s owner and
  mode, and truncating or appending to it changes that file. Refused in one
  line naming it; the other file keeps every byte. Oracle: the file's bytes
  and `os.stat`'s link count (POSIX: two names, one inode)."""
  run_dir = tmp_path / 'run'
  run_dir.mkdir(mode=0o755)
  precious = tmp_path / 'precious'
  precious.write_bytes(b"the victim's file\n")
  os.chmod(precious, 0o644)
  os.link(precious, run_dir / name)
  assert os.stat(precious).st_nlink == 2
  with pytest.raises(ownership.UnsafeFileError, match='hard link') as error:
    if name == '.lock':
      with run_records.exclusive(str(run_dir)):
        pass
    else:
      with ownership.open_file(str(run_dir / name), 'ab') as f:
        f.write(b'a released round\n')
  assert '\n' not in str(error.value) and name in str(error.value)
  assert precious.read_bytes() == b"the victim's file\n"
  # Read-only opens stay allowed: reading changes no file.
  assert ownership.read_bytes(str(run_dir / name)) == b"the victim's file\n"


def _dp_run_to_share(run_dir):
  """A DP run directory as share_run finds it: its config, a released
  ledger, and a checkpoint (the noise key: random bytes, 0600 in 0700)."""
  run_dir.mkdir(mode=0o755)
  (run_dir / 'config.json').write_text(json.dumps({'noise_multiplier': 1.0}))
  (run_dir / 'ledger.json').write_text('{"epsilon_per_round": [[1, 0.5]]}')
  (run_dir / 'checkpoints').mkdir(mode=0o700)
  secret = run_dir / 'checkpoints' / 'round_000001.npz'
  secret.write_bytes(os.urandom(64))
  os.chmod(secret, 0o600)
  for path in run_dir.rglob('*'):
    if path.is_file() and path != secret:
      os.chmod(path, 0o644)
  return secret.read_bytes()


def test_share_run_refuses_a_run_directory_another_user_may_write(shared):
  """Another user who may write the run directory cannot read checkpoints/
  (0700), but may rename it (a rename within one directory needs no write
  on the directory moved): to `ledger.json`, a name share_run copies. Had
  share_run copied that run, the noise key would be in the shared copy.
  A run directory another user may write is refused, as training refuses
  it (StrictModes), in one line; nothing is created. Oracle: what that
  user can really do (setpriv), checked first."""
  from tff_clip.program import checkpoints  # pylint: disable=g-import-not-at-top
  run_dir = shared / 'run'
  secret = _dp_run_to_share(run_dir)
  os.chmod(run_dir, 0o777)
  key = run_dir / 'checkpoints' / 'round_000001.npz'
  assert _as_nobody('cat', str(key)).returncode != 0  # Not theirs to read.
  renamed = _as_nobody('sh', '-c', f'rm {run_dir}/ledger.json && '
                       f'mv {run_dir}/checkpoints {run_dir}/ledger.json')
  assert renamed.returncode == 0, renamed.stderr
  destination = shared / 'out'
  with pytest.raises(run_records.LocationError) as error:
    checkpoints.share(str(run_dir), str(destination))
  message = str(error.value)
  assert '\n' not in message and 'writable by others (mode 0777' in message
  assert repr(str(run_dir)) in message
  assert sorted(p.name for p in shared.iterdir()) == ['run']
  assert (run_dir / 'ledger.json' / key.name).read_bytes() == secret


def test_a_dot_dot_after_a_link_is_checked_where_the_kernel_takes_it(
    tmp_path):
  """`runs/link/../x`: the kernel follows `link` first, then goes to the
  parent of where it leads, not to `runs/x` as `os.path.abspath` spells it.
  The directory checked must be the one a run's files are opened in: here
  one others may write (0777, where another user could have made the run
  directory and its files theirs to swap), refused in one line; nothing is
  made where the spelling points. Oracle: `os.stat` of the path as given
  (the kernel's resolution) against the open directory's."""
  home, open_to_all = tmp_path / 'home', tmp_path / 'open'
  home.mkdir(mode=0o755)
  (open_to_all / 'sub').mkdir(parents=True)
  os.chmod(open_to_all, 0o777)
  (home / 'link').symlink_to(open_to_all / 'sub')
  given = f'{home}/link/../runs'
  (open_to_all / 'runs').mkdir(mode=0o755)
  assert os.stat(given).st_ino == os.stat(open_to_all / 'runs').st_ino
  for check in (run_records.check_location, run_records.ensure_dir):
    with pytest.raises(run_records.LocationError) as error:
      check(f'{given}/x')
    assert '\n' not in str(error.value)
    assert repr(str(open_to_all)) in str(error.value)
    assert 'mode 0777' in str(error.value)
  assert not (home / 'runs').exists()
