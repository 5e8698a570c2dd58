"""Specification: damage to a run directory's files is answered in one line,
in bounded time, and never releases or re-trains a round.

A run directory built by hand (no training): `config.json` as a run writes
it and `releases.jsonl` with DP events, then the damage a kill, a disk or an
edit could leave. Oracles: dp_accounting's own accountants, and the file
system state itself.
"""

import dataclasses
import json
import os

import dp_accounting
import pytest
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.summary.writer import record_writer

from tff_clip import checks
from tff_clip.privacy import privacy_ledger
from tff_clip.program import checkpoints
from tff_clip.program import run_directory
from tff_clip.program import run_records
from tff_clip.program import training

EVENT = dp_accounting.PoissonSampledDpEvent(
    0.1, dp_accounting.GaussianDpEvent(1.0))
EPSILON_KEY = 'epsilon_pld_delta_1e-05'


def _config(root, **changes):
  return dataclasses.replace(
      training.TrainConfig(rounds=5, clients_per_round=6, seed=3,
                           progress=False, experiment_name='run'),
      root_output_dir=str(root), **changes)


def _dp_run(root, released=2, **changes):
  """A DP run directory whose log lists rounds 1..`released`."""
  config = _config(root, **changes)
  assert config.private
  run_directory.prepare_output_dir(config)
  log = run_records.ReleaseLog(config.output_dir)
  for round_num in range(1, released + 1):
    log.append(round_num, {'round': round_num, EPSILON_KEY: 0.1 * round_num},
               privacy_ledger.event_to_dict(EVENT))
  return config


def _tensorboard_step(run_dir, step):
  os.makedirs(os.path.join(run_dir, 'tensorboard'))
  path = os.path.join(run_dir, 'tensorboard', 'events.out.tfevents.1.0.x')
  with open(path, 'wb') as f:
    writer = record_writer.RecordWriter(f)
    writer.write(event_pb2.Event(step=step, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag='round', simple_value=step)])
    ).SerializeToString())


# Each writes a file that claims round `r` was released.
CLAIMS = {
    'metrics.csv': lambda d, r: open(os.path.join(d, 'metrics.csv'), 'w').write(
        f'round,{EPSILON_KEY}\n1,0.1\n{r},0.2\n'),
    'summary.json': lambda d, r: open(os.path.join(d, 'summary.json'),
                                      'w').write(json.dumps({'rounds': r})),
    'ledger.json': lambda d, r: open(os.path.join(d, 'ledger.json'),
                                     'w').write(json.dumps(
                                         {'epsilon_per_round': [[r, 0.2]]})),
    'tensorboard': _tensorboard_step,
    'checkpoints': lambda d, r: (
        os.makedirs(os.path.join(d, 'checkpoints')),
        open(os.path.join(d, 'checkpoints', f'round_{r:06d}.npz'),
             'wb').write(b'damaged')),
}


@pytest.mark.parametrize('name', sorted(CLAIMS))
def test_a_round_no_run_can_reach_proves_no_release(tmp_path, name):
  """A round number beyond `checks.MAX_ROUNDS` (what no run's --rounds may
  exceed) is damage, not a release: it neither refuses the run nor is
  charged. (Charged, a round of 10^8 took the refusal hours: a ledger of
  10^8 rounds was built and accounted.)"""
  config = _dp_run(tmp_path)
  CLAIMS[name](config.output_dir, checks.MAX_ROUNDS + 1)
  run_directory.check_released(config)  # Rounds 1-2, as the log lists.


