"""Specification: a run directory is a checked record (`tff_clip.program.run_records`).

Damage, loss and tampering never make a DP run restart, release a round
twice or report an epsilon below what its released rounds spent; damaged
files are named in one line; every file is written atomically and durably.
"""

import contextlib
import csv
import dataclasses
import io
import errno
import hashlib
import json
import math
import os
import pathlib
import shutil

import dp_accounting
import numpy as np
import pytest

import as_a_user  # pylint: disable=g-bad-import-order

from scripts import program
from tff_clip.program import program_logic
from tff_clip.program import run_directory
from tff_clip.program import checkpoints
from tff_clip.program import run_records
from tff_clip.program import training

ROUNDS = 3
BASE = training.TrainConfig(rounds=ROUNDS, clients_per_round=6, eval_every=1,
                            seed=3, progress=False, experiment_name='run')


def _config(root, **changes):
  return dataclasses.replace(BASE, root_output_dir=str(root), **changes)


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _released_epsilon(run_dir, rounds=None, accountant='pld'):
  """Epsilon of the (first `rounds`) events in releases.jsonl, by
  dp_accounting directly: PLD, the accountant these Poisson runs report
  with (on a fine grid of its own), or RDP."""
  with open(run_dir / 'releases.jsonl') as f:
    lines = tuple(f.readlines())
  return _epsilons_after_each(lines, accountant)[len(lines[:rounds])]


# The tests damage copies of one finished run: its log is composed once (the
# fine PLD grid takes seconds a round), not once for every test and prefix;
# the tests that ask for PLD take `dp_accounting_builds_each_round_once`
# (the run's rounds are alike: their PLD is built once).
_EPSILONS = {}


def _epsilons_after_each(lines, accountant):
  """[epsilon of no event, of line 1's, of lines 1-2's, ...]: one accountant
  composes the log's events in order and is read after each, as a fresh
  one composing that prefix would be."""
  if (lines, accountant) not in _EPSILONS:
    from dp_accounting.pld import pld_privacy_accountant  # pylint: disable=g-import-not-at-top
    from tff_clip.privacy import privacy_ledger  # pylint: disable=g-import-not-at-top
    oracle = (pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=1e-4) if accountant == 'pld' else
              dp_accounting.rdp.RdpAccountant())
    epsilons = [oracle.get_epsilon(BASE.delta)]
    for line in lines:
      event = privacy_ledger.event_from_dict(json.loads(line)['event'])
      if accountant == 'pld':  # dp_accounting's PLD takes one Gaussian:
        # a round's value and count noise on one cohort are the Gaussian
        # of z = (sum z_i^-2)^-1/2 (closed form).
        inner = event.event.events
        event = dp_accounting.PoissonSampledDpEvent(
            event.sampling_probability, dp_accounting.GaussianDpEvent(
                sum(e.noise_multiplier**-2 for e in inner)**-0.5))
      oracle.compose(event)
      epsilons.append(oracle.get_epsilon(BASE.delta))
    _EPSILONS[lines, accountant] = epsilons
  return _EPSILONS[lines, accountant]


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
  root = tmp_path_factory.mktemp('finished')
  summary = program.run(_config(root))
  return root / 'run', summary


@pytest.fixture
def copy(finished, tmp_path):
  """A copy of the finished run, to damage."""
  run_dir, _ = finished
  shutil.copytree(run_dir, tmp_path / 'run')
  return tmp_path / 'run'


def _files(run_dir):
  return {p.relative_to(run_dir): p.read_bytes()
          for p in run_dir.rglob('*') if p.is_file()}


# ----------------------------------------------------------------------------
# Lost or damaged checkpoints: refuse, count what was released, change nothing.


def test_lost_checkpoints_refuse_and_count_the_released_rounds(
    copy, dp_accounting_builds_each_round_once):
  (copy / 'summary.json').unlink()  # Killed after round 3's release.
  shutil.rmtree(copy / 'checkpoints')
  before = _files(copy)
  with pytest.raises(run_records.RunRecordError) as error:
    program.run(_config(copy.parent))
  message = str(error.value)
  assert '\n' not in message
  assert f'rounds 1-{ROUNDS} were released' in message
  epsilon = float(message.split('spent epsilon = ')[1].split()[0])
  assert epsilon == pytest.approx(_released_epsilon(copy), rel=1e-3)
  assert _files(copy) == before  # Never restarted from round 1.


def test_damaged_latest_checkpoint_never_recomputes_a_released_round(copy):
  (copy / 'summary.json').unlink()
  latest = sorted((copy / 'checkpoints').iterdir())[-1]
  latest.write_bytes(latest.read_bytes()[:100])  # Torn.
  before = _files(copy)
  with pytest.raises(run_records.RunRecordError,
                     match=f'rounds {ROUNDS}-{ROUNDS} were released'):
    program.run(_config(copy.parent))
  assert _files(copy) == before


def test_checkpoint_of_another_log_is_refused(copy, finished):
  (copy / 'summary.json').unlink()
  log = (copy / 'releases.jsonl').read_text().splitlines()
  record = json.loads(log[0])
  record['row']['eval_accuracy'] = 0.99  # Edited, hash recomputed below.
  from tff_clip.program.run_records import _dumps, _line_hash  # pylint: disable=g-import-not-at-top
  previous = '0' * 64
  rewritten = []
  for line in [json.dumps(record)] + log[1:]:
    rec = json.loads(line)
    rec['hash'] = _line_hash(previous, _dumps(
        {k: rec[k] for k in ('round', 'row', 'event')}))
    previous = rec['hash']
    rewritten.append(json.dumps(rec, sort_keys=True))
  (copy / 'releases.jsonl').write_text('\n'.join(rewritten) + '\n')
  with pytest.raises(run_records.RunRecordError, match='does not belong'):
    program.run(_config(copy.parent))


def test_a_checkpoint_of_another_run_is_refused_before_any_release(tmp_path):
  """A checkpoint saved before its run's first release follows the empty
  log, as every run's does: only the run's name (config.json's random
  `run_id`, kept in each checkpoint) tells whose it is. Run B, killed before
  its first checkpoint, given run A's: B would take A's noise key, release
  A's round 1 as its own and train on under noise A already used."""
  a = _config(tmp_path / 'a', rounds=1)
  program.run(a)
  a_dir = tmp_path / 'a' / 'run'
  a_first = sorted((a_dir / 'checkpoints').iterdir())[0]
  recorded = json.loads((a_dir / 'config.json').read_text())
  assert _header(a_first)['run_id'] == recorded['run_id']
  b = _config(tmp_path / 'b', rounds=1, seed=4)
  run_directory.prepare_output_dir(b, recorded['resolved'])
  b_dir = tmp_path / 'b' / 'run'
  assert json.loads((b_dir / 'config.json').read_text())['run_id'] != (
      recorded['run_id'])
  (b_dir / 'checkpoints').mkdir(mode=0o700)
  shutil.copy2(a_first, b_dir / 'checkpoints' / a_first.name)
  before = _files(b_dir)
  with pytest.raises(run_records.RunRecordError,
                     match="checkpoint of round 1 is another run's"):
    program.run(b)
  after = _files(b_dir)
  after.pop(pathlib.Path('.lock'))  # The run's lock, as any start leaves.
  assert after == before  # Nothing released, nothing trained.


def test_edited_release_log_is_refused_naming_the_line(copy):
  lines = (copy / 'releases.jsonl').read_text().splitlines()
  lines[1] = lines[1].replace('"sampling_probability": 0.12',
                              '"sampling_probability": 0.01')
  (copy / 'releases.jsonl').write_text('\n'.join(lines) + '\n')
  (copy / 'summary.json').unlink()
  with pytest.raises(run_records.RunRecordError,
                     match=r'releases.jsonl, line 2: damaged or edited'):
    program.run(_config(copy.parent))


def test_torn_last_release_is_released_again_from_its_checkpoint(copy):
  (copy / 'summary.json').unlink()
  text = (copy / 'releases.jsonl').read_bytes()
  complete = text.splitlines(keepends=True)
  (copy / 'releases.jsonl').write_bytes(
      b''.join(complete[:-1]) + complete[-1][:40])  # Killed mid-append.
  program.run(_config(copy.parent))
  assert (copy / 'releases.jsonl').read_bytes() == text


@pytest.fixture(scope='module')
def held_run(tmp_path_factory):
  """A DP run checkpointed every 3 rounds (OS noise key): 4 rounds; its
  directory and what it printed."""
  root = tmp_path_factory.mktemp('held')
  with contextlib.redirect_stdout(io.StringIO()) as out:
    program.run(_config(root, rounds=4, checkpoint_every=3))
  return root / 'run', out.getvalue()


@pytest.fixture
def held(held_run):
  return held_run[0]


def _header(path):
  with np.load(path) as data:
    return json.loads(str(data['header']))


def test_a_dp_run_releases_rounds_only_once_a_checkpoint_holds_them(held):
  """Checkpoints after rounds 3 and 4 (the last); each holds the rows of
  the rounds since the one before, exactly as the log released them."""
  assert sorted(p.name for p in (held / 'checkpoints').iterdir()) == [
      'round_000003.npz', 'round_000004.npz']
  log = [json.loads(line) for line in
         (held / 'releases.jsonl').read_text().splitlines()]
  assert [record['round'] for record in log] == [1, 2, 3, 4]
  for name, rounds in (('round_000003.npz', [1, 2, 3]),
                       ('round_000004.npz', [4])):
    header = _header(held / 'checkpoints' / name)
    assert [p['round'] for p in header['pending']] == rounds
    for pending in header['pending']:
      record = log[pending['round'] - 1]
      assert pending['row'] == record['row']
      assert pending['event'] == record['event']
    # It follows the log of the rounds before its first.
    assert header['log_hash'] == (log[rounds[0] - 2]['hash'] if rounds[0] > 1
                                  else '0' * 64)


