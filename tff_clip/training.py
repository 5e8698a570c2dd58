"""The training program behind `python -m scripts.train`.

Data flows one way, one call site per arrow: task (`tasks.get_task`) ->
client work (`algorithms.build_fedavg`: local training, optional per-step
clipping, BLUR, LUS) -> bounding (`aggregators`) -> noise (`dp`) -> mean ->
server optimizer -> ledger (`accounting.PrivacyLedger`) and metrics.

Everything a round does depends only on (seed, round number) and the
checkpointed state: the cohort (`sampling.ClientSampler`), the client data
order (seeded shuffles), the DP noise (stateless seeds kept in the aggregator
state). So a run killed at any moment and started again with the same
command resumes from its last checkpoint and produces the same per-round
metrics as an uninterrupted run, and its ledger never counts a round twice
nor forgets one. (That reproducibility is for simulation: seeded noise is
predictable noise. The library's default, `noise_seed=None`, is not.)

Outputs under `root_output_dir/experiment_name/`:
  config.json     the configuration (a rerun must match it to resume)
  metrics.csv     one row per round (`tff.program.CSVFileReleaseManager`)
  tensorboard/    the same metrics (`tff.program.TensorBoardReleaseManager`)
  ledger.json     the DP events of every round and epsilon per round
  checkpoints/    program state (`tff.program.FileProgramStateManager`)
  summary.json    final figures; plot.png: accuracy, loss, clip norm, epsilon
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import math
import os
import time
import zlib
from typing import Any, Optional, Union

from absl import logging
import numpy as np
# Imported eagerly on purpose: a program whose first TensorFlow import happens
# inside absl's app.run main gets Keras (2.14) building functional models
# from graph tensors ("Attempt to convert a value (None)" in Flatten).
import tensorflow as tf  # pylint: disable=unused-import

from tff_clip import accounting
from tff_clip import sampling as sampling_lib

__all__ = [
    'BOUNDINGS', 'CLIENT_OPTIMIZERS', 'EXECUTORS', 'SERVER_OPTIMIZERS',
    'ConfigError', 'TrainConfig', 'run', 'validate',
]

BOUNDINGS = ('none', 'clip', 'normalize', 'per_layer_clip',
             'per_layer_normalize')
CLIENT_OPTIMIZERS = ('sgd', 'sgdm', 'adam')
SERVER_OPTIMIZERS = ('sgd', 'sgdm', 'adam', 'lamb', 'lars')
EXECUTORS = ('local', 'gpu', 'remote')
# The honest-extrapolation point of the summary: a production-scale cohort.
EXTRAPOLATION_POPULATION = 1_000_000
EXTRAPOLATION_CLIENTS_PER_ROUND = 1_000


# How a run is executed, not what it computes: these may change on resume.
EXECUTION_KEYS = ('executor', 'max_concurrent_clients', 'workers',
                  'worker_timeout_s', 'progress', 'root_output_dir')


class ConfigError(ValueError):
  """A configuration that cannot run; raised before any training starts."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything a run depends on (the flags of `scripts.train`)."""
  task: str = 'digits'
  data_source: str = 'offline'
  # The task's own options (`tasks.task_options(task)`) as (key, value) pairs,
  # e.g. (('noise', 'student_t'), ('tail_index', 1.5)); `--task_option`.
  task_options: tuple = ()
  num_clients: Optional[int] = None
  partition: Optional[str] = None
  partition_alpha: Optional[float] = None
  bounding: str = 'clip'
  clip_norm: Union[float, str] = 'adaptive'
  initial_clip_norm: float = 0.1
  split: str = 'dim'
  target_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  noise_multiplier: Optional[float] = 0.5
  target_epsilon: Optional[float] = None
  delta: float = 1e-5
  clients_per_round: int = 20
  sampling: str = 'poisson'
  rounds: int = 30
  client_optimizer: str = 'sgd'
  client_learning_rate: float = 0.1
  server_optimizer: str = 'sgd'
  server_learning_rate: float = 1.0
  server_momentum: float = 0.9
  local_epochs: int = 1
  local_steps: Optional[int] = None
  batch_size: int = 16
  local_clip: Optional[float] = None
  blur_lambda: Optional[float] = None
  blur_clip_norm: Optional[float] = None
  # One c for every layer, or a tuple with one per trainable layer (seed 004).
  lus_sparsity: Optional[Union[float, tuple]] = None
  eval_every: int = 5
  root_output_dir: str = 'runs'
  experiment_name: str = 'default'
  seed: int = 0
  executor: str = 'local'
  max_concurrent_clients: Optional[int] = None
  workers: tuple = ()
  worker_timeout_s: float = 30.0
  checkpoint_every: int = 1
  cache_dir: Optional[str] = None
  progress: bool = True

  @property
  def output_dir(self) -> str:
    return os.path.join(self.root_output_dir, self.experiment_name)

  @property
  def private(self) -> bool:
    return self.noise_multiplier is not None or self.target_epsilon is not None

  def to_json(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out['workers'] = list(self.workers)
    out['task_options'] = {key: (list(value) if isinstance(value, tuple)
                                 else value)
                           for key, value in self.task_options}
    if isinstance(self.lus_sparsity, tuple):
      out['lus_sparsity'] = list(self.lus_sparsity)
    return out

  def identity(self) -> dict[str, Any]:
    """What must match for a rerun to resume (not how it is executed)."""
    out = self.to_json()
    for key in EXECUTION_KEYS:
      out.pop(key)
    return out


# ----------------------------------------------------------------------------
# Validation: everything checkable before data, TFF or training.


def _positive(value, name, kind=float, allow_none=False):
  if value is None and allow_none:
    return
  ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and
        (kind is float or float(value).is_integer()) and math.isfinite(value)
        and value > 0)
  if not ok:
    raise ConfigError(f'`{name}` must be a positive '
                      f'{"int" if kind is int else "number"}; got {value!r}.')


