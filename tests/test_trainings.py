"""Specification: a benchmark's trainings side by side (`scripts.trainings`).

`run_all` returns one result per configuration, in their order, whichever
worker ran it; consecutive configurations of one group run one after
another in one worker process (they share what a process keeps of one
mechanism: its rounds' epsilons, its traced graphs).
"""

import os
import types

from scripts import trainings


def _pid_and_name(config):
  """A training's stand-in: (the worker's pid, the run's name)."""
  return float(os.getpid()), config.experiment_name


def test_a_groups_trainings_run_in_one_worker_and_come_back_in_order():
  names = [f'run{i}' for i in range(7)]
  configs = [types.SimpleNamespace(experiment_name=n) for n in names]
  groups = ['a', 'a', 'a', 'b', 'b', 'c', 'a']  # The last 'a' is its own.
  results = trainings.run_all(configs, 2, 'test', groups=groups,
                              train_fn=_pid_and_name)
  assert [name for _, name in results] == names
  pids = [pid for pid, _ in results]
  assert pids[0] == pids[1] == pids[2] and pids[3] == pids[4]
  assert os.getpid() not in pids and len(set(pids)) <= 2


def test_without_groups_each_training_is_its_own_and_one_job_runs_here():
  configs = [types.SimpleNamespace(experiment_name=f'run{i}')
             for i in range(3)]
  assert trainings._groups(configs, range(3)) == [  # pylint: disable=protected-access
      (i, [c]) for i, c in enumerate(configs)]
  results = trainings.run_all(configs, 1, 'test', train_fn=_pid_and_name)
  assert results == [(float(os.getpid()), f'run{i}') for i in range(3)]


def _withheld(config):
  """A DP run on a task whose test data is its clients' own: summary.json's
  final_eval_accuracy is None (the evaluation is withheld)."""
  return None, 2.0


def test_a_withheld_accuracy_is_reported_as_withheld(capsys):
  configs = [types.SimpleNamespace(experiment_name='dp_run')]
  assert trainings.run_all(configs, 1, 'test', train_fn=_withheld) == [
      (None, 2.0)]
  assert capsys.readouterr().out == '[test 1/1] dp_run: withheld\n'