def test_a_held_rounds_line_shows_its_own_epsilon(held_run):
  """Rounds 1-3 are printed once round 3's checkpoint is written, each with
  the epsilon its row released (not the newest round's)."""
  run_dir, output = held_run
  rows = _rows(run_dir / 'metrics.csv')
  key = next(k for k in rows[0] if k.startswith('epsilon_'))
  lines = [l for l in output.splitlines() if l.startswith('round ')]
  assert [l.split()[1] for l in lines] == ['1/4', '2/4', '3/4', '4/4']
  assert len({row[key] for row in rows}) == 4  # Each round spends more.
  for line, row in zip(lines, rows):
    assert f'epsilon {float(row[key]):.3f} (PLD' in line, (line, row)


def test_rounds_killed_before_their_release_are_released_from_the_checkpoint(
    held, tmp_path):
  """Killed after round 1's release, rounds 2-3 held in round 3's
  checkpoint: the rerun releases their saved rows (a round computed again
  would draw a new OS key's noise: other lines) and trains round 4."""
  run_dir = tmp_path / 'run'
  shutil.copytree(held, run_dir)
  text = (held / 'releases.jsonl').read_text().splitlines(keepends=True)
  for name in ('summary.json', 'ledger.json', 'plot.png',
               'checkpoints/round_000004.npz'):
    (run_dir / name).unlink()
  shutil.rmtree(run_dir / 'tensorboard')
  (run_dir / 'releases.jsonl').write_text(text[0])
  csv_lines = (held / 'metrics.csv').read_text().splitlines(keepends=True)
  (run_dir / 'metrics.csv').write_text(''.join(csv_lines[:2]))
  saved = (run_dir / 'checkpoints' / 'round_000003.npz').stat()
  program.run(_config(tmp_path, rounds=4, checkpoint_every=3))
  again = (run_dir / 'releases.jsonl').read_text().splitlines(keepends=True)
  assert again[:3] == text[:3] and len(again) == 4
  assert [row['round'] for row in _rows(run_dir / 'metrics.csv')] == [
      '1', '2', '3', '4']
  kept = (run_dir / 'checkpoints' / 'round_000003.npz').stat()
  assert (kept.st_ino, kept.st_mtime_ns) == (saved.st_ino, saved.st_mtime_ns)


def test_pending_rounds_read_both_header_forms_and_refuse_others(tmp_path):
  row, event = {'round': 7}, {'name': 'gaussian'}
  # One round's {row, event}, as checkpoints wrote it before batches.
  assert checkpoints.pending_rounds(
      {'pending': {'row': row, 'event': event}}, 7) == [(7, row, event)]
  assert checkpoints.pending_rounds({'pending': None}, 7) == []
  held_rows = [dict(round=r, row=row, event=event) for r in (5, 6, 7)]
  assert [r for r, _, _ in checkpoints.pending_rounds(
      {'pending': held_rows}, 7)] == [5, 6, 7]
  for bad in (held_rows[:2], held_rows[::2], [held_rows[2], held_rows[1]],
              'rows', [1, 2]):
    with pytest.raises(ValueError):
      checkpoints.pending_rounds({'pending': bad}, 7)
  store = checkpoints.Checkpoints(str(tmp_path / 'checkpoints'))
  store.save(7, [np.zeros(3)], {'pending': held_rows[:2]})
  with pytest.raises(run_records.RunRecordError,
                     match=r'round_000007.npz is damaged \(its pending'):
    store.load(7)


# ----------------------------------------------------------------------------
# A DP run whose log is gone is never trained again: every released file is
# evidence, and the refusal gives the most epsilon that the evidence proves.


def _epsilon_of_first(run_dir, rounds):
  """Epsilon of the first `rounds` released events, by dp_accounting."""
  return _released_epsilon(run_dir, rounds)


def _refused_epsilon(message):
  return float(message.split('spent epsilon = ')[1].split()[0])


@pytest.mark.parametrize('log', ['deleted', 'emptied'])
@pytest.mark.parametrize('finished_run', [True, False])
def test_deleted_records_and_checkpoints_never_train_a_dp_run_again(
    copy, log, finished_run):
  """Delete (or empty) releases.jsonl and checkpoints/, rerun: refused.

  A finished run still has summary.json, ledger.json, plot.png, metrics.csv
  and tensorboard/; a killed one metrics.csv and tensorboard/. Training
  from round 1 would release rounds 1-3 a second time under a new key.
  """
  if log == 'deleted':
    (copy / 'releases.jsonl').unlink()
  else:
    (copy / 'releases.jsonl').write_bytes(b'')
  shutil.rmtree(copy / 'checkpoints')
  if not finished_run:
    for name in ('summary.json', 'ledger.json', 'plot.png'):
      (copy / name).unlink()
  before = _files(copy)
  with pytest.raises(run_records.RunRecordError) as error:
    program.run(_config(copy.parent))
  message = str(error.value)
  assert '\n' not in message
  assert f'rounds up to {ROUNDS} were released' in message
  assert 'releases.jsonl lists none' in message
  assert _refused_epsilon(message) > 0  # Its value: the tests below.
  assert _files(copy) == before  # Nothing trained, nothing rewritten.


def test_refusal_after_deletion_reports_the_epsilon_that_was_spent(
    copy, finished, dp_accounting_builds_each_round_once):
  run_dir, _ = finished
  (copy / 'releases.jsonl').unlink()
  shutil.rmtree(copy / 'checkpoints')
  with pytest.raises(run_records.RunRecordError) as error:
    program.run(_config(copy.parent))
  assert _refused_epsilon(str(error.value)) == pytest.approx(
      _released_epsilon(run_dir), rel=1e-3)


@pytest.mark.parametrize('survivors,proven', [
    (('metrics.csv', 'tensorboard', 'checkpoints'), ROUNDS),
    (('tensorboard', 'checkpoints'), ROUNDS),
    (('checkpoints',), ROUNDS - 1),  # round_3.npz: rounds 1-2 released.
    (('tensorboard',), ROUNDS),
    (('metrics.csv',), ROUNDS),
])
def test_refusal_gives_the_largest_epsilon_any_surviving_file_proves(
    copy, finished, survivors, proven, dp_accounting_builds_each_round_once):
  """Killed after round 3's release; the log's last two lines deleted.

  The log proves 1 round; a checkpoint of round r proves r - 1, metrics.csv
  and TensorBoard every round they show. The refusal's epsilon is that of
  the most rounds any survivor proves (dp_accounting, composed here).
  """
  run_dir, _ = finished
  for name in ('summary.json', 'ledger.json', 'plot.png'):
    (copy / name).unlink()
  lines = (copy / 'releases.jsonl').read_text().splitlines(keepends=True)
  (copy / 'releases.jsonl').write_text(''.join(lines[:1]))
  for name in ('metrics.csv', 'tensorboard', 'checkpoints'):
    if name not in survivors:
      path = copy / name
      shutil.rmtree(path) if path.is_dir() else path.unlink()
  before = _files(copy)
  with pytest.raises(run_records.RunRecordError) as error:
    program.run(_config(copy.parent))
  message = str(error.value)
  assert f'The {proven} rounds released so far' in message
  assert _refused_epsilon(message) == pytest.approx(
      _epsilon_of_first(run_dir, proven), rel=1e-3)
  assert _refused_epsilon(message) > _epsilon_of_first(run_dir, 1)
  assert _files(copy) == before


