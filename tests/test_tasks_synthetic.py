"""Specification of the papers' synthetic problems as federated tasks."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tasks


@pytest.fixture(scope='module')
def heterogeneous():
  return tasks.get_task('heterogeneous_quadratic')


@pytest.fixture(scope='module')
def small_heterogeneous():
  """Das et al. 2022's problem with n=4 clients, d=6, rank 2: cheap to train."""
  return tasks.get_task('heterogeneous_quadratic', num_clients=4,
                        dimension=6, rank=2, train_batch_size=2)


def _fed_avg_one_step(task, client_learning_rate):
  """One round of weighted FedAvg, plain SGD, server learning rate 1."""
  process = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(
          client_learning_rate),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
  state = process.initialize()
  start = tasks.synthetic.as_vector(process.get_model_weights(state))
  data = [
      task.datasets.train_preprocess_fn(
          task.datasets.train_data.create_tf_dataset_for_client(cid))
      for cid in task.datasets.train_data.client_ids
  ]
  output = process.next(state, data)
  end = tasks.synthetic.as_vector(process.get_model_weights(output.state))
  return start, end, output.metrics


def test_heterogeneous_quadratic_has_the_papers_sizes(heterogeneous):
  problem = heterogeneous.problem
  client = heterogeneous.datasets.train_data.create_tf_dataset_for_client(
      heterogeneous.datasets.train_data.client_ids[0])
  assert heterogeneous.num_clients == 100
  assert problem.dimension == 200
  assert problem.client_optima.shape == (100, 200)
  assert len(list(client)) == 20  # A_i is 200 x 20: one term per column.


def test_heterogeneous_quadratic_optimum_has_zero_gradient(heterogeneous):
  problem = heterogeneous.problem
  scale = np.linalg.norm(problem.gradient(np.zeros(problem.dimension)))
  assert np.linalg.norm(problem.gradient(problem.optimum)) < 1e-9 * scale


def test_heterogeneous_quadratic_optimum_solves_the_papers_equation(
    heterogeneous):
  problem = heterogeneous.problem
  # Q_i = A_i A_i^T; the features of client i are the columns of A_i.
  q = [a.T @ a for a in problem.features]
  expected = np.linalg.solve(
      sum(q), sum(qi @ wi for qi, wi in zip(q, problem.client_optima)))
  np.testing.assert_allclose(problem.optimum, expected, rtol=1e-6, atol=1e-6)


def test_heterogeneous_quadratic_objective_is_the_mean_of_client_objectives(
    heterogeneous):
  problem = heterogeneous.problem
  w = np.random.default_rng(0).standard_normal(problem.dimension)
  mean = np.mean([0.5 * (w - wi) @ (a.T @ a) @ (w - wi)
                  for a, wi in zip(problem.features, problem.client_optima)])
  assert problem.objective(w) == pytest.approx(mean, rel=1e-4)


def test_excess_loss_is_zero_at_the_optimum_and_positive_elsewhere(
    heterogeneous):
  problem = heterogeneous.problem
  w = problem.optimum + 0.1
  assert problem.excess_loss(problem.optimum) == pytest.approx(0.0, abs=1e-12)
  assert problem.excess_loss(w) == pytest.approx(
      problem.objective(w) - problem.optimal_value, rel=1e-6)
  assert problem.excess_loss(w) > 0


def test_heterogeneous_quadratic_starts_at_optimum_plus_uniform_offset(
    heterogeneous):
  with tf.Graph().as_default():
    model = heterogeneous.model_fn()
    start = model.trainable_variables[0].initial_value
    with tf.compat.v1.Session() as session:
      start = session.run(start).reshape(-1)
  offset = start - heterogeneous.problem.optimum
  assert np.all(offset > -1e-5) and np.all(offset < 1 + 1e-5)  # z ~ U(0, 1).


def test_fed_avg_round_is_an_exact_gradient_step_on_the_mean_objective(
    small_heterogeneous):
  # Each client's batch holds all its terms, so one local SGD step is
  # w - lr * grad f_i(w); averaging over equal clients gives grad f.
  problem = small_heterogeneous.problem
  start, end, _ = _fed_avg_one_step(small_heterogeneous, 0.1)
  np.testing.assert_allclose(end, start - 0.1 * problem.gradient(start),
                             rtol=1e-4, atol=1e-5)


def test_claim21_optimum_is_k_minus_one_c_over_three():
  task = tasks.get_task('claim21_quadratic', clip_threshold=2.0,
                        target_multiple=6.0)
  assert task.problem.optimum[0] == pytest.approx((6.0 - 1.0) * 2.0 / 3.0)
  assert task.problem.gradient(task.problem.optimum)[0] == pytest.approx(
      0.0, abs=1e-12)


def test_claim21_clients_hold_b_minus_half_c_twice_and_k_c():
  task = tasks.get_task('claim21_quadratic', clip_threshold=1.0,
                        target_multiple=5.0)
  targets = sorted(float(t[0]) for t in task.problem.targets)
  assert targets == [-0.5, -0.5, 5.0]


