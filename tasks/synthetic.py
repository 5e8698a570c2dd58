"""The seed papers' synthetic problems, as trainable federated tasks.

Each task is a tiny Keras model whose only weight is the optimization variable
(w, or x) and client data sets that encode each client's objective, so
`tff.learning.algorithms.build_weighted_fed_avg(task.model_fn, ...)` trains
it like any other task. `task.problem` is the exact problem in numpy: its
`optimum`, `objective(weights)`, `gradient(weights)`, `excess_loss(weights)`
= f(w) - f(w*), and `report(weights)`, the quantity the paper plots
(`report_name`).

  * `heterogeneous_quadratic` -- Das et al., Sec. 5.3:
    f_i(w) = 1/2 (w - w_i*)^T Q_i (w - w_i*), f = (1/n) sum_i f_i, n = 100,
    d = 200, Q_i = A_i A_i^T with A_i 200 x 20, entries N(0, 1/20^2),
    w_i* ~ N(0, I); start w_0 = w* + z (I1) or w* + z/5 (I2), z ~ U(0, 1)^d.
    Reported: f(w) - f(w*), with w* solving (sum_i Q_i) w* = sum_i Q_i w_i*.
  * `fat_tailed_quadratic` -- Yang et al., Sec. 5.1:
    f(x, xi) = 1/2 ||x||^2 + <xi, x>, xi Cauchy, Student-t (nu = tail index)
    or symmetric alpha-stable, m = 5 clients. Every round draws fresh noise
    for every local step (`task.round_train_data`), so the problem trained
    is the paper's expectation E_xi f(x, xi) = 1/2 ||x||^2 with optimum
    x* = 0 -- not a finite sum over reused samples, whose optimum -mean(xi)
    is itself Cauchy-distributed however many samples are drawn.
    Reported: ||x||^2 = ||x - x*||^2.
  * `claim21_quadratic` -- Zhang et al., Claim 2.1 / App. A.3.1:
    f(x) = sum_{i=1..3} 1/2 (x - b_i)^2, b = (-c/2, -c/2, k c), x* = (k-1)c/3,
    where FedAvg with *model* clipping at c cannot reach x* when k > 4.
  * `eq24_quadratic` -- Zhang et al., eq. (24): f1 = 1/2 (x-4)^2,
    f2 = 1/2 (2x-1)^2, f3 = 1/2 (6x+1)^2, f' = 41x, x* = 0.

Least-squares encoding: f_i(w) = sum_j 1/2 (<a_ij, w> - b_ij)^2, one example
(a_ij, b_ij) per term, a linear model without bias and
`models.HalfSquaredErrorSum`; a batch holding a whole client gives exactly
f_i and its gradient. For Das et al., a_ij are the columns of A_i and
b_ij = <a_ij, w_i*>, since 1/2 (w - w_i*)^T A_i A_i^T (w - w_i*) =
sum_j 1/2 (<a_ij, w - w_i*>)^2.

References:
* Zhang et al. 2022: "Understanding Clipping for Federated Learning:
  Convergence and Client-Level Differential Privacy", ICML 2022.
* Yang, Qiu, Liu 2022: "Taming Fat-Tailed Noise in Federated Learning",
  NeurIPS 2022.
* Das et al. 2022: "On the Convergence of DP FL on Non-Lipschitz
  Objectives, and with Normalized Client Updates".
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np
from scipy import stats
import tensorflow as tf
import tensorflow_federated as tff

from tasks import models
from tasks import task as task_lib
from tff_clip.runtime import client_data

__all__ = [
    'GeneratedQuadraticClients',
    'LeastSquaresProblem',
    'NOISE_DISTRIBUTIONS',
    'NoisyQuadraticProblem',
    'as_vector',
    'build_claim21_quadratic',
    'build_eq24_quadratic',
    'build_fat_tailed_quadratic',
    'build_heterogeneous_quadratic',
]

NOISE_DISTRIBUTIONS = ('cauchy', 'student_t', 'stable')
# Das et al. Sec. 5.3: entries of A_i are N(0, 1/20^2).
_DAS_FACTOR_STD = 1.0 / 20.0
_EVAL_BATCH_SIZE = 1000


def as_vector(weights) -> np.ndarray:
  """Flat float64 vector of an array, a list of arrays, or `ModelWeights`."""
  if hasattr(weights, 'trainable'):
    weights = weights.trainable
  if isinstance(weights, (list, tuple)):
    if not weights:
      raise ValueError('`weights` is an empty list.')
    return np.concatenate(
        [np.asarray(w, dtype=np.float64).reshape(-1) for w in weights])
  return np.asarray(weights, dtype=np.float64).reshape(-1)


class LeastSquaresProblem:
  """f(w) = scale * sum_i f_i(w), f_i(w) = sum_j 1/2 (<a_ij, w> - b_ij)^2.

  Attributes:
    name: the task name.
    reference: the paper and equation.
    objective_scale: 1/n for an average of client objectives, 1 for a sum.
    optimum: the exact minimizer w* (the minimum-norm one if not unique).
    optimal_value: f(w*).
    report_name: 'excess_loss': training should report f(w) - f(w*).
    client_optima: each client's own minimizer w_i* where the problem defines
      one (Das et al.), else None.
  """
  report_name = 'excess_loss'

  def __init__(self, features, targets, *, objective_scale: float, name: str,
               reference: str, client_optima=None):
    self.features = [np.asarray(a, dtype=np.float64) for a in features]
    self.targets = [np.asarray(b, dtype=np.float64).reshape(-1)
                    for b in targets]
    dims = {a.shape[1] for a in self.features}
    if len(dims) != 1:
      raise ValueError(f'All clients need the same dimension; got {dims}.')
    self.name = name
    self.reference = reference
    self.objective_scale = float(objective_scale)
    self.client_optima = client_optima
    self._hessian = self.objective_scale * sum(a.T @ a for a in self.features)
    self._linear = self.objective_scale * sum(
        a.T @ b for a, b in zip(self.features, self.targets))
    self._constant = self.objective_scale * sum(
        0.5 * b @ b for b in self.targets)
    self.optimum = np.linalg.lstsq(self._hessian, self._linear, rcond=None)[0]
    self.optimal_value = self.objective(self.optimum)

  @property
  def dimension(self) -> int:
    return self.features[0].shape[1]

  @property
  def num_clients(self) -> int:
    return len(self.features)

  def objective(self, weights) -> float:
    """f(w), exactly."""
    w = as_vector(weights)
    return float(0.5 * w @ self._hessian @ w - self._linear @ w +
                 self._constant)

  def client_objective(self, client: int, weights) -> float:
    """f_i(w) (without the objective scale)."""
    residual = self.features[client] @ as_vector(weights) - self.targets[client]
    return float(0.5 * residual @ residual)

  def gradient(self, weights) -> np.ndarray:
    """grad f(w) = H w - g."""
    return self._hessian @ as_vector(weights) - self._linear

  def excess_loss(self, weights) -> float:
    """f(w) - f(w*) = 1/2 (w - w*)^T H (w - w*), without cancellation error."""
    delta = as_vector(weights) - self.optimum
    return float(0.5 * delta @ self._hessian @ delta)

  def distance_to_optimum(self, weights) -> float:
    return float(np.linalg.norm(as_vector(weights) - self.optimum))

  def report(self, weights) -> float:
    return self.excess_loss(weights)


class NoisyQuadraticProblem:
  """E_xi[1/2 ||x||^2 + <xi, x>] for symmetric noise xi: minimized at x* = 0.

  Yang et al. plot ||x||^2. The noise's mean need not exist
  (Cauchy, alpha-stable with alpha <= 1); its symmetric (principal value)
  expectation is 0, so the objective is 1/2 ||x||^2.
  """
  report_name = 'squared_norm'

  def __init__(self, dimension: int, *, name: str, reference: str):
    self.name = name
    self.reference = reference
    self.optimum = np.zeros(dimension)
    self.optimal_value = 0.0

  @property
  def dimension(self) -> int:
    return self.optimum.size

  def objective(self, weights) -> float:
    x = as_vector(weights)
    return float(0.5 * x @ x)

  def gradient(self, weights) -> np.ndarray:
    return as_vector(weights)

  def excess_loss(self, weights) -> float:
    return self.objective(weights)

  def distance_to_optimum(self, weights) -> float:
    return float(np.linalg.norm(as_vector(weights)))

  def report(self, weights) -> float:
    """||x||^2, the quantity of Yang et al.'s Figs. 4 and 5."""
    x = as_vector(weights)
    return float(x @ x)