def test_unwritable_output_dir_is_refused(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('not a directory')
  config = training.TrainConfig(root_output_dir=str(blocker / 'runs'))
  with pytest.raises(training.ConfigError, match='root_output_dir'):
    run_directory.existing_run(config)


def test_other_configuration_in_existing_dir_is_refused_untouched(tmp_path):
  config = training.TrainConfig(root_output_dir=str(tmp_path),
                                experiment_name='run')
  assert run_directory.prepare_output_dir(config) is False
  marker = tmp_path / 'run' / 'metrics.csv'
  marker.write_text('round\n1\n')
  other = dataclasses.replace(config, rounds=99)
  with pytest.raises(training.ConfigError, match='rounds'):
    run_directory.prepare_output_dir(other)
  assert marker.read_text() == 'round\n1\n'
  assert run_directory.prepare_output_dir(config) is True  # Resumes.


def test_run_recorded_under_earlier_knob_names_resumes(tmp_path):
  # `local_clip` and `blur_lambda` are the earlier names of `local_clip_norm`
  # and `blur_strength`: a config.json that uses them is the same run.
  config = training.TrainConfig(root_output_dir=str(tmp_path),
                                experiment_name='run', local_clip_norm=2.0,
                                blur_strength=0.5, blur_clip_norm=1.0)
  recorded = config.to_json()
  recorded['local_clip'] = recorded.pop('local_clip_norm')
  recorded['blur_lambda'] = recorded.pop('blur_strength')
  (tmp_path / 'run').mkdir()
  (tmp_path / 'run' / 'config.json').write_text(json.dumps(recorded))
  assert run_directory.existing_run(config) == 'resume'
  other = dataclasses.replace(config, local_clip_norm=3.0)
  with pytest.raises(training.ConfigError, match='local_clip_norm'):
    run_directory.existing_run(other)


@pytest.mark.parametrize('bounding, clip_norm, resumes', [
    ('normalize', 1.0, True), ('none', 'adaptive', True),
    ('normalize', 'adaptive', False)])
def test_run_recorded_at_the_earlier_default_quantile(tmp_path, bounding,
                                                      clip_norm, resumes):
  # Runs recorded when the default target quantile was 0.3 (it now follows
  # the noise: None): a fixed norm or no bounding never read it, so the run
  # is the same; an adaptive norm tracked 0.3, so unset it is another run.
  config = training.TrainConfig(root_output_dir=str(tmp_path),
                                experiment_name='run', bounding=bounding,
                                clip_norm=clip_norm)
  assert config.target_quantile is None
  recorded = dict(config.to_json(), target_quantile=0.3)
  (tmp_path / 'run').mkdir()
  (tmp_path / 'run' / 'config.json').write_text(json.dumps(recorded))
  if resumes:
    assert run_directory.existing_run(config) == 'resume'
  else:
    with pytest.raises(training.ConfigError, match='target_quantile'):
      run_directory.existing_run(config)
  assert run_directory.existing_run(
      dataclasses.replace(config, target_quantile=0.3)) == 'resume'


def test_foreign_nonempty_dir_is_refused(tmp_path):
  (tmp_path / 'run').mkdir()
  (tmp_path / 'run' / 'notes.txt').write_text('mine')
  config = training.TrainConfig(root_output_dir=str(tmp_path),
                                experiment_name='run')
  with pytest.raises(training.ConfigError, match='not empty'):
    run_directory.prepare_output_dir(config)


def test_a_changed_dp_configuration_is_not_told_to_delete_the_run(copy):
  with pytest.raises(training.ConfigError) as error:
    program.run(_config(copy.parent, clip_norm=0.5))
  message = str(error.value)
  assert 'delete' not in message.replace('deleting it does not', '')
  assert 'another --experiment_name' in message


# ----------------------------------------------------------------------------
# Checkpoints hold the noise key: readable by their owner only.


def test_checkpoints_are_readable_by_their_owner_only(finished):
  """The key in a checkpoint regenerates every round's noise; with the
  released model that gives the clients' updates back. Directory 0700,
  files 0600, whatever the umask."""
  run_dir, _ = finished
  checkpoints = run_dir / 'checkpoints'
  assert oct(os.stat(checkpoints).st_mode & 0o777) == oct(0o700)
  files = list(checkpoints.iterdir())
  assert files
  for path in files:
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o600), path


def test_a_checkpoint_is_written_as_produced_never_whole_in_memory(tmp_path):
  """A checkpoint is the server state (the model times the noise mechanism's
  state): saving it allocates under half its size (no file image in
  memory), and it reads back exactly."""
  import tracemalloc  # pylint: disable=g-import-not-at-top
  leaf = np.arange(16 * 2**20, dtype=np.float32)  # 64 MiB.
  store = checkpoints.Checkpoints(str(tmp_path / 'checkpoints'))
  tracemalloc.start()
  try:
    store.save(1, [leaf], {'model': None})
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert peak < leaf.nbytes / 2
  leaves, header = store.load(1)
  np.testing.assert_array_equal(leaves[0], leaf)
  assert header == {'model': None, 'round': 1}


def test_another_user_of_the_machine_cannot_read_a_checkpoint(finished):
  """The attack: another local user opens a checkpoint (to regenerate the
  noise from its key). The run is copied with its modes into a directory
  everyone may enter; as user `nobody`, its released metrics.csv reads and
  its checkpoint does not. Without root (no second user to be), the modes
  are what decide, and are checked."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  run_dir, _ = finished
  shared = pathlib.Path(tempfile.mkdtemp())
  try:
    os.chmod(shared, 0o755)
    shutil.copytree(run_dir, shared / 'run', copy_function=shutil.copy2)
    os.chmod(shared / 'run', 0o755)
    checkpoint = sorted((shared / 'run' / 'checkpoints').iterdir())[-1]
    if os.geteuid() != 0:
      assert os.stat(checkpoint).st_mode & 0o077 == 0
      assert os.stat(checkpoint.parent).st_mode & 0o077 == 0
      return

    def read_as_nobody(path):
      return subprocess.run(['cat', str(path)], user=65534,
                            capture_output=True, check=False)

    assert read_as_nobody(shared / 'run' / 'metrics.csv').returncode == 0
    attempt = read_as_nobody(checkpoint)
    assert attempt.returncode != 0 and b'Permission denied' in attempt.stderr
    assert attempt.stdout == b''
  finally:
    shutil.rmtree(shared)


def test_a_resumed_old_run_has_its_checkpoints_made_private(copy):
  (copy / 'summary.json').unlink()
  checkpoints = copy / 'checkpoints'
  os.chmod(checkpoints, 0o755)
  for path in checkpoints.iterdir():
    os.chmod(path, 0o644)  # As an older version wrote them.
  program.run(_config(copy.parent))
  assert os.stat(checkpoints).st_mode & 0o077 == 0
  assert all(os.stat(p).st_mode & 0o077 == 0 for p in checkpoints.iterdir())


def test_a_checkpoint_holds_only_the_metrics_its_release_shows(finished):
  run_dir, _ = finished
  newest = sorted((run_dir / 'checkpoints').iterdir())[-1]
  with np.load(newest) as data:
    header = json.loads(str(data['header']))
  # RELEASED's 'epsilon' is named in the row by its accountant and delta.
  (pending,) = header['pending']  # Checkpointed every round: one round.
  assert pending['round'] == ROUNDS
  row = {'epsilon' if k.startswith('epsilon_') else k for k in pending['row']}
  assert row <= set(program_logic.RELEASED)
  assert 'epsilon_pld_delta_1e-05' in pending['row']


def test_share_run_hands_over_the_released_outputs_without_secrets(
    finished, tmp_path):
  """`python -m scripts.share_run`: everything released, no checkpoint."""
  run_dir, _ = finished
  shared = tmp_path / 'shared'
  result = as_a_user.run(['-m', 'scripts.share_run', f'--run_dir={run_dir}',
                          f'--output_dir={shared}'], timeout=120)
  assert result.returncode == 0, result.stderr
  assert sorted(p.name for p in shared.iterdir()) == sorted([
      'config.json', 'releases.jsonl', 'metrics.csv', 'tensorboard',
      'ledger.json', 'summary.json', 'plot.png', 'model.npz'])
  assert not list(shared.rglob('round_*')) and not list(shared.rglob('.lock'))
  for path in shared.rglob('*'):
    if path.is_file() and path.name != 'model.npz':
      assert path.read_bytes() == (
          run_dir / path.relative_to(shared)).read_bytes()
  # model.npz: the released model's weights alone, shaped as the task's
  # model's variables (ModelWeights order), nothing else of the state.
  model = program.build_task(BASE).model_fn()
  with np.load(shared / 'model.npz') as weights:
    names = sorted(weights.files)
    shapes = [weights[n].shape for n in names if n.startswith('trainable')]
  assert shapes == [tuple(v.shape) for v in model.trainable_variables]
  assert len(names) == len(model.trainable_variables) + len(
      model.non_trainable_variables)
  again = as_a_user.run(['-m', 'scripts.share_run', f'--run_dir={run_dir}',
                         f'--output_dir={shared}'], timeout=120)
  assert again.returncode == 2 and 'exists' in again.stderr
  assert len(again.stderr.strip().splitlines()) == 1


def test_a_run_being_trained_is_not_shared(copy, tmp_path):
  """While a process trains the run (holding its `.lock`), its files change
  as it writes them (a release line half written, a checkpoint renamed):
  share_run refuses in one line naming the holder's pid, and leaves no
  copy; once the run stops, the same call shares it."""
  shared = tmp_path / 'shared'
  with run_records.exclusive(str(copy)):  # As a training process holds it.
    with pytest.raises(run_records.RunRecordError) as error:
      checkpoints.share(str(copy), str(shared))
  assert f'(pid {os.getpid()}) is training this run' in str(error.value)
  assert 'nothing was copied' in str(error.value)
  assert not shared.exists()
  assert [p.name for p in tmp_path.iterdir() if p.name != 'run'] == []
  names, _ = checkpoints.share(str(copy), str(shared))
  assert 'releases.jsonl' in names


def test_a_noised_runs_tensorboard_files_stamped_with_a_clock_are_not_shared(
    copy, tmp_path):
  """A noised run's TensorBoard view stamps each event with its round, never
  a time (`release_managers.round_clock`). An event file TensorFlow's own
  writer made in its tensorboard/ (as an older tff_clip wrote them, or
  another program) holds the times each value was written: share_run
  leaves it out, naming it, as it does a file that is no event file. The
  run's own event files are copied as they are. Without noise nothing is
  withheld, and the same file is shared."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  written = tmp_path / 'written'
  with tf.summary.create_file_writer(str(written)).as_default():
    for step in (1, 2):
      tf.summary.scalar('train_loss', 0.5, step=step)
  (stamped,) = written.iterdir()
  own = sorted(p.name for p in (copy / 'tensorboard').iterdir())
  shutil.copy(stamped, copy / 'tensorboard' / stamped.name)
  (copy / 'tensorboard' / 'notes.txt').write_text('round 1 took 3 s\n')
  names, skipped = checkpoints.share(str(copy), str(tmp_path / 'shared'))
  assert 'tensorboard' in names
  assert sorted(p.name for p in (tmp_path / 'shared' / 'tensorboard')
                .iterdir()) == own
  for name in own:
    assert ((tmp_path / 'shared' / 'tensorboard' / name).read_bytes() ==
            (copy / 'tensorboard' / name).read_bytes())
  for name in (stamped.name, 'notes.txt'):
    (line,) = [s for s in skipped if s.startswith(f'tensorboard/{name} ')]
    assert 'holds no clock' in line

  config = json.loads((copy / 'config.json').read_text())
  config.update(noise_multiplier=None, target_epsilon=None)
  (copy / 'config.json').write_text(json.dumps(config))
  checkpoints.share(str(copy), str(tmp_path / 'plain'))
  assert ((tmp_path / 'plain' / 'tensorboard' / stamped.name).read_bytes() ==
          stamped.read_bytes())


