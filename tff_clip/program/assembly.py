"""Assembling a run's parts from its configuration (`TrainConfig`).

Everything a `TrainConfig` decides about what runs is read here, once:

* the noise multiplier, given or calibrated from `target_epsilon`
  (`tff_clip.program.preflight.resolve_noise_multiplier`);
* the model aggregator (`build_aggregator`: bounding, then noise, then
  mean) and the learning process with its optimizers (`build_process`);
* the execution: in-process, or split with TFF's workers
  (`set_execution_context`, `runners`);
* a `Session`: the task, the sampler, the client data, the traced and
  wrapped processes, and what a round accounts (`Session.round_event`),
  shared by runs in one process that differ only in where they write and
  how long they run (`session`).

The round loop (`tff_clip.program.program_logic`) is handed these parts and reads
no configuration. Importing this module imports no TensorFlow (TensorFlow
and TFF are imported when something is built).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import math
from typing import Optional

from absl import logging
import numpy as np

from tff_clip.names import MIN_SEPARATION
from tff_clip.privacy import accounting
from tff_clip.privacy import sampling as sampling_lib
from tff_clip.program import client_execution
from tff_clip.program import config as config_lib
from tff_clip.program import hyperparameters
from tff_clip.program import process_cache
from tff_clip.program import preflight
from tff_clip.program import program_logic
from tff_clip.program import task_values
from tff_clip.program.config import ConfigError, TrainConfig

__all__ = [
    'Session', 'build_aggregator', 'build_process', 'runners', 'session',
    'set_execution_context',
]

# ----------------------------------------------------------------------------
# Execution: in-process, on local TFF workers, or on remote ones.


def set_execution_context(config: TrainConfig) -> None:
  """Local C++ runtime, the same on visible GPUs, or remote TFF workers."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip.runtime import execution  # pylint: disable=g-import-not-at-top
  execution.close_tff_context_at_exit()
  if config.executor == 'gpu':
    gpus = tf.config.list_physical_devices('GPU')
    if not gpus:
      raise ConfigError(
          '`executor=gpu` but TensorFlow sees no GPU. Install '
          '`tensorflow[and-cuda]==2.14.1` (pip install -e ".[gpu]") on a '
          'machine with an NVIDIA driver, or use --executor=local.')
    logging.info('GPUs visible: %s', gpus)
  if _in_process(config):
    return  # `runners` wraps the processes; no TFF context is used.
  if config.executor in ('inprocess', 'local', 'gpu'):
    try:
      execution.set_local_cpp_context(
          max_concurrent_clients=config.max_concurrent_clients)
    except execution.WorkerIsolationError as e:
      from tff_clip.runtime import worker_isolation  # pylint: disable=g-import-not-at-top
      raise ConfigError(worker_isolation.executor_refusal(
          config.executor, e)) from e
  else:
    try:
      contexts = [
          execution.create_remote_async_context(
              worker, timeout_s=config.worker_timeout_s)
          for worker in config.workers
      ]
    except (TimeoutError, ConnectionError) as e:
      raise ConfigError(f'--workers: {e}') from e
    execution.set_default_context(
        tff.backends.native.create_mergeable_comp_execution_context(contexts))


def _in_process(config: TrainConfig) -> bool:
  return config.executor == 'inprocess'


def runners(config: TrainConfig, *processes):
  """What runs the processes: all in-process, or split with TFF's workers.

  Off `executor=inprocess`, `split_execution.SplitRunner` keeps the server's
  half of each round (and the DP noise key) here and sends only the clients'
  work to TFF's C++ workers. Either way: the processes' `initialize`,
  `next`, `get_model_weights` and `set_model_weights`."""
  from tff_clip.runtime import execution  # pylint: disable=g-import-not-at-top
  from tff_clip.runtime import simulation  # pylint: disable=g-import-not-at-top
  from tff_clip.runtime import split_execution  # pylint: disable=g-import-not-at-top
  if _in_process(config):
    def make(process):
      return simulation.InProcessRunner(
          process, client_threads=config.max_concurrent_clients)
  else:
    targets = (execution.local_worker_targets
               if config.executor != 'remote' else lambda: config.workers)
    def make(process):
      return split_execution.for_workers(
          process, worker_targets=targets,
          worker_timeout_s=config.worker_timeout_s)
  try:
    return tuple(make(p) for p in processes)
  except ValueError as e:  # Not a MapReduceForm: names --executor=local.
    raise ConfigError(f'--executor: {e}') from e
  except split_execution.SecretLeakError as e:
    raise ConfigError(f'--executor={config.executor}: {e}') from e