def _preprocess_fn(spec: tff.simulation.baselines.ClientSpec, to_xy):
  """TFF's order: shuffle, repeat, take, batch; `to_xy` maps each example."""
  return client_data.ExamplewisePreprocess(to_xy, spec)


def _least_squares_xy(element):
  return element['features'], element['targets']


def _least_squares_task(args: task_lib.BuildArgs, problem: LeastSquaresProblem,
                        initial_weights, name: str, description: str):
  per_client = [
      collections.OrderedDict(
          features=a.astype(np.float32),
          targets=b.astype(np.float32).reshape(-1, 1))
      for a, b in zip(problem.features, problem.targets)
  ]
  width = len(str(len(per_client) - 1))
  train = task_lib.ArrayClientData(
      {str(k).zfill(width): data for k, data in enumerate(per_client)})
  everything = collections.OrderedDict(
      (key, np.concatenate([d[key] for d in per_client]))
      for key in ('features', 'targets'))
  eval_spec = args.eval_client_spec or tff.simulation.baselines.ClientSpec(
      num_epochs=1, batch_size=_EVAL_BATCH_SIZE)
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train,
      test_data=task_lib.centralized_dataset(everything),
      train_preprocess_fn=_preprocess_fn(args.train_client_spec,
                                         _least_squares_xy),
      eval_preprocess_fn=_preprocess_fn(eval_spec, _least_squares_xy))
  input_spec = datasets.element_type_structure
  initial_weights = as_vector(initial_weights)

  def model_fn():
    return tff.learning.models.from_keras_model(
        keras_model=models.create_linear_model(initial_weights),
        loss=models.HalfSquaredErrorSum(), input_spec=input_spec)

  return task_lib.Task(
      datasets, model_fn, name=name, data_source=args.data_source,
      model_description=f'linear, w in R^{problem.dimension}',
      data_description=description, problem=problem,
      evaluates_on_clients_data=True)  # f(w) on every client's examples.