def test_released_files_are_readable_by_others(finished):
  """What a run releases stays readable by others (the umask may narrow it),
  and writable by its owner only."""
  run_dir, _ = finished
  umask = os.umask(0)
  os.umask(umask)
  for name in ('metrics.csv', 'summary.json', 'ledger.json', 'config.json'):
    assert os.stat(run_dir / name).st_mode & 0o777 == 0o644 & ~umask


# ----------------------------------------------------------------------------
# Records are checked, never trusted or lost silently.


@pytest.mark.parametrize('damage', ['cut_mid_line', 'truncated', 'garbage'])
def test_damaged_metrics_csv_is_rebuilt_from_the_release_log(
    copy, finished, damage):
  run_dir, _ = finished
  metrics = copy / 'metrics.csv'
  text = metrics.read_text()
  metrics.write_text({'cut_mid_line': text[:len(text) - 20],
                      'truncated': text.splitlines(keepends=True)[0],
                      'garbage': '\x00\x01not,a\ncsv"file'}[damage])
  program.run(_config(copy.parent))
  assert _rows(metrics) == _rows(run_dir / 'metrics.csv')
  assert len(_rows(metrics)) == ROUNDS


def test_edited_summary_is_recomputed_from_the_records(copy, finished):
  _, summary = finished
  data = json.loads((copy / 'summary.json').read_text())
  data['epsilon'] = 0.5
  (copy / 'summary.json').write_text(json.dumps(data))
  again = program.run(_config(copy.parent))
  assert again['epsilon'] == pytest.approx(summary['epsilon'], rel=1e-12)
  # The run's one accountant (PLD) is below the RDP of the same events.
  assert again['accountant'] == 'pld'
  assert again['epsilon'] < _released_epsilon(copy, accountant='rdp')
  assert json.loads((copy / 'summary.json').read_text())['epsilon'] == (
      again['epsilon'])


@pytest.mark.parametrize('content', [b'', b'{"epsilon": 8.8, "ro'])
def test_empty_or_truncated_summary_is_rebuilt(copy, finished, content):
  _, summary = finished
  (copy / 'summary.json').write_bytes(content)
  again = program.run(_config(copy.parent))
  assert again['epsilon'] == summary['epsilon']
  assert again['final_eval_accuracy'] == summary['final_eval_accuracy']


@pytest.mark.parametrize('damage', ['truncated', 'directory'])
def test_damaged_config_is_one_line_naming_the_file(copy, damage):
  path = copy / 'config.json'
  if damage == 'truncated':
    path.write_text(path.read_text()[:30])
  else:
    path.unlink()
    path.mkdir()
  before = _files(copy)
  with pytest.raises(run_records.RunRecordError) as error:
    program.run(_config(copy.parent))
  assert 'config.json' in str(error.value) and '\n' not in str(error.value)
  assert _files(copy) == before


def test_kill_after_the_last_release_keeps_the_final_evaluation(copy,
                                                                finished):
  _, summary = finished
  (copy / 'summary.json').unlink()  # Killed before the summary was written.
  again = program.run(_config(copy.parent))
  assert again['final_eval_accuracy'] == summary['final_eval_accuracy']
  assert again['final_eval_accuracy'] is not None


def test_rerun_of_a_finished_run_reports_its_records_and_changes_nothing(
    copy, finished):
  _, summary = finished
  before = _files(copy)
  assert program.run(_config(copy.parent)) == summary
  assert _files(copy) == before


def test_a_run_records_what_its_defaults_resolved_to(finished):
  """The default rule's choices, as config.json's `resolved`: the digits MLP
  (64-32-10: d = 64 x 32 + 32 + 32 x 10 + 10 = 2,410), z = 0.5, n = 6, so
  z sqrt(d) / n = 4.1: normalization at the 0.03 quantile, the damped step;
  and the adaptive norm's split of z (Andrew et al. 2021): the count noise
  sigma_b = max(n / 20, z / (2 sqrt(1 - 1.1^-2))) = 0.600, so that the value
  noise z_v = (z^-2 - (2 sigma_b)^-2)^-1/2 = 1.1 z = 0.55."""
  run_dir, summary = finished
  recorded = json.loads((run_dir / 'config.json').read_text())['resolved']
  sigma_b = max(6 / 20, 0.5 / (2 * math.sqrt(1 - 1.1**-2)))
  assert recorded.pop('clipped_count_stddev') == pytest.approx(sigma_b)
  assert recorded.pop('value_noise_multiplier') == pytest.approx(
      (0.5**-2 - (2 * sigma_b)**-2)**-0.5) == pytest.approx(0.55)
  assert recorded == dict(bounding='normalize', target_quantile=0.03,
                          quantile_switch=None, server_step='damped',
                          client_groups=None, noise_factorization=None,
                          noise_multiplier=0.5,
                          dimension=2410, clients_per_round=6, layers=4)
  assert {k: summary[k] for k in ('bounding', 'target_quantile',
                                  'server_step', 'noise_multiplier')} == {
                                      k: recorded[k] for k in (
                                          'bounding', 'target_quantile',
                                          'server_step', 'noise_multiplier')}


def _resolved_earlier(run_dir, **choices):
  """config.json as a tff_clip whose default rule chose `choices` wrote it."""
  path = run_dir / 'config.json'
  recorded = json.loads(path.read_text())
  recorded['resolved'].update(choices)
  path.write_text(json.dumps(recorded))


@pytest.mark.parametrize('finished_run', [True, False])
def test_a_run_whose_defaults_resolved_otherwise_is_refused_untouched(
    copy, finished_run):
  """Started when the rule chose clipping at 0.13 (as a rule that changed
  since might have): reported as finished, it would be read as today's
  default; resumed, it would change its bounding mid-run."""
  _resolved_earlier(copy, bounding='clip', target_quantile=0.13)
  if not finished_run:
    (copy / 'summary.json').unlink()
  before = _files(copy)
  with pytest.raises(training.ConfigError) as error:
    program.run(_config(copy.parent))
  message = str(error.value)
  assert "bounding='clip', target_quantile=0.13" in message
  assert "bounding='normalize', target_quantile=0.03" in message
  assert '\n' not in message and 'nothing was changed' in message
  assert _files(copy) == before


def test_a_run_that_recorded_no_resolution_is_reported_as_before(
    copy, finished):
  _, summary = finished
  path = copy / 'config.json'
  recorded = json.loads(path.read_text())
  del recorded['resolved']
  path.write_text(json.dumps(recorded))
  assert program.run(_config(copy.parent)) == summary


@pytest.mark.parametrize('record', ['no_resolution', 'hashed_groups'])
def test_a_separated_run_started_with_hashed_groups_is_not_resumed(
    tmp_path, record):
  """A --sampling=min_separation run recorded before the groups were equal
  (no `resolved`, or one without `client_groups`) had hashed groups:
  resumed with equal ones, a client could take part twice within b rounds.
  Refused in one line, its directory untouched; one recorded with today's
  groups resumes."""
  from tff_clip.program import assembly  # pylint: disable=g-import-not-at-top
  config = _config(tmp_path, sampling='min_separation',
                   noise_mechanism='banded', bands=2, clients_per_round=3)
  current = assembly.resolved_choices(config, 0.5, 2410)
  assert current['client_groups'] == 'equal_permuted'
  os.makedirs(config.output_dir)
  recorded = config.to_json()
  if record == 'hashed_groups':
    recorded['resolved'] = dict(current, client_groups=None)
    del recorded['resolved']['client_groups']
  run_records.write_json(os.path.join(config.output_dir, 'config.json'),
                         recorded)
  before = _files(pathlib.Path(config.output_dir))
  with pytest.raises(training.ConfigError) as error:
    run_directory.check_resolved(config, current)
  message = str(error.value)
  assert "'equal_permuted'" in message and '\n' not in message
  assert 'nothing was changed' in message
  assert ('hash' in message) == (record == 'no_resolution')
  assert _files(pathlib.Path(config.output_dir)) == before
  recorded['resolved'] = dict(current)
  run_records.write_json(os.path.join(config.output_dir, 'config.json'),
                         recorded)
  run_directory.check_resolved(config, current)


def test_a_start_that_another_start_of_the_run_overtook_changes_nothing(
    tmp_path, monkeypatch):
  """Two starts of one command: both find the directory new, and while this
  one builds its session (tracing takes seconds) the other trains the whole
  run. Under the run's lock this one finds the run begun, and refuses in
  one line, every file as the other left it (it neither rewrote
  config.json as a new run's nor released the rounds again)."""
  from tff_clip.program import assembly  # pylint: disable=g-import-not-at-top
  config = _config(tmp_path)
  build = assembly.session
  other = []

  def overtaken(config_, task_builder):
    session = build(config_, task_builder)
    monkeypatch.setattr(assembly, 'session', build)
    other.append(program.run(config))  # The other start, meanwhile.
    return session

  monkeypatch.setattr(assembly, 'session', overtaken)
  run_dir = pathlib.Path(config.output_dir)
  with pytest.raises(training.ConfigError) as error:
    program.run(config)
  assert 'another process started this run' in str(error.value)
  assert '\n' not in str(error.value)
  after_the_other = _files(run_dir)
  assert program.run(config) == other[0]  # A rerun reports it.
  assert _files(run_dir) == after_the_other


