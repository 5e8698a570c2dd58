"""A DP run releases no evaluation computed on its clients' training data.

The synthetic least-squares problems evaluate f(w) on every client's own
examples (their test data is the clients' data), the fat-tailed quadratic
on the clients' draws, and the tasks on TFF's synthetic data sets (EMNIST,
Shakespeare, CIFAR-100, Stack Overflow) on the very data their clients hold: under DP that evaluation depends on
private data, as the withheld objective does. Such a task says so
(`Task.evaluates_on_clients_data`) and a DP run withholds its evaluation
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
  if hasattr(dataset, 'create_tf_dataset_from_all_clients'):  # ClientData.
    dataset = dataset.create_tf_dataset_from_all_clients()
  return {tuple(tuple(np.asarray(leaf).ravel().tolist())
                for leaf in (tuple(example.values())
                             if isinstance(example, dict) else example))
          for example in dataset}


@pytest.mark.parametrize('task, num_clients, data_source', [
    ('claim21_quadratic', None, 'offline'), ('eq24_quadratic', None, 'offline'),
    ('heterogeneous_quadratic', 4, 'offline'),
    ('fat_tailed_quadratic', 3, 'offline'), ('digits', 5, 'offline'),
    ('shakespeare', None, 'offline'),
    # TFF's synthetic data sets: the same clients train and test.
    ('emnist_logreg', None, 'synthetic'), ('shakespeare', None, 'synthetic'),
    ('cifar100_resnet18', None, 'offline'),
    ('stackoverflow_tag', None, 'offline'),
    ('stackoverflow_next_word', None, 'offline')])
def test_a_task_says_whether_its_test_data_is_its_clients_data(
    task, num_clients, data_source):
  built = program.build_task(training.TrainConfig(
      task=task, num_clients=num_clients, data_source=data_source))
  datasets = built.datasets
  evaluation = [data for data in (datasets.test_data, datasets.validation_data)
                if data is not None]
  # The training clients' held-out data (Shakespeare's test speeches are
  # other speeches of the training roles) ...
  shared = any(set(getattr(data, 'client_ids', ())) &
               set(datasets.train_data.client_ids) for data in evaluation)
  if not shared:  # ... or their very examples.
    evaluated = set().union(*map(_examples, evaluation))
    trained = set()
    for client in datasets.train_data.client_ids:
      trained |= _examples(datasets.train_data.create_tf_dataset_for_client(
          client))
    shared = bool(evaluated & trained)
  assert shared == built.evaluates_on_clients_data


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
  assert summary['evaluation_withheld'] is True
  assert 'final eval accuracy: withheld' in program.format_summary(summary)
  # Released on request, and then named as not covered.
  task = program.build_task(config)
  released_metric = program_logic.released_metric(
      True, True, program_logic.not_covered(task))
  assert released_metric(('eval_loss',))
  assert set(program_logic.EVALUATION) <= set(
      program_logic.not_covered(task))


def test_a_task_that_does_not_say_where_it_evaluates_has_its_evaluation_withheld():
  """A TFF baseline task (no `evaluates_on_clients_data`) is taken to evaluate
  on its clients' data: TFF's synthetic EMNIST task tests on the very
  examples its training clients hold (the oracle: the examples themselves),
  and a DP run of it released that evaluation as covered by epsilon."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  task = tff.simulation.baselines.emnist.create_character_recognition_task(
      tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=4),
      model_id='cnn', only_digits=True, use_synthetic_data=True)
  assert not hasattr(task, 'evaluates_on_clients_data')
  datasets = task.datasets
  trained = _examples(datasets.train_data)
  assert _examples(datasets.test_data) & trained  # Its clients' own examples.
  released_metric = program_logic.released_metric(
      True, False, program_logic.not_covered(task))
  assert not released_metric(('eval_loss',))
  assert not released_metric(('eval_accuracy',))


def test_a_task_that_does_not_say_whose_its_test_data_is_cannot_be_built():
  # Fails closed: a builder that forgot to say would have released its
  # evaluation of the clients' data as covered by epsilon.
  from tasks import task as task_lib  # pylint: disable=g-import-not-at-top
  digits = program.build_task(training.TrainConfig(num_clients=5))
  with pytest.raises(TypeError, match='evaluates_on_clients_data'):
    task_lib.Task(digits.datasets, digits.model_fn, name='digits',
                  data_source='offline', model_description='',
                  data_description='')