def _check_num_clients(args: task_lib.BuildArgs, default: int,
                       fixed: bool = False) -> int:
  if args.partition is not None:
    raise ValueError(f'A synthetic problem has its own clients; partition='
                     f'{args.partition!r} does not apply (leave it None).')
  if fixed and args.num_clients not in (None, default):
    raise ValueError(f'This problem has exactly {default} clients; got '
                     f'`num_clients`={args.num_clients}.')
  return args.num_clients or default


def build_heterogeneous_quadratic(args: task_lib.BuildArgs, *,
                                  dimension: int = 200,
                                  rank: int = 20,
                                  initial_offset_scale: float = 1.0
                                 ) -> task_lib.Task:
  """Das et al. Sec. 5.3; `initial_offset_scale` 1: I1, 0.2: I2."""
  num_clients = _check_num_clients(args, 100)
  if dimension < 1 or rank < 1:
    raise ValueError(f'`dimension` and `rank` must be positive; got '
                     f'{dimension} and {rank}.')
  rng = np.random.default_rng(args.seed)
  client_optima = rng.standard_normal((num_clients, dimension))
  factors = rng.normal(0.0, _DAS_FACTOR_STD,
                       size=(num_clients, dimension, rank))
  # The problem is built from the float32 values the model trains on, so its
  # optimum is exact for the data actually used.
  features = [a.T.astype(np.float32) for a in factors]
  targets = [(a.T @ w).astype(np.float32)
             for a, w in zip(factors, client_optima)]
  problem = LeastSquaresProblem(
      features, targets, objective_scale=1.0 / num_clients,
      name='heterogeneous_quadratic',
      reference='Das et al., Sec. 5.3', client_optima=client_optima)
  offset = rng.uniform(0.0, 1.0, size=dimension)
  return _least_squares_task(
      args, problem, problem.optimum + initial_offset_scale * offset,
      'heterogeneous_quadratic',
      f'{num_clients} clients x {rank} rank-one terms, d={dimension}')


def build_claim21_quadratic(args: task_lib.BuildArgs, *,
                            clip_threshold: float = 1.0,
                            target_multiple: float = 5.0,
                            initial_weights: float = 0.0) -> task_lib.Task:
  """Zhang et al. Claim 2.1: b = (-c/2, -c/2, target_multiple c)."""
  _check_num_clients(args, 3, fixed=True)
  if clip_threshold <= 0:
    raise ValueError(
        f'`clip_threshold` must be positive; got {clip_threshold}.')
  c = float(clip_threshold)
  problem = LeastSquaresProblem(
      [[[1.0]]] * 3, [[-0.5 * c], [-0.5 * c], [target_multiple * c]],
      objective_scale=1.0, name='claim21_quadratic',
      reference='Zhang et al., Claim 2.1 / App. A.3.1')
  return _least_squares_task(
      args, problem, [initial_weights], 'claim21_quadratic',
      f'3 clients, b = (-{c / 2:g}, -{c / 2:g}, {target_multiple * c:g})')