def _one_of(value, name, choices):
  if value not in choices:
    raise ConfigError(f'`{name}` must be one of {", ".join(choices)}; got '
                      f'{value!r}.')


def validate(config: TrainConfig) -> None:
  """Raises `ConfigError` naming the flag for any configuration that cannot run."""
  _one_of(config.bounding, 'bounding', BOUNDINGS)
  _one_of(config.sampling, 'sampling', sampling_lib.SAMPLINGS)
  _one_of(config.client_optimizer, 'client_optimizer', CLIENT_OPTIMIZERS)
  _one_of(config.server_optimizer, 'server_optimizer', SERVER_OPTIMIZERS)
  _one_of(config.executor, 'executor', EXECUTORS)
  if config.split not in ('uniform', 'dim'):
    raise ConfigError(f"`split` must be one of uniform, dim; got "
                      f"{config.split!r}.")
  if isinstance(config.clip_norm, str):
    if config.clip_norm != 'adaptive':
      raise ConfigError("`clip_norm` must be a positive number or 'adaptive'; "
                        f'got {config.clip_norm!r}.')
  else:
    _positive(config.clip_norm, 'clip_norm')
  _positive(config.initial_clip_norm, 'initial_clip_norm')
  if not 0.0 <= config.target_quantile <= 1.0:
    raise ConfigError('`target_quantile` must be in [0, 1]; got '
                      f'{config.target_quantile!r}.')
  _positive(config.clip_learning_rate, 'clip_learning_rate')
  if config.noise_multiplier is not None and config.target_epsilon is not None:
    raise ConfigError('Give `noise_multiplier` or `target_epsilon`, not both.')
  if config.noise_multiplier is not None and (
      not math.isfinite(config.noise_multiplier) or
      config.noise_multiplier < 0):
    raise ConfigError('`noise_multiplier` must be >= 0; got '
                      f'{config.noise_multiplier!r}.')
  if config.target_epsilon is not None:
    _positive(config.target_epsilon, 'target_epsilon')
  if config.private and config.bounding == 'none':
    raise ConfigError(
        'Noise without bounding has no sensitivity: set `bounding` (clip, '
        'normalize, per_layer_clip, per_layer_normalize) or drop '
        '`noise_multiplier`/`target_epsilon`.')
  if (config.clip_norm == 'adaptive' and config.noise_multiplier and
      config.noise_multiplier >= 0.1 * config.clients_per_round):
    # Andrew et al.: the clipped-count noise sigma_b = n/20 must exceed z/2
    # (per-layer quantiles need more; `dp.dp_factory` checks that at build).
    raise ConfigError(
        f'`noise_multiplier` {config.noise_multiplier} is too large for '
        f'adaptive clipping with `clients_per_round` {config.clients_per_round}'
        f' (needs z < n/10): raise clients_per_round, lower the noise, or use '
        'a fixed `clip_norm`.')
  if not 0.0 < config.delta < 1.0:
    raise ConfigError(f'`delta` must be in (0, 1); got {config.delta!r}.')
  _positive(config.clients_per_round, 'clients_per_round', int)
  _positive(config.rounds, 'rounds', int)
  _positive(config.client_learning_rate, 'client_learning_rate')
  _positive(config.server_learning_rate, 'server_learning_rate')
  _positive(config.local_epochs, 'local_epochs', int)
  _positive(config.local_steps, 'local_steps', int, allow_none=True)
  _positive(config.batch_size, 'batch_size', int)
  _positive(config.local_clip, 'local_clip', allow_none=True)
  _positive(config.blur_lambda, 'blur_lambda', allow_none=True)
  _positive(config.blur_clip_norm, 'blur_clip_norm', allow_none=True)
  if config.blur_lambda is not None:
    if config.blur_clip_norm is None and isinstance(config.clip_norm, str):
      raise ConfigError('`blur_lambda` needs S: give `blur_clip_norm`, or a '
                        'fixed numeric `clip_norm`.')
    if config.blur_lambda * config.client_learning_rate >= 1.0:
      raise ConfigError(
          f'`blur_lambda` ({config.blur_lambda}) must be below 1 / '
          f'client_learning_rate ({1 / config.client_learning_rate:g}).')
  if config.lus_sparsity is not None:
    values = (config.lus_sparsity if isinstance(config.lus_sparsity, tuple)
              else (config.lus_sparsity,))
    if not values or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and
        0.0 <= v < 1.0 for v in values):
      raise ConfigError('`lus_sparsity` must be in [0, 1) (one value, or one '
                        f'per trainable layer); got {config.lus_sparsity!r}.')
  _validate_task_options(config)
  _positive(config.eval_every, 'eval_every', int)
  _positive(config.checkpoint_every, 'checkpoint_every', int)
  _positive(config.max_concurrent_clients, 'max_concurrent_clients', int,
            allow_none=True)
  if config.executor == 'remote' and not config.workers:
    raise ConfigError('`executor=remote` needs `workers` (host:port,...).')
  for worker in config.workers:
    host, _, port = str(worker).rpartition(':')
    if not host or not port.isdigit():
      raise ConfigError(f'`workers` entries must be host:port; got {worker!r}.')
  if not config.experiment_name or os.sep in config.experiment_name:
    raise ConfigError('`experiment_name` must be a non-empty name without '
                      f'{os.sep!r}; got {config.experiment_name!r}.')


