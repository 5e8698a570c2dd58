"""Specification: what a DP run keeps secret stays secret while it runs.

* TFF's tree baseline (`--bounding=tff_tree_adaptive`) draws its noise seed
  from OS entropy, like tff_clip's own mechanisms: tensorflow-privacy's tree
  generator, left unseeded, seeds itself from the clock (`floor(time * 1e6)`),
  which a run's file times give away.
* The console shows what a DP round releases and nothing else: no clients'
  training loss, no seconds per round (the round's time grows with its
  cohort), unless `release_uncovered_metrics` says otherwise.
"""

import dataclasses
import json
import re
import time

import numpy as np
import pytest

from scripts import program
from tff_clip.program import training

TREE = training.TrainConfig(
    bounding='tff_tree_adaptive', clip_norm='adaptive',
    noise_mechanism='tree', sampling='min_separation', min_separation=2,
    bands=2, rounds=2, clients_per_round=4, eval_every=2, seed=1,
    progress=False, experiment_name='tree')


def _int64_leaves(run_dir):
  """Every int64 value in the run's checkpoints."""
  values = []
  for path in sorted((run_dir / 'checkpoints').iterdir()):
    with np.load(path) as data:
      for name in data.files:
        if name.startswith('leaf_') and data[name].dtype == np.int64:
          values.extend(data[name].ravel().tolist())
  return values


@pytest.fixture(scope='module')
def tree_runs(tmp_path_factory):
  """Two tff_tree_adaptive runs with one seed, and the microseconds they ran."""
  root = tmp_path_factory.mktemp('tree')
  runs = []
  for name in ('a', 'b'):
    start = time.time()
    program.run(dataclasses.replace(TREE, root_output_dir=str(root),
                                    experiment_name=name))
    runs.append((root / name, start, time.time()))
  return runs


def test_tff_tree_noise_seed_is_not_the_clock(tree_runs):
  """No int64 in the checkpoint lies in the run's time span in microseconds.

  TFF's unseeded generator puts floor(time * 1e6) there. A secret key falls
  in the window (a few seconds: ~1e7 of 2^64 values) with chance < 1e-11.
  """
  for run_dir, start, end in tree_runs:
    values = _int64_leaves(run_dir)
    assert values
    window = (int(start * 1e6) - 10**6, int(end * 1e6) + 10**6)
    assert not [v for v in values if window[0] <= v <= window[1]]


def test_tff_tree_runs_with_one_seed_draw_different_noise_keys(tree_runs):
  """Two runs of one configuration in one process: their keys differ
  (a key baked into a cached trace would repeat)."""
  (a, _, _), (b, _, _) = tree_runs
  assert _int64_leaves(a) != _int64_leaves(b)


def test_tff_tree_run_is_labelled_secret(tree_runs):
  run_dir, _, _ = tree_runs[0]
  noise = json.loads((run_dir / 'summary.json').read_text())['noise']
  assert 'secret' in noise and 'not checked' not in noise


# ----------------------------------------------------------------------------
# The console under DP.

# The tree runs' configuration, but for how long they run and how often they
# evaluate: these runs reuse their build (`assembly.session`).
CONSOLE = dataclasses.replace(TREE, rounds=2, eval_every=1,
                             experiment_name='console')


@pytest.mark.parametrize('progress', [True, False])
def test_dp_console_shows_only_released_values(tmp_path, capsys, progress):
  program.run(dataclasses.replace(CONSOLE, root_output_dir=str(tmp_path),
                                  progress=progress))
  console = capsys.readouterr()
  shown = console.out + console.err
  # Released: shown, epsilon with its accountant and delta.
  assert 'acc=' in shown and re.search(r'eps\S* .*\((PLD|RDP), delta ', shown)
  assert 'loss=' not in shown  # The clients' training loss: withheld.
  assert 'round/s' not in shown and 's/round' not in shown  # Timings.
  assert '00:0' not in shown  # tqdm's elapsed and remaining times.


def test_uncovered_metrics_on_the_console_when_released(tmp_path, capsys):
  program.run(dataclasses.replace(CONSOLE, root_output_dir=str(tmp_path),
                                  progress=False,
                                  release_uncovered_metrics=True))
  assert 'loss=' in capsys.readouterr().out
