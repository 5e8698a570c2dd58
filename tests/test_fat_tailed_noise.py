"""Specification: Yang et al. 2022's fat-tailed quadratic draws fresh noise.

Yang et al., Sec. 5.1: f_i(x) = E_xi[1/2 ||x||^2 + <xi, x>]; every local
stochastic gradient x + xi uses a new xi. Reusing a fixed sample would train
the finite sum with optimum -mean(xi), which for Cauchy noise is itself
standard-Cauchy distributed (the mean of n Cauchy variables is Cauchy), so
||x*||^2 would be O(d), not 0.
"""

import numpy as np
import pytest
from scipy import stats

import tasks
from tff_clip.runtime import client_data


@pytest.fixture(scope='module')
def task():
  return tasks.get_task('fat_tailed_quadratic', dimension=4,
                        examples_per_client=50)


def _noise(dataset):
  return np.stack([e['noise'].numpy() for e in dataset])


def test_round_data_is_a_function_of_the_seed_alone(task):
  np.testing.assert_array_equal(_noise(task.round_train_data('0', 7)),
                                _noise(task.round_train_data('0', 7)))


def test_every_round_and_client_gets_new_noise(task):
  a = _noise(task.round_train_data('0', 7))
  assert a.shape == (50, 4)
  assert not np.any(a == _noise(task.round_train_data('0', 8)))
  assert not np.any(a == _noise(task.round_train_data('1', 7)))


def test_training_loop_draws_each_round_afresh(task):
  clients = client_data.ClientDatasets(task, seed=0)
  def samples(round_num):
    batches = clients.dataset('0', round_num)
    return np.sort(np.concatenate([x.numpy() for x, _ in batches]), axis=None)
  first, again, second = samples(1), samples(1), samples(2)
  # The same samples (the loop's eager shuffle may order them differently).
  np.testing.assert_array_equal(first, again)
  assert first.size == 200 and not np.any(np.isin(first, second))


@pytest.mark.slow
def test_noise_over_rounds_is_centred_at_the_true_optimum(task):
  # Median of N standard Cauchy draws: asymptotic std pi / (2 sqrt(N)).
  pooled = np.concatenate(
      [_noise(task.round_train_data('0', seed)) for seed in range(200)])
  n = pooled.shape[0]
  assert np.all(np.abs(np.median(pooled, axis=0)) < 5 * np.pi / (2 * np.sqrt(n)))
  # And it is Cauchy: a KS test against scipy's law does not reject it.
  assert stats.kstest(pooled[:, 0], stats.cauchy.cdf).pvalue > 1e-3