def _validate_task_options(config: TrainConfig) -> None:
  if not config.task_options:
    return  # `tasks` imports TFF: keep `validate` instant without options.
  import tasks  # pylint: disable=g-import-not-at-top
  try:
    accepted = tasks.task_options(config.task)
  except ValueError as e:
    raise ConfigError(f'`task`: {e}') from None
  keys = [pair[0] if isinstance(pair, tuple) and len(pair) == 2 else None
          for pair in config.task_options]
  if None in keys:
    raise ConfigError('`task_option` must be key=value pairs; got '
                      f'{config.task_options!r}.')
  for key in keys:
    if keys.count(key) > 1:
      raise ConfigError(f'`task_option` {key!r} is given twice.')
    if key not in accepted:
      raise ConfigError(
          f'`task_option` {key!r} is not an option of task {config.task!r}; '
          f'its options are: {", ".join(accepted) or "none"}.')


def prepare_output_dir(config: TrainConfig) -> bool:
  """Creates or checks the output directory; True when a run can resume there.

  An existing directory is reused only by the same configuration (so a
  killed run resumes); another configuration there is refused rather than
  mixed with or written over.
  """
  out = config.output_dir
  config_path = os.path.join(out, 'config.json')
  try:
    os.makedirs(out, exist_ok=True)
  except OSError as e:
    raise ConfigError(f'`root_output_dir`: cannot create {out!r}: {e}') from e
  if not os.access(out, os.W_OK):
    raise ConfigError(f'`root_output_dir`: {out!r} is not writable.')
  if os.path.exists(config_path):
    with open(config_path) as f:
      previous = {k: v for k, v in json.load(f).items()
                  if k not in EXECUTION_KEYS}
    current = config.identity()
    if previous != current:
      changed = sorted(k for k in set(previous) | set(current)
                       if previous.get(k) != current.get(k))
      raise ConfigError(
          f'{out!r} holds a run with a different configuration (differs in: '
          f'{", ".join(changed)}). Nothing was changed; choose another '
          '`experiment_name` or `root_output_dir`, or delete that directory.')
    return True
  if os.listdir(out):
    raise ConfigError(
        f'{out!r} is not empty and holds no tff_clip run; nothing was '
        'changed. Choose another `experiment_name` or `root_output_dir`.')
  _atomic_write_json(config_path, config.to_json())
  return False