# ----------------------------------------------------------------------------
# The aggregator and the learning process.


def _client_optimizer(config):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  lr = config.client_learning_rate
  return {
      'sgd': lambda: tff.learning.optimizers.build_sgdm(lr),
      'sgdm': lambda: tff.learning.optimizers.build_sgdm(lr, momentum=0.9),
      'adam': lambda: tff.learning.optimizers.build_adam(lr),
  }[config.client_optimizer]()


def resolved_server_step(config: TrainConfig, noise_multiplier) -> str:
  """'damped', 'held' or 'fixed': --server_step, or for 'auto' (the default)
  damped in a DP run of tff_clip's own boundings with independent noise and
  fixed otherwise (no DP; TFF's baselines, which keep TFF's server step; and
  correlated noise, whose rounds' noise is anti-correlated by design, which
  the damping would read as oscillation: `server_step.oscillation_damped`)."""
  if config.server_step != 'auto':
    return config.server_step
  private = noise_multiplier is not None
  return ('damped' if private and config_lib.baseline(config) is None
          and not config.noise.correlated else 'fixed')


def _server_optimizer(config, noise_multiplier=None):
  from tff_clip.learning import server_step  # pylint: disable=g-import-not-at-top
  optimizer = _plain_server_optimizer(config)
  step = resolved_server_step(config, noise_multiplier)
  # Both read only the aggregate the round releases: post-processing.
  if step in ('damped', 'held'):
    optimizer = server_step.oscillation_damped(optimizer)
  if step == 'held':
    optimizer = server_step.growth_held(optimizer)
  return optimizer


def _plain_server_optimizer(config):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip.learning import optimizers  # pylint: disable=g-import-not-at-top
  lr = config.server_learning_rate
  return {
      'sgd': lambda: tff.learning.optimizers.build_sgdm(lr),
      'sgdm': lambda: tff.learning.optimizers.build_sgdm(
          lr, momentum=config.server_momentum),
      'adam': lambda: tff.learning.optimizers.build_adam(lr),
      'lamb': lambda: optimizers.build_lamb(lr),
      'lars': lambda: optimizers.build_lars(lr),
  }[config.server_optimizer]()


# TFF's own default target quantile (`gaussian_adaptive`,
# `tree_adaptive`): what TFF's baselines track where --target_quantile is
# not given (tff_clip's own boundings follow the noise instead).
TFF_TARGET_QUANTILE = 0.5


# TFF's tree baseline holds its value and count noise in float32, rounded to
# nearest: up to half a float32 ulp (2^-24 relative) below the z it was
# given. Its rounds are accounted at z (1 - 2^-22): never noisier than it ran.
TFF_FLOAT32_SLACK = 1.0 - 2.0**-22


def baseline_quantile(config: TrainConfig) -> float:
  """The target quantile a TFF baseline (--bounding=tff_*) tracks."""
  return (TFF_TARGET_QUANTILE if config.target_quantile is None else
          config.target_quantile)


def _tff_tree(config: TrainConfig, noise_multiplier: float):
  from tff_clip.program import tff_tree  # pylint: disable=g-import-not-at-top
  return tff_tree.TreeAdaptiveFactory(
      noise_multiplier, config.clients_per_round, config.initial_clip_norm,
      baseline_quantile(config), config.clip_learning_rate,
      config.clipped_count_stddev, restart_every=config.bands,
      noise_seed=config.noise_seed)


def _tff_gaussian(config: TrainConfig, noise_multiplier: float):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  n = float(config.clients_per_round)
  factory = tff.aggregators.DifferentiallyPrivateFactory
  if config.clip_norm == 'adaptive':
    return factory.gaussian_adaptive(
        noise_multiplier, n, initial_l2_norm_clip=config.initial_clip_norm,
        target_unclipped_quantile=baseline_quantile(config),
        learning_rate=config.clip_learning_rate,
        clipped_count_stddev=config.clipped_count_stddev)
  return factory.gaussian_fixed(noise_multiplier, n, float(config.clip_norm))