def test_a_separated_run_resumed_on_other_client_ids_is_refused(tmp_path):
  """Minimum separation deals the groups from the set of client ids: one
  more client re-ranks them all, and a client could then take part twice
  within b rounds. The run's checkpoints keep the SHA-256 of the sorted ids
  (as a JSON list) -- never config.json, which is released: the set is the
  clients' own -- and restoring on another set is refused before anything
  is written; the same set in another order restores."""
  config = _config(tmp_path, sampling='min_separation',
                   noise_mechanism='banded', bands=2, rounds=2)
  program.run(config)
  run_dir = pathlib.Path(config.output_dir)
  ids = list(program.build_task(config).datasets.train_data.client_ids)
  digest = hashlib.sha256(json.dumps(sorted(map(str, ids))).encode())
  headers = [_header(p) for p in (run_dir / 'checkpoints').iterdir()]
  assert headers and all(h['client_ids'] == digest.hexdigest()
                         for h in headers)
  assert digest.hexdigest() not in ''.join(
      p.read_text() for p in run_dir.glob('*') if p.suffix in (
          '.json', '.jsonl', '.csv'))

  def state(client_ids):
    log = run_records.ReleaseLog(str(run_dir))
    return run_directory.RunState(config, log, True, list, list, None,
                                  client_ids)

  before = _files(run_dir)
  with pytest.raises(training.ConfigError) as error:
    state(ids + ['intruder']).restore(lambda: None)
  assert 'other client ids' in str(error.value)
  assert 'nothing was changed' in str(error.value)
  assert _files(run_dir) == before
  assert state(ids[::-1]).restore(lambda: None)[1] == 3  # Round 3 is next.


# ----------------------------------------------------------------------------
# Atomic, durable writes; a full disk is one line naming the path.


def _fsync_spy(monkeypatch) -> list:
  """The paths fsynced from now on, in order."""
  synced = []
  real_fsync = os.fsync

  def spy(fd):
    synced.append(os.readlink(f'/proc/self/fd/{fd}'))
    real_fsync(fd)

  monkeypatch.setattr(run_records.os, 'fsync', spy)
  return synced


def test_writes_are_fsynced_file_and_directory(tmp_path, monkeypatch):
  synced = _fsync_spy(monkeypatch)
  run_records.write_json(str(tmp_path / 'a.json'), {'x': 1})
  assert synced == [str(tmp_path / '.a.json.tmp'), str(tmp_path)]
  synced.clear()
  log = run_records.ReleaseLog(str(tmp_path))
  log.append(1, {'round': 1, 'epsilon': 1.0}, None)
  assert str(tmp_path / 'releases.jsonl') in synced


def test_a_release_of_many_rounds_is_durable_once_all_are_written(
    tmp_path, monkeypatch):
  # A DP run releases the rounds since its checkpoint together: each line is
  # written (and flushed) in turn, and the log (a new file: its directory
  # too) fsynced once, when the last is appended.
  synced = _fsync_spy(monkeypatch)
  log = run_records.ReleaseLog(str(tmp_path))
  for round_num in (1, 2, 3):
    log.append(round_num, {'round': round_num}, None, sync=False)
  assert synced == []
  assert len((tmp_path / 'releases.jsonl').read_text().splitlines()) == 3
  log.sync()
  assert synced == [str(tmp_path / 'releases.jsonl'), str(tmp_path)]
  assert [r['round'] for r in run_records.ReleaseLog(str(tmp_path)).records
         ] == [1, 2, 3]


def test_a_training_fsyncs_its_log_and_csv_once_a_release(tmp_path,
                                                          monkeypatch):
  # 4 DP rounds checkpointed every 3: two releases (rounds 1-3, round 4).
  synced = _fsync_spy(monkeypatch)
  with contextlib.redirect_stdout(io.StringIO()):
    program.run(_config(tmp_path, rounds=4, checkpoint_every=3))
  run_dir = tmp_path / 'run'
  assert synced.count(str(run_dir / 'releases.jsonl')) == 2
  assert synced.count(str(run_dir / 'metrics.csv')) == 2
  assert [r['round'] for r in _rows(run_dir / 'metrics.csv')] == [
      '1', '2', '3', '4']


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
  path = tmp_path / 'a.json'
  run_records.write_json(str(path), {'x': 1})

  def no_space(fd):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(run_records.os, 'fsync', no_space)
  with pytest.raises(run_records.RunRecordError) as error:
    run_records.write_json(str(path), {'x': 2})
  assert str(path) in str(error.value) and 'No space left' in str(error.value)
  assert json.loads(path.read_text()) == {'x': 1}
  assert sorted(p.name for p in tmp_path.iterdir()) == ['a.json']


def test_full_disk_mid_run_is_one_line_and_the_run_resumes(
    tmp_path, monkeypatch, finished):
  run_dir, summary = finished
  real_fsync = os.fsync
  calls = {'n': 0}

  def fills_up(fd):
    if os.readlink(f'/proc/self/fd/{fd}').endswith('round_000002.npz.tmp'):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    calls['n'] += 1
    real_fsync(fd)

  monkeypatch.setattr(run_records.os, 'fsync', fills_up)
  config = _config(tmp_path)
  with pytest.raises(run_records.RunRecordError) as error:
    program.run(config)
  message = str(error.value)
  assert '\n' not in message and 'round_000002.npz' in message
  assert 'No space left on device' in message
  assert [r['round'] for r in _rows(tmp_path / 'run' / 'metrics.csv')] == ['1']
  monkeypatch.setattr(run_records.os, 'fsync', real_fsync)
  again = program.run(config)  # Space freed: resumes after round 1.
  assert [r['round'] for r in _rows(tmp_path / 'run' / 'metrics.csv')] == [
      '1', '2', '3']
  assert again['epsilon'] == pytest.approx(summary['epsilon'], rel=1e-12)


# ----------------------------------------------------------------------------
# The end-of-run message says what epsilon means, never "epsilon = 0".


def _summary(epsilon, extrapolated):
  return dict(experiment='e', final_eval_accuracy=0.9, epsilon=epsilon,
              noise_multiplier=1.0, delta=1e-5, clients_per_round=50,
              population_size=1000, sampling='poisson', rounds=300,
              noise='secret',
              extrapolated=dict(population_size=1_000_000,
                                clients_per_round=1000, noise_multiplier=20.0,
                                epsilon=extrapolated))


def test_end_of_run_message_explains_epsilon_without_a_fixed_verdict():
  text = program.format_summary(_summary(4.0, 0.02))
  assert 'far too small' not in text
  assert 'epsilon 4.000 (RDP, delta 1e-05)' in text
  assert f'e^epsilon = {np.exp(4.0):.3g}' in text  # 54.6


def test_end_of_run_message_names_the_one_accountant_and_its_delta():
  summary = dict(_summary(3.5, 0.02), accountant='pld')
  summary['extrapolated'] = dict(summary['extrapolated'], accountant='pld')
  text = program.format_summary(summary)
  assert 'privacy: epsilon 3.500 (PLD, delta 1e-05) (z = 1' in text
  assert 'RDP' not in text
  assert 'epsilon 4.000 (RDP, delta 1e-05)' in program.format_summary(
      dict(_summary(4.0, 0.02), accountant='rdp'))


def test_a_seeded_runs_end_of_run_message_says_not_private():
  text = program.format_summary(dict(
      _summary(3.5, 0.02), accountant='pld', private=False,
      not_private='NOT private: the noise is reproducible from --noise_seed'))
  assert 'epsilon 3.500 (PLD, delta 1e-05) NOT private' in text
  assert 'Meaning' not in text and 'no observer can raise' not in text
  for line in text.splitlines():
    if 'epsilon' in line:
      assert 'NOT private' in line, line


def test_a_tiny_epsilon_is_never_printed_as_zero():
  text = program.format_summary(_summary(4.0, 0.0))
  assert 'epsilon = 0 ' not in text and 'epsilon = 0.0' not in text
  assert 'would give epsilon < 0.001' in text
  assert program.format_epsilon(3e-7) == '< 0.001'
  assert program.format_epsilon(0.004) == '0.004'


# ----------------------------------------------------------------------------
# Banded noise's checkpoints write what changed: one new noise vector a round.


def _banded_states(bands, rounds, seed=0):
  """A model's leaves and banded noise's ring of its last bands - 1 noise
  vectors (newest first) after each round, and the key: numpy's own
  recursion, as `correlated_noise.Banded` keeps it."""
  rng = np.random.default_rng(seed)
  model = [rng.normal(size=(100, 50)).astype(np.float32),
           rng.normal(size=50).astype(np.float32)]
  ring = [np.zeros((bands - 1,) + m.shape, np.float32) for m in model]
  key = np.array([7, 11], np.int64)
  states = []
  for _ in range(rounds):
    noise = [rng.normal(size=m.shape).astype(np.float32) for m in model]
    ring = [np.concatenate([w[np.newaxis], r[:-1]]) for w, r in zip(noise,
                                                                    ring)]
    model = [m + w for m, w in zip(model, noise)]
    states.append(model + ring + [key])
  return states, sum(m.nbytes for m in model)