def _atomic_write_json(path: str, data) -> None:
  tmp = f'{path}.tmp'
  with open(tmp, 'w') as f:
    json.dump(data, f, indent=2, sort_keys=True, default=float)
  os.replace(tmp, path)


# ----------------------------------------------------------------------------
# Building blocks (TFF imported lazily so `validate` stays instant).


def set_execution_context(config: TrainConfig) -> None:
  """Local C++ runtime, the same on visible GPUs, or remote TFF workers."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip import execution  # pylint: disable=g-import-not-at-top
  if config.executor == 'gpu':
    gpus = tf.config.list_physical_devices('GPU')
    if not gpus:
      raise ConfigError(
          '`executor=gpu` but TensorFlow sees no GPU. Install '
          '`tensorflow[and-cuda]==2.14.1` (pip install -e ".[gpu]") on a '
          'machine with an NVIDIA driver, or use --executor=local.')
    logging.info('GPUs visible: %s', gpus)
  if config.executor in ('local', 'gpu'):
    execution.set_local_cpp_context(
        max_concurrent_clients=config.max_concurrent_clients)
  else:
    try:
      contexts = [
          execution.create_remote_async_context(
              worker, timeout_s=config.worker_timeout_s)
          for worker in config.workers
      ]
    except TimeoutError as e:
      raise ConfigError(f'`workers`: {e}') from e
    tff.backends.native.set_mergeable_comp_execution_context(contexts)


def build_task(config: TrainConfig):
  import tasks  # pylint: disable=g-import-not-at-top
  # The task's own shuffle is off: the training loop shuffles every client's
  # data with a seed of (seed, round, client), so a resumed run sees the
  # same order as an uninterrupted one.
  try:
    return tasks.get_task(
        config.task, data_source=config.data_source,
        num_clients=config.num_clients, partition=config.partition,
        partition_alpha=config.partition_alpha, seed=config.seed,
        train_batch_size=config.batch_size, local_epochs=config.local_epochs,
        shuffle_buffer_size=1, cache_dir=config.cache_dir,
        **dict(config.task_options))
  except (TypeError, ValueError) as e:
    if not config.task_options:
      raise
    raise ConfigError(f'`task_option` (task {config.task!r}): {e}') from e


def _client_optimizer(config):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  lr = config.client_learning_rate
  return {
      'sgd': lambda: tff.learning.optimizers.build_sgdm(lr),
      'sgdm': lambda: tff.learning.optimizers.build_sgdm(lr, momentum=0.9),
      'adam': lambda: tff.learning.optimizers.build_adam(lr),
  }[config.client_optimizer]()


def _server_optimizer(config):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip import optimizers  # pylint: disable=g-import-not-at-top
  lr = config.server_learning_rate
  return {
      'sgd': lambda: tff.learning.optimizers.build_sgdm(lr),
      'sgdm': lambda: tff.learning.optimizers.build_sgdm(
          lr, momentum=config.server_momentum),
      'adam': lambda: tff.learning.optimizers.build_adam(lr),
      'lamb': lambda: optimizers.build_lamb(lr),
      'lars': lambda: optimizers.build_lars(lr),
  }[config.server_optimizer]()


def build_aggregator(config: TrainConfig, noise_multiplier: Optional[float]):
  """The model aggregator: bounding, then (when private) noise, then mean."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip import aggregators, dp  # pylint: disable=g-import-not-at-top
  if config.bounding == 'none':
    return None
  if noise_multiplier is not None:
    return dp.dp_factory(
        config.bounding, noise_multiplier, float(config.clients_per_round),
        clip_norm=config.clip_norm, split=config.split,
        initial_clip_norm=config.initial_clip_norm,
        target_quantile=config.target_quantile,
        clip_learning_rate=config.clip_learning_rate,
        noise_seed=config.seed)
  if config.clip_norm == 'adaptive':
    # CE-FedAvg with a moving threshold (seed 000), noise-free.
    clip_norm = tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
        initial_estimate=config.initial_clip_norm,
        target_quantile=config.target_quantile,
        learning_rate=config.clip_learning_rate, multiplier=1.0,
        increment=0.0, secure_estimation=False)
  else:
    clip_norm = float(config.clip_norm)
  return aggregators.bounding_factory(config.bounding, clip_norm, config.split)