# The aggregators of the --bounding baselines (`config.BASELINES`).
_BASELINE_AGGREGATORS = {
    config_lib.NO_BOUNDING: lambda config, noise_multiplier: None,
    config_lib.TFF_TREE: _tff_tree,
    config_lib.TFF_GAUSSIAN: _tff_gaussian,
}


def build_aggregator(config: TrainConfig, noise_multiplier: Optional[float],
                     resolved=None):
  """The model aggregator: bounding, then (when private) noise, then mean.
  `resolved`: the session's `resolve_mechanism`, which the DP factory builds
  from (None: it resolves at `create`, as for a library user)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip.aggregation import aggregators, dp  # pylint: disable=g-import-not-at-top
  if config_lib.baseline(config) is not None:
    return _BASELINE_AGGREGATORS[config.bounding](config, noise_multiplier)
  if noise_multiplier is not None:
    # --noise_seed None: a key from OS entropy, drawn in the graph at
    # initialize and kept only in the (checkpointed) aggregator state.
    return dp.DPBoundingFactory(config.dp_spec(noise_multiplier),
                                resolved=resolved)
  if config.clip_norm == 'adaptive':
    # CE-FedAvg with a moving threshold, noise-free.
    clip_norm = tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
        initial_estimate=config.initial_clip_norm,
        target_quantile=(resolved or resolve_mechanism(  # d plays no part.
            config, None, 1)).target_quantile,
        learning_rate=config.clip_learning_rate, multiplier=1.0,
        increment=0.0, secure_estimation=False)
  else:
    clip_norm = float(config.clip_norm)
  return aggregators.bounding_factory(config.bounding, clip_norm, config.split)


def server_parts(config: TrainConfig, noise_multiplier: Optional[float],
                 model_aggregator=None, resolved=None):
  """(model aggregator, server optimizer, client weighting) of `config`:
  what the process's server side is built from (`model_aggregator`, where
  given, in place of `config`'s; `resolved`: `build_aggregator`'s)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  # DP-FedAvg weighs clients uniformly (the sensitivity must not depend on
  # private example counts); otherwise FedAvg's example weighting.
  weighting = (tff.learning.ClientWeighting.UNIFORM
               if noise_multiplier is not None else None)
  return (model_aggregator or
          build_aggregator(config, noise_multiplier, resolved),
          _server_optimizer(config, noise_multiplier), weighting)


def build_process(config: TrainConfig, task, noise_multiplier,
                  model_aggregator=None, resolved=None):
  from tff_clip.learning import algorithms  # pylint: disable=g-import-not-at-top
  aggregator, server_optimizer, weighting = server_parts(
      config, noise_multiplier, model_aggregator, resolved)
  return algorithms.build_fedavg(
      task.model_fn,
      client_optimizer=_client_optimizer(config),
      server_optimizer=server_optimizer,
      local_clip_norm=config.local_clip_norm,
      blur_strength=config.blur_strength,
      blur_clip_norm=config_lib.blur_clip_norm(config),
      lus_sparsity=config.lus_sparsity,
      model_aggregator=aggregator,
      client_weighting=weighting)


def resolve_mechanism(config: TrainConfig, noise_multiplier,
                      dimension: int, layers: int = 1):
  """What the run's aggregator resolves its defaults to, from public numbers
  (the noise multiplier z, None without DP; the cohort n; the model's size
  d): `noise_following.resolve` of the run's `DPSpec` (what
  `dp.DPBoundingFactory` builds from), or for a baseline --bounding its own
  name and TFF's target quantile (None without an adaptive norm)."""
  from tff_clip.aggregation import noise_following  # pylint: disable=g-import-not-at-top
  if config_lib.baseline(config) is None:
    return noise_following.resolve(
        config.dp_spec(noise_multiplier or 0.0), dimension, layers=layers,
        private=noise_multiplier is not None)
  adaptive = (config.clip_norm == 'adaptive' and
              config.bounding != config_lib.NO_BOUNDING)
  return noise_following.ResolvedMechanism(
      bounding=config.bounding,
      target_quantile=baseline_quantile(config) if adaptive else None,
      quantile_switch=None, noise_multiplier=noise_multiplier,
      dimension=dimension, clients_per_round=config.clients_per_round,
      layers=layers)