@pytest.mark.parametrize('bands', [4, 16, 64])
def test_a_banded_round_writes_the_model_and_one_noise_vector_whatever_b(
    tmp_path, monkeypatch, bands):
  """Each round's ring holds b - 1 noise vectors, b - 2 of them already in
  the previous checkpoint: a round writes the model, the new vector and a
  header, at most 2.25x the model's bytes (counted from its weights) for
  any b, not the b x of writing the ring whole."""
  written = []
  real_replace = os.replace

  def counting_replace(src, dst):
    written.append(os.path.getsize(src))
    real_replace(src, dst)

  monkeypatch.setattr(run_records.os, 'replace', counting_replace)
  states, model_bytes = _banded_states(bands, rounds=bands + 4)
  store = checkpoints.Checkpoints(str(tmp_path / 'checkpoints'))
  for round_num, state in enumerate(states, 1):
    written.clear()
    store.save(round_num, state, {'model': None})
    if round_num > 2:  # The first two carry the initial ring once.
      assert sum(written) <= 2.25 * model_bytes, (round_num, sum(written))
  leaves, _ = checkpoints.Checkpoints(store.directory).load(len(states))
  for got, want in zip(leaves, states[-1], strict=True):
    np.testing.assert_array_equal(got, want)
  # Old vectors are removed once no kept checkpoint holds them.
  assert len(os.listdir(store.directory)) <= 2 + bands


class _Killed(BaseException):
  pass


def test_a_kill_between_any_two_writes_resumes_bit_for_bit(tmp_path,
                                                           monkeypatch):
  """Killed at each file-system change of banded checkpoints (a rename or a
  removal), a restart loads the last complete round's state exactly, every
  kept checkpoint loads (none refers to a missing file), and going on from
  it ends with the uninterrupted run's checkpoints."""
  states, _ = _banded_states(bands=4, rounds=7)
  reference = checkpoints.Checkpoints(str(tmp_path / 'reference'))
  for round_num, state in enumerate(states, 1):
    reference.save(round_num, state, {'model': None})
  real_replace, real_remove = os.replace, os.remove
  change = 0
  while True:
    change += 1
    directory = str(tmp_path / f'killed_{change}' / 'checkpoints')
    count = [0]

    def counted(real):
      def call(*args):
        count[0] += 1
        if count[0] == change:  # pylint: disable=cell-var-from-loop
          raise _Killed()
        return real(*args)
      return call

    monkeypatch.setattr(run_records.os, 'replace', counted(real_replace))
    monkeypatch.setattr(run_records.os, 'remove', counted(real_remove))
    killed = checkpoints.Checkpoints(directory)
    done = 0
    try:
      for round_num, state in enumerate(states, 1):
        killed.save(round_num, state, {'model': None})
        done = round_num
    except _Killed:
      pass
    monkeypatch.setattr(run_records.os, 'replace', real_replace)
    monkeypatch.setattr(run_records.os, 'remove', real_remove)
    if done == len(states):
      break
    resumed = checkpoints.Checkpoints(directory)
    found = resumed.load_latest(warn=pytest.fail)
    resumed.tidy()  # As a run does once it goes on (`RunState.restore`).
    version = found[0] if found else 0
    assert version in (done, done + 1), (change, version, done)
    if found:
      for got, want in zip(found[1], states[version - 1], strict=True):
        np.testing.assert_array_equal(got, want)
    for kept in resumed.versions():
      checkpoints.Checkpoints(directory).load(kept)
    for round_num in range(version + 1, len(states) + 1):
      resumed.save(round_num, states[round_num - 1], {'model': None})
    assert sorted(os.listdir(directory)) == sorted(
        os.listdir(reference.directory)), change
    for kept in reference.versions():
      got, _ = checkpoints.Checkpoints(directory).load(kept)
      want, _ = checkpoints.Checkpoints(reference.directory).load(kept)
      for a, b in zip(got, want, strict=True):
        assert a.tobytes() == b.tobytes()
  assert change > len(states) * 2  # Each round renamed and removed something.


# ----------------------------------------------------------------------------
# Only its owner controls a run directory (ssh's StrictModes): one that
# another user owns or may write in, or one under such a directory, is
# refused before anything in it is read or written; no run file is ever
# opened through a symbolic link.


def _hashes(directory):
  """SHA-256 of every file under `directory` (links as their target path)."""
  import hashlib  # pylint: disable=g-import-not-at-top
  found = {}
  for root, dirs, files in os.walk(directory):
    for name in dirs + files:
      path = pathlib.Path(root) / name
      key = str(path.relative_to(directory))
      if path.is_symlink():
        found[key] = 'link to ' + os.readlink(path)
      elif path.is_file():
        found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
      else:
        found[key] = 'directory'
  return found


def _as_root_only(reason):
  if os.geteuid() != 0:
    pytest.skip(f'{reason} needs root (chown to another uid); the same '
                'check on the mode runs as any user')


@pytest.mark.parametrize('where, change', [
    ('run', 'chmod 777'),       # The attack: an empty runs/x others wrote.
    ('run', 'chmod 775'),       # Writable by a group others belong to.
    ('run', 'chown nobody'),
    ('root', 'chmod 777'),      # runs/, the root the program creates into.
    ('root', 'chown nobody'),
])
def test_a_run_directory_another_user_controls_is_refused_unread(
    tmp_path, where, change):
  """Refused before any file is read: a config.json there that cannot be
  parsed is not what the refusal names (reading it would have said
  'config.json ... not valid JSON'); one line naming the directory and its
  mode or owner; nothing created, nothing changed."""
  if 'chown' in change or change == 'chmod 775':
    _as_root_only('Another owner or group')
  root = tmp_path / 'runs'
  run_dir = root / 'x'
  run_dir.mkdir(parents=True)
  (run_dir / 'config.json').write_text('{"an attacker\'s')
  target = run_dir if where == 'run' else root
  if change == 'chmod 775':
    os.chown(target, -1, 65534)  # A group of other users (nogroup).
  if change == 'chown nobody':
    os.chown(target, 65534, 65534)
    expected = 'belongs to '
  else:
    os.chmod(target, int(change.split()[1], 8))
    expected = f'mode 0{change.split()[1]}'
  before = _hashes(tmp_path)
  config = training.TrainConfig(root_output_dir=str(root),
                                experiment_name='x', rounds=1,
                                progress=False)
  with pytest.raises(training.ConfigError) as error:
    program.run(config)
  message = str(error.value)
  assert '\n' not in message
  assert repr(str(target)) in message and expected in message
  assert 'config.json' not in message
  assert _hashes(tmp_path) == before


def test_an_empty_world_writable_run_directory_is_refused(tmp_path):
  """The attack's first step: another user pre-creates an empty, writable
  runs/x; the victim's run must not start there (today's record of the
  attack: it trained there without a word)."""
  run_dir = tmp_path / 'runs' / 'x'
  run_dir.mkdir(parents=True)
  os.chmod(run_dir, 0o777)
  with pytest.raises(training.ConfigError, match=r"writable by others \(mode "
                     r'0777'):
    program.run(training.TrainConfig(root_output_dir=str(run_dir.parent),
                                     experiment_name='x', rounds=1,
                                     progress=False))
  assert list(run_dir.iterdir()) == []


def test_a_directory_writable_by_the_users_own_group_is_allowed(tmp_path):
  """A user private group (umask 002's premise): group-writable directories
  of a group no one else is in are the user's alone; not refused."""
  from tff_clip.program import ownership  # pylint: disable=g-import-not-at-top
  gid = os.getegid()
  if not ownership._private_group(gid):  # pylint: disable=protected-access
    pytest.skip(f'group {gid} of this user has other members here')
  root = tmp_path / 'runs'
  root.mkdir()
  os.chmod(root, 0o775)
  os.chown(root, -1, gid)
  config = training.TrainConfig(root_output_dir=str(root), experiment_name='x')
  assert run_directory.existing_run(config) == 'new'


def test_a_sticky_directory_above_the_run_is_allowed(tmp_path):
  """/tmp-like (1777) above the run directory: no one else can rename or
  remove the victim's entries there, so it is not refused. The directories
  the program makes are writable by their owner only, even under a umask
  that lets the group write (002), so that a rerun finds them its own."""
  shared = tmp_path / 'tmp'
  shared.mkdir()
  os.chmod(shared, 0o1777)
  config = training.TrainConfig(root_output_dir=str(shared / 'runs'),
                                experiment_name='x')
  assert run_directory.existing_run(config) == 'new'
  umask = os.umask(0o002)
  try:
    run_directory.prepare_output_dir(config)
  finally:
    os.umask(umask)
  for directory in (shared / 'runs', shared / 'runs' / 'x'):
    assert os.stat(directory).st_mode & 0o022 == 0
  assert os.stat(shared / 'runs' / 'x' / 'config.json').st_mode & 0o022 == 0
  assert run_directory.existing_run(config) == 'resume'


