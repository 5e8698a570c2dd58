"""Specification of `scripts.benchmark_round`'s generated population
(`GeneratedQuadraticClients`): Das et al.'s heterogeneous-quadratic clients,
each generated when sampled, so a population of any size is never held."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tasks import synthetic
from scripts import program
from tff_clip.program import training

STACKOVERFLOW_USERS = 342_477
REPO = pathlib.Path(__file__).resolve().parents[1]


def _rss() -> int:
  with open('/proc/self/status') as f:
    return next(int(line.split()[1]) * 1024 for line in f
                if line.startswith('VmRSS:'))


def _client(data, client_id):
  return next(iter(data.create_tf_dataset_for_client(client_id).batch(1000)))


def test_a_generated_population_of_any_size_is_not_held():
  before = _rss()
  clients = synthetic.GeneratedQuadraticClients(STACKOVERFLOW_USERS)
  assert len(clients.client_ids) == STACKOVERFLOW_USERS
  assert clients.client_ids[-1] == '342476'
  # Building the population whole took 21 GiB; the ids are computed.
  assert _rss() - before < 64 * 2**20


def test_a_client_is_the_quadratic_tasks_client_shape_and_law():
  config = training.TrainConfig(task='heterogeneous_quadratic',
                                num_clients=10)
  task = program.build_task(config)
  clients = synthetic.GeneratedQuadraticClients(STACKOVERFLOW_USERS)
  # The model and preprocessing of the task read it as their own data.
  assert clients.element_type_structure == (
      task.datasets.train_data.element_type_structure)
  first = _client(clients, '000123')
  features = first['features'].numpy()
  assert features.shape == (20, 200)
  # Das et al.: entries N(0, 1/20^2); 4,000 of them put the sample std
  # within 5% (about 4.5 standard errors).
  assert abs(np.std(features) - 1 / 20) < 0.05 / 20
  # A pure function of (seed, id): the same client again, another differs.
  tf.nest.map_structure(np.testing.assert_array_equal, first,
                        _client(synthetic.GeneratedQuadraticClients(1_000), '123'))
  other = _client(clients, '000124')['features'].numpy()
  assert not np.array_equal(features, other)
  reseeded = _client(synthetic.GeneratedQuadraticClients(1_000, seed=1), '123')
  assert not np.array_equal(features, reseeded['features'].numpy())


@pytest.mark.slow  # 20 s: a benchmark's own check, not the library's.
def test_each_runner_times_its_own_path():
  # `inprocess` rounds run tff_clip's in-process runner client by client,
  # `batched` ones the batched cohort call, `local` TFF's C++ runtime (a
  # runner bound to another's path would time the wrong thing).
  code = '''
from absl import flags
from scripts import benchmark_round as b
from tff_clip.runtime import batched_clients, simulation
flags.FLAGS(['x', '--runners=inprocess,batched,local', '--rounds=2',
             '--clients_per_round=2'])
calls = []
for cls in (simulation.InProcessRunner, batched_clients.BatchedRunner):
  def next_(self, *args, _next=cls.next, _name=cls.__name__):
    calls.append(_name)
    return _next(self, *args)
  cls.next = next_
result = b._bench_task('digits', True)
assert sorted(result) == ['batched', 'inprocess', 'local'], result
print(sorted(calls))
'''
  done = subprocess.run([sys.executable, '-c', code], cwd=REPO,
                        env=dict(os.environ, PYTHONPATH=str(REPO)),
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  # Two rounds each; the local runner calls neither.
  assert done.stdout.split('\n')[-2] == (
      "['BatchedRunner', 'BatchedRunner', 'InProcessRunner', "
      "'InProcessRunner']"), done.stdout[-500:]