def resolved_choices(config: TrainConfig, noise_multiplier,
                     dimension: int, mechanism=None) -> dict:
  """What this tff_clip resolves the run's defaults to, from public numbers:
  the mechanism (`resolve_mechanism`: the bounding, the tracked target
  quantile and its switch, with the z, d and n they were resolved from),
  the server step (--server_step=auto), the client groups
  (`sampling.group_scheme`) and an optimized noise's parameters
  (`NoiseMechanism.record`). A run records them when it starts
  (`run_directory.RESOLVED_KEY`): a rerun under another rule refuses.
  `mechanism`: the session's resolution, else resolved from z, d and n."""
  if mechanism is None:
    mechanism = resolve_mechanism(config, noise_multiplier, dimension)
  return collections.OrderedDict(
      mechanism.to_dict(),
      server_step=resolved_server_step(config, noise_multiplier),
      client_groups=sampling_lib.group_scheme(config.sampling),
      noise_factorization=(None if noise_multiplier is None
                           else config.noise.record()))


def _eval_dataset(task, split: str):
  """The centralized data evaluation measures: 'test' or 'validation'."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  test = (task.datasets.validation_data if split == 'validation'
          else task.datasets.test_data)
  if isinstance(test, tff.simulation.datasets.ClientData):
    test = test.create_tf_dataset_from_all_clients()
  preprocess = task.datasets.eval_preprocess_fn
  return preprocess(test) if preprocess is not None else test


def _state_type(runner):
  state_type = getattr(runner, 'state_type', None)
  if state_type is None:  # A TFF process run whole on the workers.
    state_type = runner.next.type_signature.parameter[0].member
  return state_type


def _model_layout(runner) -> Optional[dict[str, int]]:
  """{'trainable': n, 'non_trainable': m}: the state's first n + m leaves
  are the global model (`tff.learning.models.ModelWeights`); None when the
  state does not start with it."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  def count(type_spec):
    if isinstance(type_spec, tff.TensorType):
      return 1
    if isinstance(type_spec, tff.StructType):
      return sum(count(t) for _, t in tff.structure.to_elements(type_spec))
    return 0

  state_type = _state_type(runner)
  if isinstance(state_type, tff.FederatedType):
    state_type = state_type.member
  elements = (tff.structure.to_elements(state_type)
              if isinstance(state_type, tff.StructType) else [])
  if not elements or elements[0][0] != 'global_model_weights':
    return None
  weights = dict(tff.structure.to_elements(elements[0][1]))
  if set(weights) != {'trainable', 'non_trainable'}:
    return None
  return {name: count(weights[name]) for name in ('trainable',
                                                  'non_trainable')}


# ----------------------------------------------------------------------------
# The session: everything built before the first file is written.