def test_eq24_optimum_is_zero_with_gradient_41x():
  problem = tasks.get_task('eq24_quadratic').problem
  assert problem.optimum[0] == pytest.approx(0.0, abs=1e-12)
  assert problem.gradient([1.0])[0] == pytest.approx(41.0)
  assert problem.objective([1.0]) == pytest.approx(
      0.5 * (1 - 4) ** 2 + 0.5 * (2 - 1) ** 2 + 0.5 * (6 + 1) ** 2)


def test_eq24_fed_avg_round_is_a_gradient_step_on_the_client_average():
  task = tasks.get_task('eq24_quadratic', initial_weights=1.0)
  start, end, metrics = _fed_avg_one_step(task, 0.01)
  # f is a sum of 3 clients; FedAvg averages them: grad f / 3 = 41 x / 3.
  assert end[0] == pytest.approx(start[0] - 0.01 * 41.0 * start[0] / 3,
                                 rel=1e-5)
  assert metrics['client_work']['train']['num_examples'] == 3


def test_claim21_fed_avg_round_is_a_gradient_step_on_the_client_average():
  task = tasks.get_task('claim21_quadratic', clip_threshold=1.0,
                        target_multiple=5.0, initial_weights=0.0)
  start, end, _ = _fed_avg_one_step(task, 0.1)
  assert end[0] == pytest.approx(
      start[0] - 0.1 * task.problem.gradient(start)[0] / 3, rel=1e-5)


def test_wrong_client_count_for_a_three_client_problem_is_rejected():
  with pytest.raises(ValueError, match='exactly 3 clients'):
    tasks.get_task('eq24_quadratic', num_clients=4)


def test_fat_tailed_quadratic_optimum_is_zero_and_reports_squared_norm():
  problem = tasks.get_task('fat_tailed_quadratic').problem
  x = np.arange(10.0)
  assert problem.report_name == 'squared_norm'
  assert problem.report(x) == pytest.approx(x @ x)
  assert np.all(problem.optimum == 0)
  assert np.all(problem.gradient(problem.optimum) == 0)


def test_fat_tailed_quadratic_has_five_clients_by_default():
  assert tasks.get_task('fat_tailed_quadratic').num_clients == 5


def test_fat_tailed_model_loss_is_half_norm_squared_plus_inner_product():
  task = tasks.get_task('fat_tailed_quadratic', dimension=3,
                        examples_per_client=4, initial_weights=[1.0, 2.0, 3.0],
                        train_batch_size=4, shuffle_buffer_size=1)
  noise, labels = (t.numpy() for t in next(iter(
      task.datasets.train_preprocess_fn(
          task.datasets.train_data.create_tf_dataset_for_client('0')))))
  model = task.model_fn()  # Keep a reference: forward_pass holds a weakref.
  loss = model.forward_pass((noise, labels), training=False).loss
  x = np.array([1.0, 2.0, 3.0])
  expected = np.mean(0.5 * x @ x + noise @ x)
  assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_fat_tailed_quadratic_trains_for_one_round():
  task = tasks.get_task('fat_tailed_quadratic', num_clients=2,
                        examples_per_client=8, train_batch_size=4)
  start, end, metrics = _fed_avg_one_step(task, 0.01)
  assert metrics['client_work']['train']['num_examples'] == 16
  assert np.all(np.isfinite(end)) and not np.array_equal(start, end)


@pytest.mark.parametrize('noise,tail_index', [('cauchy', None),
                                              ('student_t', 1.5),
                                              ('stable', 0.5)])
def test_fat_tailed_noise_has_heavy_tails(noise, tail_index):
  samples = tasks.synthetic.sample_noise(noise, tail_index, 20000,
                                         np.random.default_rng(0))
  # Gaussian: P(|x| > 10) ~ 1e-23. Fat tails (index <= 1.5): > 0.1%.
  assert np.mean(np.abs(samples) > 10) > 1e-3


def test_cauchy_noise_with_another_tail_index_is_rejected():
  with pytest.raises(ValueError, match='Cauchy noise has tail index 1'):
    tasks.get_task('fat_tailed_quadratic', tail_index=1.5)


@pytest.mark.parametrize('noise,tail_index', [('student_t', 0.0),
                                              ('stable', 2.5),
                                              ('stable', -1.0)])
def test_invalid_tail_index_is_rejected(noise, tail_index):
  with pytest.raises(ValueError, match='`tail_index`'):
    tasks.get_task('fat_tailed_quadratic', noise=noise, tail_index=tail_index)


def test_unknown_noise_is_rejected():
  with pytest.raises(ValueError, match="Unknown `noise` 'gaussian'"):
    tasks.get_task('fat_tailed_quadratic', noise='gaussian')


def test_as_vector_accepts_model_weights_lists_and_arrays():
  weights = tff.learning.models.ModelWeights(
      trainable=[np.ones((2, 1)), np.zeros(1)], non_trainable=[])
  assert tasks.synthetic.as_vector(weights).tolist() == [1.0, 1.0, 0.0]
  assert tasks.synthetic.as_vector(np.eye(2)).shape == (4,)