def test_a_damaged_view_still_proves_its_real_rounds(tmp_path):
  """Beside an impossible round, the file's possible ones still count: the
  refusal names them and charges exactly those rounds (dp_accounting's PLD
  accountant on the same events)."""
  config = _dp_run(tmp_path, released=1)
  with open(os.path.join(config.output_dir, 'metrics.csv'), 'w') as f:
    f.write(f'round,{EPSILON_KEY}\n1,0.1\n2,0.1\n3,0.1\n'
            f'{checks.MAX_ROUNDS + 1},0.1\n')
  with pytest.raises(run_records.RunRecordError) as refused:
    run_directory.check_released(config)
  from dp_accounting.pld import pld_privacy_accountant  # pylint: disable=g-import-not-at-top
  oracle = pld_privacy_accountant.PLDAccountant(
      value_discretization_interval=1e-4)
  oracle.compose(EVENT, 3)
  message = str(refused.value)
  assert 'rounds up to 3 were released' in message, message
  assert 'The 3 rounds released so far spent epsilon = ' in message, message
  reported = float(message.split('spent epsilon = ')[1].split()[0])
  assert reported == pytest.approx(oracle.get_epsilon(config.delta), rel=2e-3)

@pytest.mark.parametrize('leftover', ['.config.json.tmp',
                                      '.tff_clip_probe_k1ll3d', '.lock'])
def test_a_run_killed_at_its_first_write_starts_on_rerun(tmp_path, leftover):
  """Killed (or the power lost) while config.json, the first file, was
  written, or while the directory was probed for writing, or with the run's
  lock taken before config.json, a run directory holds only that leftover:
  the same command starts the run, and the leftover temporary file is
  replaced, not refused as another's."""
  config = _config(tmp_path)
  os.makedirs(config.output_dir)
  path = os.path.join(config.output_dir, leftover)
  if leftover == '.lock':
    with open(path, 'w') as f:
      f.write('4242')  # The killed holder's pid.
  elif leftover.endswith('.tmp'):
    with open(path, 'w') as f:
      f.write('{"task": "dig')  # Cut by the kill.
  else:
    os.mkdir(path)
  assert run_directory.existing_run(config) == 'new'
  run_directory.prepare_output_dir(config)
  assert not os.path.lexists(os.path.join(config.output_dir,
                                          '.config.json.tmp'))
  assert run_directory.existing_run(config) == 'resume'

def test_a_refused_share_leaves_nothing_behind(tmp_path):
  """share_run appears whole or not at all: refused on a checkpoint it will
  not open (a symbolic link in checkpoints/), it leaves no partial copy of
  the released files beside the destination."""
  config = _dp_run(tmp_path / 'runs')
  secret = tmp_path / 'elsewhere.npz'
  secret.write_bytes(b'not the run\'s')
  os.makedirs(os.path.join(config.output_dir, 'checkpoints'))
  os.symlink(secret, os.path.join(config.output_dir, 'checkpoints',
                                  'round_000002.npz'))
  target = tmp_path / 'shared'
  target.mkdir()
  before = sorted(os.listdir(target))
  with pytest.raises(run_records.RunRecordError, match='symbolic link'):
    checkpoints.share(config.output_dir, str(target / 'run'))
  assert sorted(os.listdir(target)) == before

@pytest.mark.parametrize('ledger', [
    {'ledger': [1]},
    {'ledger': {'groups': [{'event': 'x', 'round_nums': [1, 2, 3]}]}},
    {'ledger': {'groups': [{'event': {'type': 'GaussianDpEvent'},
                            'round_nums': [1, 2, 3]}]}},
    {'ledger': {'groups': [{'round_nums': 3}]}},
    {'epsilon_per_round': [[3]], 'ledger': {'groups': ['x']}},
])
def test_a_damaged_ledger_is_a_one_line_refusal(tmp_path, ledger):
  """A ledger.json that is JSON but not a ledger (damaged or hand-edited)
  is evidence of a release like any damaged file: a DP run whose log lost
  its rounds is refused in one line naming it, never with a traceback."""
  config = _dp_run(tmp_path, released=0)
  with open(os.path.join(config.output_dir, 'ledger.json'), 'w') as f:
    json.dump(ledger, f)
  with pytest.raises(run_records.RunRecordError, match='ledger.json shows'):
    run_directory.check_released(config)