class Session:
  """Everything built from a configuration before the first file is written.

  The task, its clients and their data (`client_datasets`), the cohort
  sampler, the noise multiplier, the learning process (wrapped by
  `runners`), the evaluation of the server's data (`ServerEvaluation`,
  built on the first `evaluate`), the model's initial weights and the
  canary auditor. It holds no run's state: `initial_state` draws one (with a
  fresh noise key), or a run restores its checkpoint.
  """

  def __init__(self, config: TrainConfig, task_builder):
    self.config = config
    try:
      self.task = task_builder(config)
    except ValueError as e:  # E.g. a partition that leaves a client empty.
      raise config_lib.flag_error(e) from e
    if (config.eval_split == 'validation' and
        self.task.datasets.validation_data is None):
      raise ConfigError(
          f'--eval_split=validation: task {self.task.name!r} has no '
          'validation data; hold some out with --validation_fraction.')
    self.client_ids = list(self.task.datasets.train_data.client_ids)
    self.population = len(self.client_ids)
    config = self.config = preflight.with_population(config, self.population)
    self.noise_multiplier = preflight.resolve_noise_multiplier(config,
                                                     self.population)
    self.private = self.noise_multiplier is not None
    try:  # E.g. a minimum-separation group smaller than the cohort.
      self.sampler = sampling_lib.ClientSampler(
          self.client_ids, config.clients_per_round, config.sampling,
          config.seed, config.separation)
    except ValueError as e:
      raise config_lib.flag_error(e) from None
    self.dimension, layers = task_values.model_size(self.task, config.seed)
    if self.private and config.noise.state_vectors:
      # Before tracing and `initialize`: refused in seconds, not an
      # out-of-memory crash halfway.
      preflight.check_noise_memory(config, self.dimension)
    self.auditor = None
    # Resolved once, from z, n and the model: the DP factory is built from
    # this object and the run records it (`resolved_choices`).
    try:
      self.mechanism = resolve_mechanism(config, self.noise_multiplier,
                                         self.dimension, layers)
    except ValueError as e:  # E.g. explicit count noise too small.
      raise ConfigError(str(e).splitlines()[0]) from e
    # Loaded in this process already, or from disk; None: traced and stored,
    # the entry locked meanwhile (a sweep's other job waits, then loads it).
    with process_cache.claimed_runner(
        config, task_builder, self.noise_multiplier, self.task,
        server_parts) as (cached, cache_key):
      if cached is None:
        try:
          if config.audit_canaries:  # Canaries inside the DP query.
            from tff_clip.privacy import audit  # pylint: disable=g-import-not-at-top
            separated = config.sampling == MIN_SEPARATION
            # Under minimum separation a canary takes part in every round of
            # its group: the most participations the ledger allows a client.
            self.auditor = audit.CanaryFactory(
                build_aggregator(config, self.noise_multiplier,
                                 self.mechanism),
                config.audit_canaries,
                1.0 if separated else self.sampler.sampling_probability,
                separation=config.separation if separated else None)
          self.process = build_process(config, self.task, self.noise_multiplier,
                                       self.auditor, self.mechanism)
        except ValueError as e:  # E.g. explicit count noise too small.
          raise ConfigError(str(e).splitlines()[0]) from e
      self.initial_weights = task_values.initial_model_weights(
          self.task, config.seed)
      # Recorded at start: RESOLVED_KEY.
      self.resolved = resolved_choices(config, self.noise_multiplier,
                                       self.dimension, self.mechanism)
      self.bounding = self.resolved['bounding']
      self.target_quantile = self.resolved['target_quantile']
      self.server_step = self.resolved['server_step']
      if cached is None:
        from tff_clip.runtime import runner_cache  # pylint: disable=g-import-not-at-top
        (self.process,) = runners(config, self.process)
        if cache_key is not None:
          hyperparameters.annotate(self.process, config, self.noise_multiplier)
        runner_cache.store(cache_key, config.max_concurrent_clients,
                           self.process)
      self.process = self.process if cached is None else cached
    self.test_data = _eval_dataset(self.task, config.eval_split)
    # The traced calls' keys: the cohort's; the evaluation's, the shape's.
    self.trace_key = process_cache.trace_key(
        config, task_builder, self.noise_multiplier, self.task, self.process)
    self.model_key = process_cache.graph_cache_key(
        config, task_builder, self.noise_multiplier, self.task)
    self.client_datasets, self.process, self.client_execution = (
        client_execution.clients(
            config, self.task, self.process, self.noise_multiplier,
            functools.partial(server_parts, resolved=self.mechanism),
            trace_key=self.trace_key))

  def initial_state(self):
    return self.process.set_model_weights(self.process.initialize(),
                                          self.initial_weights)

  def round_event(self, state, round_num):
    """The DP event round `round_num` ran, its sampling included (DP runs).

    The event the aggregator's state reports, as the round sampled its
    cohort: Poisson or fixed-size sampling of the population, or one
    participation per cycle of minimum separation.
    """
    from tff_clip.aggregation import dp  # pylint: disable=g-import-not-at-top
    baseline = config_lib.baseline(self.config)
    if baseline is not None and not baseline.reports_events:
      # E.g. TFF's restarted tree (--noise_mechanism=tree): accounted as
      # tff_clip's same mechanism, at the least z its float32 state runs.
      event = self.config.noise.participation_event(
          self.noise_multiplier * TFF_FLOAT32_SLACK)
    else:
      event = dp.extract_dp_event(state.aggregator)
    if self.config.sampling == MIN_SEPARATION:
      # Rounds run from 1: cycle c is rounds c b + 1 .. c b + b, the
      # aggregator's rounds (its tree restarts) c b .. c b + b - 1.
      return accounting.min_separation_round_event(
          event, round_num - 1, self.config.separation)
    return accounting.round_event(event, self.config.clients_per_round,
                                  self.population, self.config.sampling)

  @property
  def objective(self):
    """`report(trainable weights)` of a synthetic problem's task, or None."""
    problem = getattr(self.task, 'problem', None)
    return None if problem is None else problem.report

  def state_leaves(self, state) -> list:
    """The state as the flat arrays a checkpoint holds."""
    from tff_clip.runtime import tf_graphs  # pylint: disable=g-import-not-at-top
    return [np.asarray(leaf) for leaf in
            tf_graphs.flatten_value(state, _state_type(self.process), [])]

  def state_from_leaves(self, leaves):
    """The inverse of `state_leaves`."""
    from tff_clip.runtime import tf_graphs  # pylint: disable=g-import-not-at-top
    return tf_graphs.pack_value(_state_type(self.process), leaves)

  @functools.cached_property
  def model_layout(self) -> Optional[dict[str, int]]:
    """Where the state's leaves hold the global model (`_model_layout`)."""
    return _model_layout(self.process)

  def audit_report(self, state):
    """Empirical epsilon of the canaries (`tff_clip.privacy.audit`), or None."""
    if self.auditor is None:
      return None
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tff_clip.privacy import audit  # pylint: disable=g-import-not-at-top
    # theta_0 - theta_T: TFF's updates are (initial - trained) weights.
    movement = [np.asarray(initial) - np.asarray(final) for final, initial in
                zip(self.process.get_model_weights(state).trainable,
                    self.initial_weights.trainable)]
    query = self.auditor.build_query(
        tff.types.to_type([(x.dtype, x.shape) for x in movement]))
    return audit.audit_report(query, state.aggregator, movement,
                              self.config.delta, self.config.audit_confidence)

  def evaluate(self, state):
    """Loss and accuracy on the server-held test data: plain TensorFlow,
    whichever runtime trains (the data never leaves the server)."""
    return self._evaluation(self.process.get_model_weights(state),
                            self.test_data)

  @functools.cached_property
  def _evaluation(self):
    from tff_clip.learning import evaluation  # pylint: disable=g-import-not-at-top
    return evaluation.server_evaluation(self.task.model_fn, self.model_key)