def build_process(config: TrainConfig, task, noise_multiplier):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip import algorithms  # pylint: disable=g-import-not-at-top
  blur_clip_norm = config.blur_clip_norm
  if config.blur_lambda is not None and blur_clip_norm is None:
    blur_clip_norm = float(config.clip_norm)
  return algorithms.build_fedavg(
      task.model_fn,
      client_optimizer=_client_optimizer(config),
      server_optimizer=_server_optimizer(config),
      local_clip_norm=config.local_clip,
      blur_strength=config.blur_lambda,
      blur_clip_norm=blur_clip_norm if config.blur_lambda else None,
      lus_sparsity=config.lus_sparsity,
      model_aggregator=build_aggregator(config, noise_multiplier),
      # DP-FedAvg weighs clients uniformly (the sensitivity must not depend
      # on private example counts); otherwise FedAvg's example weighting.
      client_weighting=(tff.learning.ClientWeighting.UNIFORM
                        if noise_multiplier is not None else None))


def initial_model_weights(task, seed: int):
  """The model's initial weights as numpy, a function of the seed alone.

  TFF traces `initialize` into its own graph, where Keras initializers ignore
  the global seed: two processes would start from different weights. So the
  model is built once eagerly under the seed and its weights set explicitly.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  tf.keras.utils.set_random_seed(seed)
  weights = tff.learning.models.ModelWeights.from_model(task.model_fn())
  return tf.nest.map_structure(lambda v: v.numpy(), weights)


def _client_dataset(task, client_id, config, round_num):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # crc32, not hash(): str hashes are salted per process.
  seed = int(np.random.default_rng(
      [config.seed, round_num, zlib.crc32(str(client_id).encode())]
  ).integers(2**31))
  if getattr(task, 'round_train_data', None) is not None:
    # Samples drawn afresh every round (seed 001's fat-tailed noise).
    dataset = task.round_train_data(client_id, seed)
  else:
    dataset = task.datasets.train_data.create_tf_dataset_for_client(client_id)
  dataset = dataset.shuffle(1000, seed=seed, reshuffle_each_iteration=True)
  preprocess = task.datasets.train_preprocess_fn
  if preprocess is not None:
    dataset = preprocess(dataset)
  if config.local_steps is not None:
    dataset = dataset.repeat().take(config.local_steps)
  del tf
  return dataset


def _test_dataset(task):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  test = task.datasets.test_data
  if isinstance(test, tff.simulation.datasets.ClientData):
    test = test.create_tf_dataset_from_all_clients()
  preprocess = task.datasets.eval_preprocess_fn
  return preprocess(test) if preprocess is not None else test


def _flatten(prefix, value, out):
  if isinstance(value, (dict, collections.OrderedDict)):
    for key, item in value.items():
      _flatten(f'{prefix}/{key}' if prefix else str(key), item, out)
  elif isinstance(value, (list, tuple)) and not hasattr(value, '_fields'):
    for i, item in enumerate(value):
      _flatten(f'{prefix}/{i}', item, out)
  else:
    array = np.asarray(value)
    if array.size == 1 and array.dtype.kind in 'fiub':
      out[prefix] = float(array)


# ----------------------------------------------------------------------------
# Checkpoints.


def _save_checkpoint(manager, program_state, round_num):
  asyncio.run(manager.save(program_state, round_num))


def _load_checkpoint(manager, template):
  """Latest loadable checkpoint; a torn one (killed mid-save) is skipped."""
  versions = asyncio.run(manager.get_versions()) or []
  for version in sorted(versions, reverse=True):
    try:
      return asyncio.run(manager.load(version, template)), version
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('Checkpoint %d unreadable (%s); trying an older one.',
                      version, e)
      asyncio.run(manager._remove(version))  # pylint: disable=protected-access
  return None, 0


# ----------------------------------------------------------------------------
# The loop.


def resolve_noise_multiplier(config: TrainConfig, population: int):
  """z from the flags: given, calibrated from `target_epsilon`, or None."""
  if config.clients_per_round > population:
    raise ConfigError(
        f'`clients_per_round` ({config.clients_per_round}) exceeds the '
        f'number of training clients ({population}).')
  if config.target_epsilon is None:
    return config.noise_multiplier
  return accounting.calibrate_noise_multiplier(
      config.target_epsilon, clients_per_round=config.clients_per_round,
      population_size=population, rounds=config.rounds, delta=config.delta,
      sampling=sampling_lib.accounting_sampling(config.sampling))


def run(config: TrainConfig) -> dict[str, Any]:
  """Trains (or resumes) per `config`; returns the summary."""
  validate(config)
  resuming = prepare_output_dir(config)
  set_execution_context(config)

  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip import dp  # pylint: disable=g-import-not-at-top

  task = build_task(config)
  initial_weights = initial_model_weights(task, config.seed)
  client_ids = list(task.datasets.train_data.client_ids)
  noise_multiplier = resolve_noise_multiplier(config, len(client_ids))
  sampler = sampling_lib.ClientSampler(client_ids, config.clients_per_round,
                                       config.sampling, config.seed)
  try:
    process = build_process(config, task, noise_multiplier)
  except ValueError as e:  # E.g. noise too large for per-layer quantiles.
    raise ConfigError(str(e)) from e
  evaluation = tff.learning.algorithms.build_fed_eval(task.model_fn)
  test_data = _test_dataset(task)

  out = config.output_dir
  manager = tff.program.FileProgramStateManager(
      os.path.join(out, 'checkpoints'), prefix='round_', keep_total=2,
      keep_first=False)
  state = process.set_model_weights(process.initialize(),
                                    initial_weights)
  ledger = accounting.PrivacyLedger()
  start_round = 1
  if resuming:
    template = collections.OrderedDict(
        learning=state, ledger=np.asarray('{}'))
    loaded, version = _load_checkpoint(manager, template)
    if loaded is not None:
      state = loaded['learning']
      ledger = accounting.PrivacyLedger.from_dict(
          json.loads(str(np.asarray(loaded['ledger']).item().decode()
                         if isinstance(np.asarray(loaded['ledger']).item(),
                                       bytes)
                         else np.asarray(loaded['ledger']).item())))
      start_round = version + 1
      logging.info('Resuming %s from round %d.', out, version)

  csv_manager = tff.program.CSVFileReleaseManager(
      os.path.join(out, 'metrics.csv'), key_fieldname='round')
  tb_manager = tff.program.TensorBoardReleaseManager(
      os.path.join(out, 'tensorboard'))
  acct_sampling = sampling_lib.accounting_sampling(config.sampling)

  progress = None
  if config.progress:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    progress = tqdm(total=config.rounds, initial=start_round - 1,
                    desc=config.experiment_name, unit='round')
  last_eval = {}
  for round_num in range(start_round, config.rounds + 1):
    started = time.perf_counter()
    cohort = sampler.sample(round_num)
    data = [_client_dataset(task, cid, config, round_num) for cid in cohort]
    if data:
      output = process.next(state, data)
      state = output.state
      metrics = {}
      _flatten('', output.metrics, metrics)
    else:  # Poisson sampling drew nobody: no update, but the round counts.
      metrics = {}
    if noise_multiplier is not None:
      if data:  # The event the aggregator actually ran this round.
        ledger.record(round_num, accounting.round_event(
            dp.extract_dp_event(state.aggregator), config.clients_per_round,
            len(client_ids), acct_sampling))
      else:  # An empty Poisson cohort still counts as a sampled round.
        ledger.record_gaussian_round(round_num, noise_multiplier,
                                     config.clients_per_round, len(client_ids),
                                     acct_sampling)
      epsilon = ledger.epsilon(config.delta)
    else:
      epsilon = math.inf
    row = collections.OrderedDict(round=round_num, clients=len(cohort))
    row['train_loss'] = metrics.get('client_work/train/loss', math.nan)
    row['train_accuracy'] = _first(metrics, 'client_work/train/', 'accuracy')
    row['clip_norm'] = _first(metrics, 'aggregator/', 'clip_norm')
    row['clipped_fraction'] = metrics.get('aggregator/clipped_fraction',
                                          math.nan)
    row['epsilon'] = epsilon
    row['eval_loss'] = row['eval_accuracy'] = math.nan
    if round_num % config.eval_every == 0 or round_num == config.rounds:
      eval_state = evaluation.set_model_weights(
          evaluation.initialize(), process.get_model_weights(state))
      eval_metrics = {}
      _flatten('', evaluation.next(eval_state, [test_data]).metrics,
               eval_metrics)
      last_eval = {
          'eval_loss': _first(eval_metrics, 'client_work/eval/', 'loss'),
          'eval_accuracy': _first(eval_metrics, 'client_work/eval/',
                                  'accuracy'),
      }
      row.update(last_eval)
    if task.problem is not None:
      row['objective'] = float(task.problem.report(
          process.get_model_weights(state).trainable))
    row['seconds'] = time.perf_counter() - started
    # Release first, then checkpoint: a kill between the two resumes from
    # the previous checkpoint and re-runs this round (same seeds, same
    # result), whose CSV row is then rewritten (the CSV release manager drops
    # rows >= the released key). The other order would lose this round's row.
    release = {k: v for k, v in row.items() if k != 'round'}
    asyncio.run(csv_manager.release(release, key=round_num))
    asyncio.run(tb_manager.release(
        {k: v for k, v in release.items() if math.isfinite(v)},
        key=round_num))
    if round_num % config.checkpoint_every == 0 or round_num == config.rounds:
      _save_checkpoint(manager, collections.OrderedDict(
          learning=state, ledger=np.asarray(json.dumps(ledger.to_dict()))),
                       round_num)
      _atomic_write_json(os.path.join(out, 'ledger.json'),
                         _ledger_report(ledger, config, noise_multiplier))
    if progress is None:
      measure = (f'{task.problem.report_name}={row["objective"]:.6g} '
                 if task.problem is not None else
                 f'eval_accuracy={row["eval_accuracy"]:.4f} ')
      print(f'round {round_num}/{config.rounds} loss={row["train_loss"]:.4f} '
            f'{measure}'
            f'clip_norm={row["clip_norm"]:.4g} epsilon={epsilon:.4g}',
            flush=True)
    else:
      progress.update(1)
      postfix = collections.OrderedDict(loss=f'{row["train_loss"]:.3f}')
      if task.problem is not None:  # Synthetic problems: no accuracy.
        postfix[task.problem.report_name] = f'{row["objective"]:.4g}'
      else:
        postfix['acc'] = f'{last_eval.get("eval_accuracy", math.nan):.3f}'
      postfix.update(clip=f'{row["clip_norm"]:.3g}', eps=f'{epsilon:.3g}')
      progress.set_postfix(postfix)
  if progress is not None:
    progress.close()

  summary = _summary(config, ledger, noise_multiplier, last_eval,
                     len(client_ids))
  if task.problem is not None:
    # The synthetic problems' measure of progress (f(w) - f(w*), ||x||^2).
    summary['objective_name'] = task.problem.report_name
    summary['final_objective'] = float(task.problem.report(
        process.get_model_weights(state).trainable))
  _atomic_write_json(os.path.join(out, 'summary.json'), summary)
  _atomic_write_json(os.path.join(out, 'ledger.json'),
                     _ledger_report(ledger, config, noise_multiplier))
  from tff_clip import plotting  # pylint: disable=g-import-not-at-top
  plotting.plot_metrics(os.path.join(out, 'metrics.csv'),
                        os.path.join(out, 'plot.png'),
                        title=config.experiment_name)
  return summary


def _first(metrics, prefix, suffix):
  for key, value in metrics.items():
    if key.startswith(prefix) and key.endswith(suffix):
      return value
  for key, value in metrics.items():
    if key.endswith(suffix):
      return value
  return math.nan


def _ledger_report(ledger, config, noise_multiplier):
  report = {'delta': config.delta, 'noise_multiplier': noise_multiplier,
            'sampling': config.sampling, 'ledger': ledger.to_dict()}
  if len(ledger):
    report['epsilon_per_round'] = [
        [r, e] for r, e in ledger.epsilon_history(config.delta)]
  return report


def _summary(config, ledger, noise_multiplier, last_eval, population):
  summary = collections.OrderedDict(
      experiment=config.experiment_name, task=config.task,
      rounds=config.rounds, population_size=population,
      clients_per_round=config.clients_per_round, sampling=config.sampling,
      noise_multiplier=noise_multiplier, delta=config.delta,
      final_eval_accuracy=last_eval.get('eval_accuracy', math.nan),
      final_eval_loss=last_eval.get('eval_loss', math.nan))
  if noise_multiplier is not None and len(ledger):
    summary['epsilon'] = ledger.epsilon(config.delta)
    if noise_multiplier > 0:
      # Same noise on the average (z / n fixed) at production scale.
      scaled_z = (noise_multiplier / config.clients_per_round *
                  EXTRAPOLATION_CLIENTS_PER_ROUND)
      summary['extrapolated'] = collections.OrderedDict(
          population_size=EXTRAPOLATION_POPULATION,
          clients_per_round=EXTRAPOLATION_CLIENTS_PER_ROUND,
          noise_multiplier=scaled_z,
          epsilon=accounting.compute_training_epsilon(
              scaled_z, clients_per_round=EXTRAPOLATION_CLIENTS_PER_ROUND,
              population_size=EXTRAPOLATION_POPULATION, rounds=config.rounds,
              delta=config.delta,
              sampling=sampling_lib.accounting_sampling(config.sampling)
          ).epsilon)
  else:
    summary['epsilon'] = math.inf
  return summary