def test_a_second_user_cannot_plant_the_run_directory(tmp_path):
  """The attack as a second user (`nobody`), with the program's command line:
  in a sticky directory both may write, the attacker makes the victim's
  run directory first (mode 777); the victim's `scripts.train` refuses it
  in one line naming the directory and its owner, exit 2, nothing in it."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  _as_root_only('Being a second user')
  shared = pathlib.Path(tempfile.mkdtemp())
  try:
    os.chmod(shared, 0o1777)
    planted = subprocess.run(['mkdir', '-m', '777', str(shared / 'x')],
                             user=65534, capture_output=True, check=False)
    if planted.returncode != 0:
      pytest.skip('this machine does not let user nobody (65534) run mkdir: '
                  f'{planted.stderr.decode().strip()}')
    assert os.stat(shared / 'x').st_uid == 65534
    result = as_a_user.run(['-m', 'scripts.train', f'--root_output_dir={shared}',
                            '--experiment_name=x', '--rounds=1'], timeout=120)
    line = as_a_user.refusal(result, shared / 'x' / 'config.json')
    assert repr(str(shared / 'x')) in line and 'nobody' in line
    assert 'TensorFlow' not in result.stderr
    assert list((shared / 'x').iterdir()) == []
  finally:
    shutil.rmtree(shared)


def test_the_lock_is_never_opened_through_a_link(tmp_path):
  """`.lock` replaced by a link to a file of the victim's, or to a path that
  does not exist: refused, the file neither truncated nor written, nothing
  created where the link points."""
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  victim = tmp_path / 'precious'
  victim.write_bytes(b'the victim\'s file')
  for target in (victim, tmp_path / 'made_through_the_link'):
    (run_dir / '.lock').unlink(missing_ok=True)
    os.symlink(target, run_dir / '.lock')
    with pytest.raises(run_records.RunRecordError,
                       match='symbolic link') as error:
      with run_records.exclusive(str(run_dir)):
        pass
    assert '\n' not in str(error.value)
  assert victim.read_bytes() == b'the victim\'s file'
  assert not (tmp_path / 'made_through_the_link').exists()


@pytest.mark.parametrize('name', [
    'releases.jsonl', 'metrics.csv', 'config.json', 'ledger.json',
    'summary.json', 'checkpoints/round_000003.npz', 'tensorboard/events',
    'checkpoints', 'tensorboard'])
def test_no_run_file_is_opened_through_a_link(copy, tmp_path, name):
  """A run file (or its directory) replaced by a symbolic link to an exact
  copy of itself elsewhere: following it would read or write the copy
  without a word. Refused in one line naming the link; not a byte changed,
  here or where it points."""
  if name != 'summary.json':
    (copy / 'summary.json').unlink()  # Killed before the end: resumes.
  if name == 'tensorboard/events':
    name = str(next((copy / 'tensorboard').rglob('events.*')).relative_to(
        copy))
  path = copy / name
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  moved = elsewhere / path.name
  shutil.move(path, moved)
  os.symlink(moved, path)
  before, before_elsewhere = _hashes(copy), _hashes(elsewhere)
  with pytest.raises(run_records.RunRecordError) as error:
    program.run(_config(copy.parent))
  message = str(error.value)
  assert '\n' not in message
  assert f'{path} is a symbolic link' in message
  assert _hashes(copy) == before and _hashes(elsewhere) == before_elsewhere


def test_a_run_file_of_another_user_is_refused(copy):
  """A file that another user owns (planted while the directory was open to
  them, say) is theirs to rewrite at will: refused, never read."""
  _as_root_only('A file of another owner')
  (copy / 'summary.json').unlink()
  os.chown(copy / 'releases.jsonl', 65534, 65534)
  before = _hashes(copy)
  with pytest.raises(run_records.RunRecordError,
                     match=r'releases.jsonl belongs to nobody'):
    program.run(_config(copy.parent))
  assert _hashes(copy) == before


# ----------------------------------------------------------------------------
# A run without DP never rewrites the records of DP rounds; a refusal never
# changes a byte.


def _edit_to_no_dp(run_dir):
  """The edit: config.json says no DP, and what would contradict it at once
  (`resolved`, checkpoints/, summary.json) is removed."""
  recorded = json.loads((run_dir / 'config.json').read_text())
  recorded['noise_multiplier'] = None
  del recorded['resolved']
  (run_dir / 'config.json').write_text(json.dumps(recorded))
  shutil.rmtree(run_dir / 'checkpoints')
  (run_dir / 'summary.json').unlink()


@pytest.mark.parametrize('survivor', [
    None,  # Every other file: releases.jsonl (with noise), metrics.csv, ...
    'metrics.csv', 'ledger.json', 'tensorboard', 'releases.jsonl'])
def test_a_dp_record_edited_to_no_dp_is_refused_unchanged(copy, survivor):
  """DP rounds, then config.json edited to `noise_multiplier: null` (its
  `resolved`, checkpoints/ and summary.json removed), rerun with
  `--noise_multiplier=none`: today "rounds 1-3 run again (no DP)" rewrote
  releases.jsonl without noise and the summary's epsilon became null.
  Refused like any lost record, with the epsilon spent; with only one of
  the files that prove DP rounds left, too. Every byte stays in place."""
  _edit_to_no_dp(copy)
  if survivor is not None:
    for name in ('releases.jsonl', 'metrics.csv', 'ledger.json',
                 'tensorboard', 'plot.png'):
      if name != survivor:
        path = copy / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
  before = _hashes(copy)
  with pytest.raises(run_records.RunRecordError) as error:
    program.run(_config(copy.parent, noise_multiplier=None))
  message = str(error.value)
  assert '\n' not in message
  assert 'DP rounds were released' in message and 'has no DP' in message
  assert _refused_epsilon(message) > 0
  assert _hashes(copy) == before


def test_the_edit_to_no_dp_is_refused_by_the_command_line(copy):
  """The same edit, rerun as a user would: `--noise_multiplier=none`."""
  _edit_to_no_dp(copy)
  before = _hashes(copy)
  result = as_a_user.run([
      '-m', 'scripts.train', f'--root_output_dir={copy.parent}',
      '--experiment_name=run', f'--rounds={ROUNDS}', '--clients_per_round=6',
      '--eval_every=1', '--seed=3', '--noprogress',
      '--noise_multiplier=none'], timeout=600)
  assert result.returncode != 0, result.stdout
  assert 'DP rounds were released' in result.stderr
  assert 'run again' not in result.stdout
  assert _hashes(copy) == before


@pytest.mark.parametrize('refusal', ['cut_log_no_checkpoints',
                                     'killed_save_behind_the_log'])
def test_a_refusal_changes_no_byte(copy, refusal):
  """A refusal leaves every file as it found it: a releases.jsonl cut mid-line
  (which a run that goes on drops) is not rewritten (it was, 1000 -> 977
  bytes, by a refusal that said nothing changed); a killed save's temporary
  file and the checkpoints are not tidied away before the refusal."""
  (copy / 'summary.json').unlink()
  if refusal == 'cut_log_no_checkpoints':
    text = (copy / 'releases.jsonl').read_bytes()
    (copy / 'releases.jsonl').write_bytes(text[:-25])  # Mid-line.
    shutil.rmtree(copy / 'checkpoints')
  else:
    newest = sorted((copy / 'checkpoints').glob('round_*'))[-1]
    newest.rename(newest.parent / f'.{newest.name}.tmp')  # A killed save.
  before = _hashes(copy)
  with pytest.raises(run_records.RunRecordError) as error:
    program.run(_config(copy.parent))
  assert 'nothing was changed' in str(error.value)
  assert _hashes(copy) == before


# ----------------------------------------------------------------------------
# What is shared: regular files only, never through a link.


def test_share_run_never_follows_a_link_into_the_checkpoints(copy, tmp_path):
  """A symbolic link inside tensorboard/ (and one in the run directory's
  place of metrics.csv) to a checkpoint: following it (as the copy did)
  puts the noise key into the shared copy. Only regular files are copied;
  the links are named as left out; no shared file holds a checkpoint's
  bytes or its int64 key leaves."""
  checkpoint = sorted((copy / 'checkpoints').glob('round_*'))[-1]
  os.symlink(checkpoint, copy / 'tensorboard' / 'events.out.tfevents.leak')
  (copy / 'metrics.csv').unlink()
  os.symlink(checkpoint, copy / 'metrics.csv')
  shared = tmp_path / 'shared'
  result = as_a_user.run(['-m', 'scripts.share_run', f'--run_dir={copy}',
                          f'--output_dir={shared}'], timeout=120)
  assert result.returncode == 0, result.stderr
  assert 'tensorboard/events.out.tfevents.leak (a symbolic link)' in (
      result.stdout)
  assert 'metrics.csv (a symbolic link)' in result.stdout
  assert not (shared / 'metrics.csv').exists()
  assert not (shared / 'tensorboard' / 'events.out.tfevents.leak').exists()
  assert (shared / 'tensorboard').is_dir() and (shared / 'ledger.json').exists()
  with np.load(checkpoint) as data:
    keys = [data[n].tobytes() for n in data.files
            if data[n].dtype == np.int64 and data[n].shape == (2,)]
  assert keys
  secret = checkpoint.read_bytes()
  for path in shared.rglob('*'):
    assert not path.is_symlink()
    if path.is_file():
      content = path.read_bytes()
      assert content != secret
      if path.name != 'model.npz':
        assert not any(key in content for key in keys), path


def test_a_ring_with_one_changed_element_is_written_whole_and_loads_exactly(
    tmp_path):
  """Only a ring whose every vector 1.. is, byte for byte, the last
  checkpoint's vector before it is written as one new vector: one changed
  element in its oldest vector makes the leaf inline, and it loads back as
  saved."""
  states, _ = _banded_states(bands=4, rounds=3)
  changed = [leaf.copy() for leaf in states[2]]
  ring = 2  # The model's two leaves, then the rings (3 vectors each).
  changed[ring][-1].flat[7] += 1.0
  store = checkpoints.Checkpoints(str(tmp_path / 'checkpoints'))
  store.save(1, states[0], {'model': None})
  store.save(2, states[1], {'model': None})
  store.save(3, changed, {'model': None})
  with np.load(store.path(3)) as data:
    assert f'leaf_{ring:05d}' in data.files  # Inline, not referred to.
    assert f'leaf_{ring + 1:05d}' not in data.files  # Shifted: referred to.
  leaves, _ = checkpoints.Checkpoints(store.directory).load(3)
  for got, want in zip(leaves, changed, strict=True):
    assert got.tobytes() == want.tobytes()


def test_a_save_hashes_each_leaf_at_most_twice_whatever_its_rows(
    tmp_path, monkeypatch):
  """Whether a ring shifted is one hash of a leaf's vectors 1.. and one of
  its vectors ..-2, not one per vector: a 784 x 10 weight costs two hashes
  a round, not 784."""
  calls = [0]
  real = checkpoints.hashlib.sha256

  def counted(*args):
    calls[0] += 1
    return real(*args)

  monkeypatch.setattr(checkpoints.hashlib, 'sha256', counted)
  rng = np.random.default_rng(0)
  store = checkpoints.Checkpoints(str(tmp_path / 'checkpoints'))
  for round_num in (1, 2):
    state = [rng.normal(size=(784, 10)).astype(np.float32),
             rng.normal(size=10).astype(np.float32)]
    calls[0] = 0
    store.save(round_num, state, {'model': None})
    assert calls[0] <= 2, (round_num, calls[0])


@pytest.mark.parametrize('inside', ['checkpoints/x', 'sub', 'tensorboard/x'])
def test_share_run_never_writes_into_the_run_it_shares(copy, inside):
  """An --output_dir inside the run directory (even in checkpoints/) would
  change the DP run's own record: refused in one line, nothing written."""
  before = _files(copy)
  result = as_a_user.run(['-m', 'scripts.share_run', f'--run_dir={copy}',
                          f'--output_dir={copy / inside}'], timeout=120)
  assert result.returncode == 2, result.stdout + result.stderr
  assert 'inside the run directory' in result.stderr
  assert result.stderr.count('\n') == 1, result.stderr
  assert _files(copy) == before
  assert not (copy / inside).exists()


