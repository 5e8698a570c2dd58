"""A DP run releases no evaluation computed on its clients' training data.

The synthetic least-squares problems evaluate f(w) on every client's own
examples (their test data is the clients' data), and the fat-tailed
quadratic on the clients' draws: under DP that evaluation depends on
private data, as the withheld objective does. Such a task says so
(`Task.evaluates_on_training_data`) and a DP run withholds its evaluation
unless --release_uncovered_metrics. Oracle: the examples themselves (the
test data shares examples with the clients' data exactly where the task
says so).
"""

import csv
import json

import numpy as np
import pytest

from scripts import program
from tff_clip.program import program_logic
from tff_clip.program import training


def _examples(dataset):
  return {tuple(tuple(np.asarray(leaf).ravel().tolist())
                for leaf in (tuple(example.values())
                             if isinstance(example, dict) else example))
          for example in dataset}


@pytest.mark.parametrize('task, num_clients', [
    ('claim21_quadratic', None), ('eq24_quadratic', None),
    ('heterogeneous_quadratic', 4), ('fat_tailed_quadratic', 3),
    ('digits', 5)])
def test_a_task_says_whether_its_test_data_is_its_clients_data(task,
                                                               num_clients):
  built = program.build_task(training.TrainConfig(task=task,
                                                  num_clients=num_clients))
  evaluated = _examples(built.datasets.test_data)
  trained = set()
  for client in built.datasets.train_data.client_ids:
    trained |= _examples(
        built.datasets.train_data.create_tf_dataset_for_client(client))
  assert bool(evaluated & trained) == built.evaluates_on_training_data


def test_a_dp_run_withholds_an_evaluation_of_its_clients_data(tmp_path):
  config = training.TrainConfig(
      root_output_dir=str(tmp_path), task='claim21_quadratic', rounds=2,
      clients_per_round=3, noise_multiplier=1.0, clip_norm=1.0,
      sampling='fixed_size', eval_every=1, progress=False, plot=False,
      experiment_name='dp')
  program.run(config)
  with open(tmp_path / 'dp' / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 2 and all('eval_loss' not in row for row in rows)
  released = (tmp_path / 'dp' / 'releases.jsonl').read_text()
  assert 'eval_loss' not in released and 'eval_accuracy' not in released
  summary = json.loads((tmp_path / 'dp' / 'summary.json').read_text())
  assert summary['final_eval_loss'] is None  # JSON's NaN.
  # Released on request, and then named as not covered.
  task = program.build_task(config)
  released_metric = program_logic.released_metric(
      True, True, program_logic.not_covered(task))
  assert released_metric(('eval_loss',))
  assert set(program_logic.EVALUATION) <= set(
      program_logic.not_covered(task))