def build_eq24_quadratic(args: task_lib.BuildArgs, *,
                         initial_weights: float = 1.0) -> task_lib.Task:
  """Zhang et al. eq. (24): (x-4)^2, (2x-1)^2, (6x+1)^2 halves."""
  _check_num_clients(args, 3, fixed=True)
  problem = LeastSquaresProblem(
      [[[1.0]], [[2.0]], [[6.0]]], [[4.0], [1.0], [-1.0]],
      objective_scale=1.0, name='eq24_quadratic',
      reference='Zhang et al., eq. (24), App. A.3.2')
  return _least_squares_task(args, problem, [initial_weights],
                             'eq24_quadratic', '3 clients, eq. (24)')


def sample_noise(noise: str, tail_index: Optional[float], size, rng,
                 scale: float = 1.0) -> np.ndarray:
  """Symmetric fat-tailed noise: Cauchy, Student-t(nu), or alpha-stable."""
  if noise not in NOISE_DISTRIBUTIONS:
    raise ValueError(f'Unknown `noise` {noise!r}; expected one of '
                     f'{NOISE_DISTRIBUTIONS}.')
  if noise == 'cauchy':
    if tail_index not in (None, 1, 1.0):
      raise ValueError(f'Cauchy noise has tail index 1; got `tail_index`='
                       f'{tail_index}.')
    draw = stats.cauchy.rvs(size=size, random_state=rng)
  elif tail_index is None:
    raise ValueError(f"noise={noise!r} needs `tail_index` (Student-t's nu, "
                     "or the stable law's alpha).")
  elif noise == 'student_t':
    if tail_index <= 0:
      raise ValueError(f'Student-t `tail_index` (nu) must be positive; got '
                       f'{tail_index}.')
    draw = stats.t.rvs(df=tail_index, size=size, random_state=rng)
  else:
    if not 0 < tail_index <= 2:
      raise ValueError(f'alpha-stable `tail_index` must be in (0, 2]; got '
                       f'{tail_index}.')
    draw = stats.levy_stable.rvs(tail_index, 0.0, size=size, random_state=rng)
  return scale * np.asarray(draw, dtype=np.float64)


def _noise_xy(element):
  noise = element['noise']
  return noise, tf.zeros([1], dtype=noise.dtype)


