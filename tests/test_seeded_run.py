"""Specification of a seeded DP run: labelled, reproducible, resumable.

The default suite's cases of what `tests/test_training.py` checks at length
in its slow tests, on one small seeded run of `training.run` (digits,
adaptive normalization, 2 rounds, `noise_seed` set):

* a run with `noise_seed` says it is NOT private, in `summary.json` and
  `ledger.json` (whoever knows the seed knows the noise);
* a second run of the same configuration in the process reuses the build and
  releases the same rounds (seeded noise is a function of the seed alone);
* what a run releases does not depend on what the process trained before
  (a sweep's earlier trainings at other seeds);
* a run killed with SIGKILL after its first released round (a real kill -9
  of `scripts.train`: no handler, no `finally`) resumes, here, to the
  uninterrupted run's releases and exactly its ledger.
"""

import csv
import json

import numpy as np
import pytest

import tensorflow as tf

from scripts import program
from tff_clip.program import assembly
from tff_clip.program import plotting
from tff_clip.program import training
import as_a_user  # pylint: disable=g-bad-import-order

SEEDED = dict(rounds=2, clients_per_round=6, eval_every=2, seed=3,
              noise_seed=11, progress=False)
CLI_FLAGS = ['--rounds=2', '--clients_per_round=6', '--eval_every=2',
             '--seed=3', '--noise_seed=11', '--progress=false']
# What is a function of seeds and counts alone is equal to the bit; losses
# and accuracies up to the order in which TF's kernels add (see
# tests/test_training.py).
EXACT = ('round', 'clip_norm', 'epsilon')


def _rows(run_dir):
  with open(run_dir / 'metrics.csv', newline='') as f:
    return list(csv.DictReader(f))


def _assert_same_rows(rows_a, rows_b):
  assert [r['round'] for r in rows_a] == [r['round'] for r in rows_b]
  for a, b in zip(rows_a, rows_b):
    assert set(a) == set(b)
    for key in a:
      tolerance = (dict(rtol=0) if key in EXACT or key.startswith(
          'epsilon_') else
                   dict(rtol=0, atol=0.015) if 'accuracy' in key else
                   dict(rtol=2e-3))
      np.testing.assert_allclose(float(a[key]), float(b[key]),
                                 err_msg=f'round {a["round"]}, {key}',
                                 **tolerance)


def _config(root, name):
  return training.TrainConfig(root_output_dir=str(root), experiment_name=name,
                              **SEEDED)


@pytest.fixture(scope='module')
def root(tmp_path_factory):
  return tmp_path_factory.mktemp('seeded')


@pytest.fixture(scope='module')
def straight(root):
  """The uninterrupted seeded run: (summary, run directory)."""
  return program.run(_config(root, 'straight')), root / 'straight'


def test_seeded_run_says_it_is_not_private(straight):
  """Every figure of epsilon it shows is labelled NOT private, and the
  meaning of a guarantee it does not have is never printed."""
  summary, run_dir = straight
  ledger = json.loads((run_dir / 'ledger.json').read_text())
  for noise in (summary['noise'], ledger['noise']):
    assert 'NOT private' in noise
  key = 'epsilon_NOT_PRIVATE_pld_delta_1e-05'
  # summary.json and ledger.json.
  assert summary['private'] is False and ledger['private'] is False
  assert 'NOT private' in summary['not_private']
  assert 'NOT private' in ledger['not_private']
  assert summary['epsilon_label'].endswith('NOT private (seeded noise)')
  # metrics.csv (its header), releases.jsonl (each row), TensorBoard (tag).
  assert [k for k in _rows(run_dir)[0] if 'epsilon' in k] == [key]
  for line in (run_dir / 'releases.jsonl').read_text().splitlines():
    row = json.loads(line)['row']
    assert [k for k in row if 'epsilon' in k] == [key]
  tags = set()
  for path in (run_dir / 'tensorboard').rglob('events.out.tfevents.*'):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      tags.update(v.tag for v in event.summary.value)
  assert [t for t in tags if 'epsilon' in t] == [key]
  # The plot's panel and the end-of-run lines.
  assert plotting.epsilon_axis_label(key) == (
      'epsilon (PLD, delta 1e-05) NOT private')
  end = program.format_summary(summary)
  assert 'Meaning' not in end and 'no observer can raise' not in end
  for line in end.splitlines():
    if 'epsilon' in line and 'covered by' not in line:
      assert 'NOT private' in line, line


def test_same_seeded_configuration_releases_the_same_rounds(straight, root):
  _, run_dir = straight
  built = len(assembly._sessions)  # pylint: disable=protected-access
  program.run(_config(root, 'again'))
  assert len(assembly._sessions) == built  # Reused: nothing was rebuilt.  # pylint: disable=protected-access
  _assert_same_rows(_rows(run_dir), _rows(root / 'again'))


def test_a_run_releases_the_same_after_another_seeds_run(straight, root):
  # A sweep trains seeds one after the other in one process; whatever an
  # earlier training set (TensorFlow's global seed among it), the same
  # configuration releases the same rounds.
  _, run_dir = straight
  other = dict(SEEDED, seed=4)
  program.run(training.TrainConfig(root_output_dir=str(root),
                                   experiment_name='other_seed', **other))
  tf.random.set_seed(99)  # As a model drawn under its seed would leave it.
  program.run(_config(root, 'after_other'))
  tf.random.set_seed(None)
  # Equal to the bit: the same session runs the same batches (a global
  # seed that reached the shuffles moved the loss by 1e-3 and more).
  assert _rows(root / 'after_other') == _rows(run_dir)


def test_killed_run_resumes_to_the_uninterrupted_runs_releases(
    straight, root, capsys):
  """kill -9 once round 1 is released; the same run resumed here trains
  round 2 only, and its rows and ledger are the uninterrupted run's."""
  _, run_dir = straight
  as_a_user.kill_at(as_a_user.start(
      ['-m', 'scripts.train', *CLI_FLAGS, f'--root_output_dir={root}',
       '--experiment_name=killed']), 'round 1/2')
  killed = root / 'killed'
  assert [r['round'] for r in _rows(killed)] in (['1'], ['1', '2'])
  assert list((killed / 'checkpoints').iterdir())
  capsys.readouterr()

  summary = program.run(_config(root, 'killed'))
  output = capsys.readouterr().out
  assert 'Resuming' in output and 'round 1/2' not in output, output
  # The per-round line of the round it trained: NOT private.
  assert 'round 2/2' in output
  for line in output.splitlines():
    if line.startswith('round '):
      assert 'epsilon' in line and 'NOT private' in line, line
  assert not list((killed / 'checkpoints').glob('*tmp*'))
  _assert_same_rows(_rows(run_dir), _rows(killed))
  ledger, resumed = (json.loads((d / 'ledger.json').read_text())
                     for d in (run_dir, killed))
  assert resumed['ledger'] == ledger['ledger']
  assert resumed['epsilon_per_round'] == ledger['epsilon_per_round']
  assert summary['epsilon'] == ledger['epsilon_per_round'][-1][1]