_SESSIONS_KEPT = 3
_sessions = collections.OrderedDict()
# Dropped before the interpreter tears its modules down: a traced function
# freed after that prints a TypeError traceback from TensorFlow's finalizer.
atexit.register(_sessions.clear)


def session(config: TrainConfig, task_builder) -> Session:
  """The session of `config`, built once per process where that is safe.

  Runs in one process (tests, notebooks, sweeps) that differ only in where
  they write and how long they run share the task, the traced process, the
  in-process runner and the client tensors: nothing is traced twice (but a
  run of fewer rounds than `client_execution.VECTORIZED_RECORDS_FROM` sums
  its records another way). A run calibrated by `target_epsilon` shares only
  with runs of as many rounds. A session holds no run's state (the state,
  with its noise key, is drawn by `initial_state` or restored from the
  run's checkpoint). Runs on TFF's workers and audited runs always
  build their own. Runs that differ in their seed (or another
  `process_cache.DATA_ONLY` field) build their own session but share its
  in-process runner, where the graph cache is on
  (`tff_clip.runtime.runner_cache`). Runs with correlated noise share only
  with runs of as many rounds (`process_cache.not_built_from`).
  """
  if config.executor != 'inprocess' or config.audit_canaries:
    return Session(config, task_builder)
  ignored = set(process_cache.not_built_from(config))
  if config.target_epsilon is not None:
    ignored.discard('rounds')  # The noise is calibrated for the rounds.
  defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)
              if f.name in ignored}
  key = (task_builder, dataclasses.replace(config, **defaults),
         config.rounds >= client_execution.VECTORIZED_RECORDS_FROM)
  try:
    built = _sessions.pop(key, None)
  except TypeError:  # An unhashable field value: build afresh.
    return Session(config, task_builder)
  _sessions[key] = built = built or Session(config, task_builder)
  while len(_sessions) > _SESSIONS_KEPT:
    _sessions.popitem(last=False)
  return built