def build_fat_tailed_quadratic(args: task_lib.BuildArgs, *,
                               dimension: int = 10,
                               noise: str = 'cauchy',
                               tail_index: Optional[float] = None,
                               noise_scale: float = 1.0,
                               examples_per_client: int = 100,
                               initial_weights=None) -> task_lib.Task:
  """Yang et al. Sec. 5.1: f(x, xi) = 1/2 ||x||^2 + <xi, x>.

  Each client holds `examples_per_client` noise vectors per round (one per
  example: with batch size B, examples_per_client / B local steps). The
  training loop takes them from `task.round_train_data(client_id, seed)`,
  which draws them afresh from `seed` (the loop's seed of (run seed, round,
  client)), so no sample is reused across rounds: the paper's fresh
  stochastic gradient at every local step. `task.datasets.train_data` is one
  such draw (round seed = the task seed), for code that reads ClientData
  directly.

  Args:
    args: the checked `get_task` arguments (`num_clients` is m, default 5).
    dimension: d, the dimension of x (default 10).
    noise: 'cauchy', 'student_t' or 'stable' (`NOISE_DISTRIBUTIONS`).
    tail_index: Student-t's nu or the stable law's alpha (Fig. 5's alpha);
      Cauchy's is 1.
    noise_scale: multiplies every noise sample.
    examples_per_client: noise vectors per client and round.
    initial_weights: x_0 (default: all ones).

  Returns:
    The task, with `problem` (optimum 0, `report` = ||x||^2) and
    `round_train_data`.
  """
  num_clients = _check_num_clients(args, 5)
  if dimension < 1 or examples_per_client < 1:
    raise ValueError(f'`dimension` and `examples_per_client` must be '
                     f'positive; got {dimension} and {examples_per_client}.')
  if not (isinstance(noise_scale, (int, float)) and noise_scale > 0):
    raise ValueError(f'`noise_scale` must be a positive number; got '
                     f'{noise_scale!r}.')
  # Checks `noise` and `tail_index` before anything is built.
  sample_noise(noise, tail_index, 1, np.random.default_rng(0))

  def draw(client: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, client])
    return sample_noise(noise, tail_index, (examples_per_client, dimension),
                        rng, noise_scale).astype(np.float32)

  samples = np.stack([draw(k, args.seed) for k in range(num_clients)])
  problem = NoisyQuadraticProblem(
      dimension, name='fat_tailed_quadratic',
      reference='Yang et al., Sec. 5.1')
  width = len(str(num_clients - 1))
  client_ids = [str(k).zfill(width) for k in range(num_clients)]
  train = tff.simulation.datasets.TestClientData({
      cid: collections.OrderedDict(noise=samples[k])
      for k, cid in enumerate(client_ids)})
  client_index = {cid: k for k, cid in enumerate(client_ids)}

  def round_train_data(client_id: str, seed: int) -> tf.data.Dataset:
    if client_id not in client_index:
      raise ValueError(f'Unknown client {client_id!r}; clients are '
                       f'{client_ids}.')
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        noise=draw(client_index[client_id], int(seed))))

  spec = args.train_client_spec
  if spec.shuffle_buffer_size is None:
    spec = tff.simulation.baselines.ClientSpec(
        num_epochs=spec.num_epochs, batch_size=spec.batch_size,
        max_elements=spec.max_elements,
        shuffle_buffer_size=examples_per_client)
  eval_spec = args.eval_client_spec or tff.simulation.baselines.ClientSpec(
      num_epochs=1, batch_size=_EVAL_BATCH_SIZE)
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train,
      test_data=task_lib.centralized_dataset(collections.OrderedDict(
          noise=samples.reshape(-1, dimension))),
      train_preprocess_fn=_preprocess_fn(spec, _noise_xy),
      eval_preprocess_fn=_preprocess_fn(eval_spec, _noise_xy))
  start = (np.ones(dimension) if initial_weights is None
           else as_vector(initial_weights))
  if start.size != dimension:
    raise ValueError(f'`initial_weights` has {start.size} entries; the '
                     f'problem has dimension {dimension}.')
  input_spec = datasets.element_type_structure

  def model_fn():
    return tff.learning.models.from_keras_model(
        keras_model=models.create_noisy_quadratic_model(start),
        loss=models.MeanOfOutputs(), input_spec=input_spec)

  law = {'cauchy': 'Cauchy', 'student_t': f'Student-t(nu={tail_index})',
         'stable': f'alpha-stable(alpha={tail_index})'}[noise]
  return task_lib.Task(
      datasets, model_fn, name='fat_tailed_quadratic',
      data_source=args.data_source,
      model_description=f'1/2||x||^2 + <xi, x>, x in R^{dimension}',
      data_description=(f'{num_clients} clients x {examples_per_client} '
                        f'fresh {law} noise vectors per round'),
      problem=problem, round_train_data=round_train_data,
      # Its test data are the clients' draws at the task's seed.
      evaluates_on_clients_data=True)


class GeneratedQuadraticClients(tff.simulation.datasets.ClientData):
  """Clients of the heterogeneous quadratic, each generated when sampled.

  Client i holds the `rank` examples (a_j, <a_j, w_i*>) of Das et al.,
  Sec. 5.3 (`tasks.synthetic.build_heterogeneous_quadratic`: a_j the
  columns of A_i, entries N(0, 1/20^2), w_i* ~ N(0, I)), drawn by
  TensorFlow's stateless generators from (seed, i): a pure function of
  them, so a population of any size costs only its sampled clients' data
  (as `tasks.stackoverflow.GeneratedClientData` does for its users). The
  round's work is the task's; its problem (the optimum over all clients)
  is not built.
  """

  def __init__(self, num_clients: int, *, dimension: int = 200,
               rank: int = 20, seed: int = 0):
    super().__init__()
    from tasks import stackoverflow  # pylint: disable=g-import-not-at-top
    self._client_ids = stackoverflow.GeneratedClientIds(num_clients)
    self._dimension, self._rank, self._seed = dimension, rank, int(seed)
    self._element_type_structure = self._dataset(
        self._client_ids[0]).element_spec

  @property
  def client_ids(self):
    return self._client_ids

  @property
  def serializable_dataset_fn(self):
    return self._dataset

  @property
  def element_type_structure(self):
    return self._element_type_structure

  def _dataset(self, client_id) -> tf.data.Dataset:
    key = tf.stack([tf.constant(self._seed, tf.int64),
                    tf.strings.to_number(client_id, tf.int64)])
    keys = tf.random.experimental.stateless_split(key, 2)
    features = tf.random.stateless_normal(
        [self._rank, self._dimension], keys[0], stddev=1.0 / 20.0)
    optimum = tf.random.stateless_normal([self._dimension, 1], keys[1])
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        features=features, targets=tf.matmul(features, optimum)))