def test_share_run_leaves_a_directory_of_its_temporary_name_alone(copy,
                                                                   tmp_path):
  """The copy is built under a temporary name of its own beside the
  destination: a user's directory named as the old fixed one was
  (`.NAME.tmp`) is neither deleted nor written."""
  theirs = tmp_path / '.shared.tmp'
  theirs.mkdir()
  (theirs / 'notes.txt').write_text('theirs')
  result = as_a_user.run(['-m', 'scripts.share_run', f'--run_dir={copy}',
                          f'--output_dir={tmp_path / "shared"}'], timeout=120)
  assert result.returncode == 0, result.stdout + result.stderr
  assert [p.name for p in theirs.iterdir()] == ['notes.txt']
  assert (theirs / 'notes.txt').read_text() == 'theirs'
  assert (tmp_path / 'shared' / 'config.json').is_file()
  assert sorted(p.name for p in tmp_path.iterdir()) == ['.shared.tmp', 'run',
                                                        'shared']


def _dp_run_to_share(run_dir):
  """A DP run directory as share_run finds it, made by hand (no training):
  its config, a released ledger and metrics, and a checkpoint (the noise
  key: random bytes, 0600 in 0700). Returns the checkpoint's bytes."""
  run_dir.mkdir(mode=0o755)
  (run_dir / 'config.json').write_text(json.dumps({'noise_multiplier': 1.0}))
  (run_dir / 'ledger.json').write_text('{"epsilon_per_round": [[1, 0.5]]}')
  (run_dir / 'metrics.csv').write_text('round,epsilon_pld_delta_1e-05\n1,0.5\n')
  (run_dir / 'checkpoints').mkdir(mode=0o700)
  secret = run_dir / 'checkpoints' / 'round_000001.npz'
  secret.write_bytes(os.urandom(64))
  for path in run_dir.rglob('*'):
    if path.is_file():
      os.chmod(path, 0o600 if path == secret else 0o644)
  return secret.read_bytes()


@pytest.mark.parametrize('name', ['ledger.json', 'metrics.csv'])
def test_share_run_copies_no_directory_in_the_place_of_a_released_file(
    tmp_path, name):
  """A run writes `ledger.json`, `metrics.csv` (every shared name but
  `tensorboard/`) as regular files. A directory there (checkpoints/ renamed
  to it, as another user who could once write the run directory may do
  without reading it: a rename within one directory needs no write on the
  directory moved) is left out and named, whatever it holds; no shared
  file holds the checkpoint's bytes. Oracle: the bytes of every shared
  file against the checkpoint's."""
  run_dir = tmp_path / 'run'
  secret = _dp_run_to_share(run_dir)
  (run_dir / name).unlink()
  (run_dir / 'checkpoints').rename(run_dir / name)
  names, skipped = checkpoints.share(str(run_dir), str(tmp_path / 'shared'))
  assert name not in names
  assert [s for s in skipped if s.startswith(name)] == [
      f'{name} (a directory, where a run writes a file)']
  shared = tmp_path / 'shared'
  assert not (shared / name).exists()
  for path in shared.rglob('*'):
    assert not path.is_file() or path.read_bytes() != secret, path


def test_share_run_copies_no_file_of_another_user(tmp_path):
  """A file another user owns (planted while the run directory was open to
  them; it stays theirs after the owner's chmod go-w) is theirs to write:
  here a config.json that says the DP run had no noise, so that its
  TensorBoard files stamped with the times of writing (the withheld round
  seconds) would be shared. Training refuses such a file; share_run leaves
  it out and names it, counts the run as noised (its configuration unread)
  and leaves out the clocked events. Oracle: `os.stat`'s owner, and each
  event's wall_time read back with TensorBoard's protocol buffers."""
  _as_root_only('A file of another owner')
  from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
  from tensorboard.summary.writer import record_writer  # pylint: disable=g-import-not-at-top
  run_dir = tmp_path / 'run'
  _dp_run_to_share(run_dir)
  (run_dir / 'tensorboard').mkdir(mode=0o755)
  clocked = run_dir / 'tensorboard' / 'events.out.tfevents.1700000000.host'
  with open(clocked, 'wb') as f:
    writer = record_writer.RecordWriter(f)
    for step, seconds in ((1, 1700000000.0), (2, 1700000007.5)):
      writer.write(event_pb2.Event(step=step, wall_time=seconds)
                   .SerializeToString())
  os.chmod(clocked, 0o644)
  (run_dir / 'config.json').unlink()
  (run_dir / 'config.json').write_text(json.dumps({'noise_multiplier': None}))
  os.chmod(run_dir / 'config.json', 0o644)
  os.chown(run_dir / 'config.json', 65534, 65534)
  assert os.stat(run_dir / 'config.json').st_uid == 65534
  names, skipped = checkpoints.share(str(run_dir), str(tmp_path / 'shared'))
  assert 'config.json' not in names
  assert any(s.startswith('config.json (') for s in skipped), skipped
  shared = tmp_path / 'shared'
  assert not (shared / 'config.json').exists()
  for path in (shared / 'tensorboard').rglob('*'):
    for record in run_records.tfrecords(str(path)):
      event = event_pb2.Event.FromString(record)
      assert event.wall_time == float(event.step), path


def test_share_run_never_writes_into_the_run_through_a_dot_dot(tmp_path):
  """`elsewhere/link/../shared`, `link` leading into the run's
  checkpoints/: the kernel follows `link`, then takes its target's parent,
  so the copy would land in the run directory, whose records it would
  change (refused when spelled plainly). `os.path.abspath` spells it
  `elsewhere/shared`: refused all the same, nothing written in the run.
  Oracle: the run directory's entries before and after (`os.listdir`)."""
  run_dir = tmp_path / 'run'
  _dp_run_to_share(run_dir)
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  (elsewhere / 'link').symlink_to(run_dir / 'checkpoints')
  destination = f'{elsewhere}/link/../shared'
  before = sorted(os.listdir(run_dir))
  with pytest.raises(run_records.RunRecordError,
                     match='inside the run directory'):
    checkpoints.share(str(run_dir), destination)
  assert sorted(os.listdir(run_dir)) == before
  assert sorted(os.listdir(elsewhere)) == ['link']


def test_a_blt_run_resumed_under_another_factorization_is_refused(
    tmp_path, monkeypatch):
  """BLT's parameters come out of scipy's optimizer, which another version
  may settle elsewhere: its checkpointed buffers would run on under other
  decays and scales than the rounds it released were accounted for. A run
  records the float32 parameters its noise runs and the sensitivity each
  participation is charged, and one resumed under any other is refused;
  a record made before the parameters were kept is let through."""
  from tff_clip.aggregation import blt  # pylint: disable=g-import-not-at-top
  from tff_clip.program import assembly  # pylint: disable=g-import-not-at-top
  config = _config(tmp_path, sampling='min_separation',
                   noise_mechanism='blt', bands=1, clients_per_round=3)
  current = assembly.resolved_choices(config, 0.5, 2410)
  factorization = config.noise.factorization
  assert current['noise_factorization'] == dict(
      buffer_decays=np.asarray(factorization.noise.buffer_decays,
                               np.float32).tolist(),
      output_scales=np.asarray(factorization.noise.output_scales,
                               np.float32).tolist(),
      participation_sensitivity=factorization.participation_sensitivity)
  os.makedirs(config.output_dir)
  recorded = dict(config.to_json(), resolved=current)
  run_records.write_json(os.path.join(config.output_dir, 'config.json'),
                         recorded)
  run_directory.check_resolved(config, current)  # The same: resumes.
  # Another optimum: the last output scale one float32 ulp higher.
  scales = np.asarray(factorization.noise.output_scales, np.float32)
  scales[-1] = np.nextafter(scales[-1], np.float32(np.inf))
  other = dataclasses.replace(factorization, noise=dataclasses.replace(
      factorization.noise, output_scales=scales))
  monkeypatch.setattr(blt, '_run_factorization', lambda *args: other)
  elsewhere = assembly.resolved_choices(config, 0.5, 2410)
  before = _files(pathlib.Path(config.output_dir))
  with pytest.raises(training.ConfigError) as error:
    run_directory.check_resolved(config, elsewhere)
  assert 'noise_factorization=' in str(error.value)
  assert 'nothing was changed' in str(error.value)
  assert _files(pathlib.Path(config.output_dir)) == before
  del recorded['resolved']['noise_factorization']  # An older record.
  run_records.write_json(os.path.join(config.output_dir, 'config.json'),
                         recorded)
  run_directory.check_resolved(config, elsewhere)
