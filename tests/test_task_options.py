"""Specification of task options and per-layer LUS in the training program.

One syntax for every task: `--task_option=key=value`, repeatable, checked
against the task's own options (`tasks.task_options`) before training, with
an error naming the flag. Synthetic tasks report their objective, not a NaN
accuracy.
"""

import dataclasses
import json

import pytest

import tasks
from scripts import program
from tff_clip.program import config as config_lib
from tff_clip.program import flag_text
from tff_clip.program import training
import as_a_user  # pylint: disable=g-bad-import-order


def test_task_option_values_are_parsed_by_one_rule():
  assert flag_text.parse_task_options(
      ['noise=student_t', 'tail_index=1.5', 'dimension=3',
       'initial_weights=1,2.5,-3', 'text_path=none', 'flag=true']) == (
           ('noise', 'student_t'), ('tail_index', 1.5), ('dimension', 3),
           ('initial_weights', (1, 2.5, -3)), ('text_path', None),
           ('flag', True))


def test_task_option_without_equals_is_a_usage_error():
  with pytest.raises(config_lib.ConfigError, match='--task_option'):
    flag_text.parse_task_options(['tail_index'])


def test_task_options_are_the_builders_keyword_options():
  assert tasks.task_options('fat_tailed_quadratic') == (
      'dimension', 'noise', 'tail_index', 'noise_scale',
      'examples_per_client', 'initial_weights')
  assert 'offline_data' in tasks.task_options('emnist_cnn')
  assert tasks.task_options('digits') == ('hidden_units',)


@pytest.mark.parametrize('options,message', [
    ((('tail', 1.5),), "--task_option 'tail' is not an option of task "
                       "'fat_tailed_quadratic'; its options are: dimension"),
    ((('noise', 'cauchy'), ('noise', 'stable')), "'noise' is given twice"),
])
def test_unknown_or_repeated_task_option_is_rejected_naming_the_flag(
    options, message):
  config = training.TrainConfig(task='fat_tailed_quadratic',
                                task_options=options)
  with pytest.raises(training.ConfigError, match=message):
    program.validate(config)


@pytest.mark.parametrize('sparsity', [(0.5, 1.0), (-0.1,), 1.0, ()])
def test_lus_sparsity_outside_unit_interval_is_rejected(sparsity):
  with pytest.raises(training.ConfigError, match='--lus_sparsity'):
    program.validate(training.TrainConfig(lus_sparsity=sparsity))


def test_config_with_options_survives_its_json_round_trip():
  # A resumed run compares the stored config.json with the new config.
  config = training.TrainConfig(
      task='fat_tailed_quadratic', lus_sparsity=(0.1, 0.2),
      task_options=(('noise', 'stable'), ('initial_weights', (1.0, 2.0))))
  identity = config.identity()
  assert json.loads(json.dumps(identity)) == identity
  assert identity['task_options'] == {'noise': 'stable',
                                      'initial_weights': [1.0, 2.0]}


@pytest.mark.slow
def test_cli_passes_task_options_and_reports_the_objective(tmp_path):
  result = as_a_user.run(
      ['-m', 'scripts.train', '--task=fat_tailed_quadratic',
       '--task_option=noise=stable', '--task_option=tail_index=1.5',
       '--task_option=dimension=3', '--task_option=examples_per_client=4',
       '--bounding=none', '--noise_multiplier=none', '--clients_per_round=5',
       '--rounds=2', '--batch_size=2', '--client_learning_rate=0.01',
       '--progress=false', f'--root_output_dir={tmp_path}',
       '--experiment_name=run'], timeout=300)
  assert result.returncode == 0, result.stdout + result.stderr
  assert 'final objective (squared_norm): ' in result.stdout
  assert 'accuracy' not in result.stdout
  summary = json.loads((tmp_path / 'run' / 'summary.json').read_text())
  assert summary['objective_name'] == 'squared_norm'
  with open(tmp_path / 'run' / 'config.json') as f:
    assert json.load(f)['task_options'] == {
        'noise': 'stable', 'tail_index': 1.5, 'dimension': 3,
        'examples_per_client': 4}
  # ||x||^2 of the final x, as the per-round CSV has it.
  last = (tmp_path / 'run' / 'metrics.csv').read_text().splitlines()
  header, row = last[0].split(','), last[-1].split(',')
  assert float(row[header.index('objective')]) == pytest.approx(
      summary['final_objective'])


def test_runs_asking_for_the_same_task_share_one_build_and_others_do_not():
  # A sweep's or the frontier's runs (one process, one after another) differ
  # in hyperparameters, not in the task: they take the task built first. A
  # task flag that differs (the seed, which partitions the data; a task
  # option) builds its own.
  base = config_lib.TrainConfig(task='heterogeneous_quadratic',
                                num_clients=4, clients_per_round=2)
  first = program.build_task(base)
  assert program.build_task(dataclasses.replace(
      base, server_learning_rate=0.3, noise_multiplier=1.0)) is first
  reseeded = program.build_task(dataclasses.replace(base, seed=1))
  assert reseeded is not first
  optioned = program.build_task(dataclasses.replace(
      base, task_options=(('dimension', 3),)))
  assert optioned is not first and optioned is not reseeded
  assert optioned.datasets.element_type_structure != (
      first.datasets.element_type_structure)
