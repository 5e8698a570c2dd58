"""The training program behind `python -m scripts.train`.

Data flows one way, one call site per arrow: task (the caller's
`task_builder`; `scripts.program.build_task` for the `--task` names) ->
client work (`algorithms.build_fedavg`: local training, optional per-step
clipping, BLUR, LUS) -> bounding (`aggregators`) -> noise (`dp`) -> mean ->
server optimizer -> ledger (`privacy_ledger.PrivacyLedger`) and metrics.

A run directory is a record, never silently changed. Everything is checked
(flags, task, sizes, DP feasibility, workers) before the first file is
written; a different configuration in an existing directory is refused; a
finished run is reported and left untouched; a killed run resumes from its
last checkpoint. What a round does depends on (seed, round number) and the
checkpointed state: the cohort (`sampling.ClientSampler`), the client data
order, and the DP noise, whose key is drawn from OS entropy and kept only in
the checkpointed aggregator state (or comes from `--noise_seed`, which makes
the run reproducible and NOT private).

What a DP run releases (see `RELEASED` / `NOT_COVERED`): the model, epsilon,
the clip norm (from the noised DP state) and evaluation on server-held test
data are covered by the ledger. The realised cohort size, client training
metrics, a synthetic task's objective (computed on the clients' data) and
round timings are not: they are withheld unless `release_uncovered_metrics`,
and then listed in `summary.json` under `not_covered_by_epsilon`. Rounds
with an empty Poisson cohort run (noise only), so the ledger counts what
happened.

Outputs under `root_output_dir/experiment_name/` (docs/run_directory.md):
  config.json     the configuration (a rerun must match it to resume)
  releases.jsonl  the released rows and DP events, hash-chained (`run_records`)
  metrics.csv     the released rows, a view of releases.jsonl
  tensorboard/    the same rows (`tff.program.TensorBoardReleaseManager`)
  checkpoints/    the state as flat arrays, naming the release they follow
  ledger.json     the DP events of every round and epsilon per round
  summary.json    final figures; plot.png: accuracy, loss, clip norm, epsilon

References:
* Yang, Qiu, Liu 2022: "Taming Fat-Tailed Noise in Federated Learning",
  NeurIPS 2022.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import dataclasses
import glob
import math
import os
import sys
import time
from typing import Any, Callable, Optional

from absl import logging
import numpy as np

from tff_clip import accounting
from tff_clip import assembly
from tff_clip import privacy_ledger
from tff_clip import run_directory
from tff_clip import run_records
from tff_clip import sampling as sampling_lib
from tff_clip.config import BOUNDINGS, CLIENT_OPTIMIZERS, EXECUTION_KEYS, EXECUTORS, RENAMED_KEYS, SERVER_OPTIMIZERS  # pylint: disable=unused-import
from tff_clip import config as config_lib
from tff_clip.config import ConfigError, TrainConfig, validate

__all__ = ['ConfigError', 'TaskBuilder', 'TrainConfig', 'run', 'validate']

# `task_builder(config) -> task` (see `run`).
TaskBuilder = Callable[[TrainConfig], Any]

# The honest-extrapolation point of the summary: a production-scale cohort.
EXTRAPOLATION_POPULATION = 1_000_000
EXTRAPOLATION_CLIENTS_PER_ROUND = 1_000

# Per-round columns a DP run releases: covered by epsilon (or public).
RELEASED = ('round', 'epsilon', 'clip_norm', 'eval_loss', 'eval_accuracy')
# Data-dependent columns epsilon does not cover: the realised cohort size
# (Poisson), client-side training metrics, a synthetic task's objective
# (computed on the clients' data) and round timings (which grow with the
# cohort). Released under DP only with `release_uncovered_metrics`.
NOT_COVERED = ('clients', 'train_loss', 'train_accuracy', 'objective',
               'seconds')


# ----------------------------------------------------------------------------
# The run directory: read-only checks first, writes only once all is checked.


# Building blocks (TFF imported lazily so `validate` stays instant).


def set_execution_context(config: TrainConfig) -> None:
  """Local C++ runtime, the same on visible GPUs, or remote TFF workers."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip import execution  # pylint: disable=g-import-not-at-top
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
      raise ConfigError(f'--executor={config.executor}: {e} Use the default '
                        '--executor=inprocess, which starts no worker.'
                        ) from e
  else:
    try:
      contexts = [
          execution.create_remote_async_context(
              worker, timeout_s=config.worker_timeout_s)
          for worker in config.workers
      ]
    except (TimeoutError, ConnectionError) as e:
      raise ConfigError(f'--workers: {e}') from e
    tff.backends.native.set_mergeable_comp_execution_context(contexts)


def _in_process(config: TrainConfig) -> bool:
  return config.executor == 'inprocess'


def runners(config: TrainConfig, *processes):
  """What runs the processes: all in-process, or split with TFF's workers.

  Off `executor=inprocess`, `tff_clip.split_execution.SplitRunner` keeps the
  server's half of each round (and the DP noise key) here and sends only the
  clients' work to TFF's C++ workers. Either way the result has the
  processes' `initialize`, `next`, `get_model_weights` and
  `set_model_weights`.
  """
  from tff_clip import execution  # pylint: disable=g-import-not-at-top
  from tff_clip import simulation  # pylint: disable=g-import-not-at-top
  from tff_clip import split_execution  # pylint: disable=g-import-not-at-top
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


def _secret_tree_seed(query):
  """`query` (a tensorflow-privacy DPQuery), with its tree noise keyed secretly.

  tensorflow-privacy's `GaussianNoiseGenerator` without a seed seeds itself
  from the clock (`floor(time * 1e6)`): guessable from a run's file times.
  Its state is `(seeds, stddev)`; in the initial state each generator's
  `seeds` (the value's tree and the quantile estimate's) are replaced by a
  `dp.secret_key()` of its own (OS entropy, drawn when the graph runs), so
  the tree noise is as secret as tff_clip's own.
  """
  import tensorflow_privacy as tfp  # pylint: disable=g-import-not-at-top
  from tff_clip import dp  # pylint: disable=g-import-not-at-top

  def reseeded(state, found):
    if isinstance(state, tuple) and hasattr(state, '_fields'):
      if state._fields == ('seeds', 'stddev'):
        found.append(state)
        return state._replace(seeds=dp.secret_key())
      return type(state)(*(reseeded(v, found) for v in state))
    if isinstance(state, (list, tuple)):
      return type(state)(reseeded(v, found) for v in state)
    if isinstance(state, dict):
      return type(state)((k, reseeded(v, found)) for k, v in state.items())
    return state

  class SecretSeedQuery(tfp.SumAggregationDPQuery):
    """Delegates to `query`; only its initial tree seeds differ."""

    def initial_global_state(self):
      found = []
      state = reseeded(query.initial_global_state(), found)
      if not found:  # The value's tree and the quantile's: two keys.
        raise RuntimeError('no tree noise generator state in '
                           f'{type(query).__name__} to key secretly.')
      return state

    def derive_sample_params(self, global_state):
      return query.derive_sample_params(global_state)

    def initial_sample_state(self, template=None):
      return query.initial_sample_state(template)

    def preprocess_record(self, params, record):
      return query.preprocess_record(params, record)

    def accumulate_preprocessed_record(self, sample_state, preprocessed):
      return query.accumulate_preprocessed_record(sample_state, preprocessed)

    def merge_sample_states(self, sample_state_1, sample_state_2):
      return query.merge_sample_states(sample_state_1, sample_state_2)

    def get_noised_result(self, sample_state, global_state):
      return query.get_noised_result(sample_state, global_state)

    def derive_metrics(self, global_state):
      return query.derive_metrics(global_state)

  return SecretSeedQuery()


class _TffTreeAdaptive:
  """TFF's `DifferentiallyPrivateFactory.tree_adaptive`, restarted every
  --bands rounds, built when the model's specs are known (`create`).

  The query is the one TFF's `tree_adaptive` builds (tensorflow-privacy's
  `QAdaClipTreeResSumQuery` in a `RestartQuery`, normalized by the expected
  cohort), with its noise seeded from OS entropy (`_secret_tree_seed`)
  unless --noise_seed makes the run reproducible.
  """

  def __new__(cls, config, noise_multiplier):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    class Factory(tff.aggregators.UnweightedAggregationFactory):

      def create(self, value_type):
        import tensorflow_privacy as tfp  # pylint: disable=g-import-not-at-top
        from tff_clip import dp  # pylint: disable=g-import-not-at-top
        specs = tff.types.type_to_tf_tensor_specs(value_type)
        n = float(config.clients_per_round)
        # tff_clip's default count noise: TFF's n / 20 fails at large z.
        count_stddev = config.clipped_count_stddev or (
            dp.default_clipped_count_stddev(noise_multiplier, n, 1))
        value_z, count_stddev = (
            tff.aggregators.differential_privacy.adaptive_clip_noise_params(
                noise_multiplier, n, count_stddev))
        query = tfp.QAdaClipTreeResSumQuery(
            config.initial_clip_norm, value_z, specs, config.target_quantile,
            config.clip_learning_rate, count_stddev, n,
            geometric_update=True, noise_seed=config.noise_seed)
        query = tfp.RestartQuery(
            query, tfp.restart_query.PeriodicRoundRestartIndicator(
                period=config.bands, warmup=None))
        query = tfp.NormalizedQuery(query, denominator=n)
        if config.noise_seed is None:
          query = _secret_tree_seed(query)
        return tff.aggregators.DifferentiallyPrivateFactory(query).create(
            value_type)

    return Factory()


def build_aggregator(config: TrainConfig, noise_multiplier: Optional[float]):
  """The model aggregator: bounding, then (when private) noise, then mean."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip import aggregators, dp  # pylint: disable=g-import-not-at-top
  if config.bounding == 'none':
    return None
  if config.bounding == config_lib.TFF_TREE:
    return _TffTreeAdaptive(config, noise_multiplier)
  if config.bounding == config_lib.TFF_GAUSSIAN:
    n = float(config.clients_per_round)
    factory = tff.aggregators.DifferentiallyPrivateFactory
    if config.clip_norm == 'adaptive':
      return factory.gaussian_adaptive(
          noise_multiplier, n, initial_l2_norm_clip=config.initial_clip_norm,
          target_unclipped_quantile=config.target_quantile,
          learning_rate=config.clip_learning_rate,
          clipped_count_stddev=config.clipped_count_stddev)
    return factory.gaussian_fixed(noise_multiplier, n,
                                  float(config.clip_norm))
  if noise_multiplier is not None:
    # --noise_seed None: a key from OS entropy, drawn in the graph at
    # initialize and kept only in the (checkpointed) aggregator state.
    return dp.DPBoundingFactory(config.dp_spec(noise_multiplier))
  if config.clip_norm == 'adaptive':
    # CE-FedAvg with a moving threshold, noise-free.
    clip_norm = tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
        initial_estimate=config.initial_clip_norm,
        target_quantile=config.target_quantile,
        learning_rate=config.clip_learning_rate, multiplier=1.0,
        increment=0.0, secure_estimation=False)
  else:
    clip_norm = float(config.clip_norm)
  return aggregators.bounding_factory(config.bounding, clip_norm, config.split)


def build_process(config: TrainConfig, task, noise_multiplier,
                  model_aggregator=None):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip import algorithms  # pylint: disable=g-import-not-at-top
  blur_clip_norm = config.blur_clip_norm
  if config.blur_strength is not None and blur_clip_norm is None:
    blur_clip_norm = float(config.clip_norm)
  return algorithms.build_fedavg(
      task.model_fn,
      client_optimizer=_client_optimizer(config),
      server_optimizer=_server_optimizer(config),
      local_clip_norm=config.local_clip_norm,
      blur_strength=config.blur_strength,
      blur_clip_norm=blur_clip_norm if config.blur_strength else None,
      lus_sparsity=config.lus_sparsity,
      model_aggregator=(model_aggregator or
                        build_aggregator(config, noise_multiplier)),
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


def _eval_dataset(task, split: str):
  """The centralized data evaluation measures: 'test' or 'validation'."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  test = (task.datasets.validation_data if split == 'validation'
          else task.datasets.test_data)
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
# Checkpoints (server-private: they hold the noise key) and released rounds.


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


def _state_leaves(runner, state) -> list:
  from tff_clip import tf_graphs  # pylint: disable=g-import-not-at-top
  return [np.asarray(leaf) for leaf in
          tf_graphs.flatten_value(state, _state_type(runner), [])]


def _state_from_leaves(runner, leaves):
  from tff_clip import tf_graphs  # pylint: disable=g-import-not-at-top
  return tf_graphs.pack_value(_state_type(runner), leaves)


def _event_dict(event):
  return None if event is None else privacy_ledger.event_to_dict(event)


def _restore(config, session, log, checkpoints):
  """(state, first round to train, pending (round, row, event) or None).

  Trusts a checkpoint only together with the log of released rounds: the
  checkpoint records the log hash of the last round it covers. A DP run
  whose released rounds no loadable checkpoint covers is refused (it would
  release them again), as is a log that lost rounds a checkpoint covers.
  """
  released = log.last_round
  found = checkpoints.load_latest(
      warn=lambda message: print(message, file=sys.stderr, flush=True))
  if found is None:
    if released == 0:
      return session.initial_state(), 1, None
    if session.private:
      raise run_directory.refusal(config, log, f'rounds 1-{released} were released '
                    f'({run_records.RELEASES}) but no loadable checkpoint '
                    'covers them (checkpoints/ is missing or damaged)')
    print(f'No loadable checkpoint: rounds 1-{released} run again (no DP).',
          flush=True)
    log.truncate(0)
    return session.initial_state(), 1, None
  version, leaves, header = found
  pending = header.get('pending')
  base = version - 1 if pending else version
  if released > version:
    if session.private:
      raise run_directory.refusal(config, log, f'rounds {version + 1}-{released} were '
                    f'released ({run_records.RELEASES}) but the newest '
                    f'loadable checkpoint is of round {version}')
    print(f'Rounds {version + 1}-{released} run again from the checkpoint of '
          f'round {version} (no DP).', flush=True)
    log.truncate(version)
    released = version
  if released < base:
    raise run_directory.refusal(config, log, f'the checkpoint of round {version} covers '
                  f'rounds up to {base} but {run_records.RELEASES} lists only '
                  f'{released}: the records of rounds {released + 1}-{base} '
                  'are lost')
  if log.hash_at(min(released, base)) != header.get('log_hash'):
    raise run_directory.refusal(config, log, f'the checkpoint of round {version} does not '
                  f'belong to {run_records.RELEASES} (the log hashes differ)')
  state = _state_from_leaves(session.process, leaves)
  if pending is not None and released == base:
    pending = (version, {k: math.nan if v is None else v
                         for k, v in pending['row'].items()},
               pending['event'])
  else:
    pending = None
  print(f'Resuming {config.output_dir}/ from its checkpoint after round '
        f'{version} of {config.rounds}.', flush=True)
  return state, version + 1, pending


# ----------------------------------------------------------------------------
# Releases.


def _records_release_manager(log, csv_path, resuming):
  """A `tff.program.ReleaseManager` of the run's records.

  `release(row, key=(round, event))` appends the round to `releases.jsonl`
  (durably; the record) and to metrics.csv, which is rebuilt from the log on
  resume (so a damaged or truncated file is repaired).
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  class RecordsReleaseManager(tff.program.ReleaseManager):

    def __init__(self):
      self._rows = log.rows()
      if resuming or os.path.lexists(csv_path):
        run_records.write_metrics_csv(csv_path, self._rows)

    async def release(self, value, key):
      round_num, event = key
      log.append(round_num, value, event)
      self._rows.append(log.row(round_num))  # As the log holds it.
      run_records.append_metrics_csv(csv_path, self._rows)

  return RecordsReleaseManager()


def released_metric(config: TrainConfig, private: bool):
  """The release filter: under DP, only what epsilon covers (by default).

  A `filter_fn` of `tff.program.FilteringReleaseManager` (True: release the
  metric at `path`); every release manager of a run is wrapped in it.
  """
  if not private or config.release_uncovered_metrics:
    return lambda path: True
  return lambda path: path[-1] not in NOT_COVERED


class _MetricsWriters:
  """Releases a round, once: the records, then TensorBoard.

  Both through `tff.program.FilteringReleaseManager` with
  `released_metric`: the records first (`releases.jsonl` is what a rerun
  trusts), then `tff.program.TensorBoardReleaseManager`, which skips steps
  it already holds. TensorBoard is a view of `releases.jsonl`: on resume,
  the released rounds it lacks (a kill between the two writes) are written
  to it first.
  """

  def __init__(self, out, log, resuming, config, private):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    keep = released_metric(config, private)
    self._records = tff.program.FilteringReleaseManager(
        _records_release_manager(log, os.path.join(out, 'metrics.csv'),
                                 resuming), keep)
    tb_dir = os.path.join(out, 'tensorboard')
    self._tb_dir = tb_dir
    self._tb_steps = _tensorboard_steps(tb_dir) if resuming else set()
    self._tb = self._tensorboard_call(lambda: tff.program.
                                      FilteringReleaseManager(
                                          tff.program.
                                          TensorBoardReleaseManager(tb_dir),
                                          keep))
    for row in log.rows():
      if row['round'] not in self._tb_steps:
        self._release_tensorboard(row['round'], row)

  def _tensorboard_call(self, fn):
    """`fn()`; a full disk or a bad directory is one `RunRecordError`."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    try:
      return fn()
    except (OSError, tf.errors.OpError) as e:
      reason = getattr(e, 'message', None) or str(e)
      if isinstance(e, tf.errors.ResourceExhaustedError) or (
          'No space left on device' in reason):
        reason = 'no space left on the device'
      # TensorFlow's messages open with {{function_node ...}}: not news.
      reason = ' '.join(reason.split('}}')[-1].split()) or type(e).__name__
      raise run_records.RunRecordError(
          f'cannot write {self._tb_dir}: {reason}. The released rounds are '
          f'recorded in {run_records.RELEASES}; a rerun writes them to '
          'TensorBoard.') from None

  def _release_tensorboard(self, round_num, row):
    # float32 scalars: a value beyond float32 (epsilon of a tiny z) is left
    # out like a non-finite one, never a failed write.
    values = {k: v for k, v in row.items()
              if k != 'round' and math.isfinite(v) and abs(v) <= _FLOAT32_MAX}
    self._tensorboard_call(
        lambda: asyncio.run(self._tb.release(values, key=round_num)))
    self._tb_steps.add(round_num)

  def release(self, round_num, row, event=None):
    asyncio.run(self._records.release(row, key=(round_num, event)))
    if round_num not in self._tb_steps:
      self._release_tensorboard(round_num, row)


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _tensorboard_steps(tb_dir):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  steps = set()
  for path in glob.glob(os.path.join(tb_dir, '**', 'events.out.tfevents.*'),
                        recursive=True):
    try:
      for record in tf.data.TFRecordDataset(path):
        event = tf.compat.v1.Event.FromString(record.numpy())
        if event.summary.value:
          steps.add(int(event.step))
    except tf.errors.DataLossError:  # A kill mid-write: the tail is torn.
      pass
  return steps


# ----------------------------------------------------------------------------
# The loop.


class _Session:
  """Everything built from a configuration before the first file is written."""

  def __init__(self, config: TrainConfig, task_builder):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    self.config = config
    try:
      self.task = task_builder(config)
    except ValueError as e:
      raise ConfigError(str(e).splitlines()[0]) from e
    if (config.eval_split == 'validation' and
        self.task.datasets.validation_data is None):
      raise ConfigError(
          f'--eval_split=validation: task {self.task.name!r} has no '
          'validation data; hold some out with --validation_fraction.')
    self.client_ids = list(self.task.datasets.train_data.client_ids)
    self.population = len(self.client_ids)
    self.noise_multiplier = assembly.resolve_noise_multiplier(config, self.population)
    self.private = self.noise_multiplier is not None
    try:  # E.g. a minimum-separation group smaller than the cohort.
      self.sampler = sampling_lib.ClientSampler(
          self.client_ids, config.clients_per_round, config.sampling,
          config.seed, config.separation)
    except ValueError as e:
      raise config_lib.flag_error(e) from None
    self.auditor = None
    try:
      if config.audit_canaries:  # Canaries inside the DP query.
        from tff_clip import audit  # pylint: disable=g-import-not-at-top
        separated = config.sampling == sampling_lib.MIN_SEPARATION
        # Under minimum separation a canary takes part in every round of its
        # group: the most participations the ledger allows a client.
        self.auditor = audit.CanaryFactory(
            build_aggregator(config, self.noise_multiplier),
            config.audit_canaries,
            1.0 if separated else self.sampler.sampling_probability,
            separation=config.separation if separated else None)
      self.process = build_process(config, self.task, self.noise_multiplier,
                                   self.auditor)
    except ValueError as e:  # E.g. explicit count noise too small.
      raise ConfigError(str(e).splitlines()[0]) from e
    self.initial_weights = initial_model_weights(self.task, config.seed)
    from tff_clip import client  # pylint: disable=g-import-not-at-top
    self.evaluation = tff.learning.algorithms.build_fed_eval(
        self.task.model_fn, loop_implementation=client.DEFAULT_LOOP)
    self.process, self.evaluation = runners(config, self.process,
                                            self.evaluation)
    self.test_data = _eval_dataset(self.task, config.eval_split)
    from tff_clip import client_data  # pylint: disable=g-import-not-at-top
    self.client_datasets = client_data.ClientDatasets(
        self.task, config.seed, config.local_steps)

  def initial_state(self):
    return self.process.set_model_weights(self.process.initialize(),
                                          self.initial_weights)

  def train_round(self, state, round_num, ledger):
    """Runs round `round_num`; returns (state, row of every metric)."""
    from tff_clip import dp  # pylint: disable=g-import-not-at-top
    started = time.perf_counter()
    cohort = self.sampler.sample(round_num)
    data = self.client_datasets.datasets(cohort, round_num)
    # An empty Poisson cohort still runs: the aggregator adds its noise to
    # an empty sum, so the released model does not reveal that it was empty.
    output = self.process.next(state, data)
    state = output.state
    metrics = {}
    _flatten('', output.metrics, metrics)
    self.last_event = None
    if self.private:  # The event the aggregator actually ran this round.
      if self.config.bounding == config_lib.TFF_TREE:
        # TFF's tree queries report UnsupportedDpEvent: the same restarted
        # tree (--noise_mechanism=tree), accounted as tff_clip's.
        event = self.config.noise.participation_event(self.noise_multiplier)
      else:
        event = dp.extract_dp_event(state.aggregator)
      if self.config.sampling == sampling_lib.MIN_SEPARATION:
        # Rounds run from 1: cycle c is rounds c b + 1 .. c b + b, the
        # aggregator's rounds (its tree restarts) c b .. c b + b - 1.
        event = accounting.min_separation_round_event(
            event, round_num - 1, self.config.separation)
      else:
        event = accounting.round_event(event, self.config.clients_per_round,
                                       self.population, self.config.sampling)
      self.last_event = event
      ledger.record(round_num, event)
    row = collections.OrderedDict(round=round_num, clients=len(cohort))
    row['train_loss'] = metrics.get('client_work/train/loss', math.nan)
    row['train_accuracy'] = metrics.get(
        'client_work/train/sparse_categorical_accuracy',
        metrics.get('client_work/train/accuracy', math.nan))
    row['clip_norm'] = next(
        (metrics[k] for k in ('aggregator/dp_query_metrics/clip_norm',
                              'aggregator/dp_query_metrics/clip',  # TFF's.
                              'aggregator/clip_norm') if k in metrics),
        math.nan)
    row['epsilon'] = (ledger.guarantee(self.config.delta).epsilon
                      if self.private else math.inf)
    if getattr(self.task, 'problem', None) is not None:
      row['objective'] = float(self.task.problem.report(
          self.process.get_model_weights(state).trainable))
    row['seconds'] = time.perf_counter() - started
    return state, row

  def audit_report(self, state):
    """Empirical epsilon of the canaries (`tff_clip.audit`), or None."""
    if self.auditor is None:
      return None
    from tff_clip import audit  # pylint: disable=g-import-not-at-top
    # theta_0 - theta_T: TFF's updates are (initial - trained) weights.
    movement = [np.asarray(initial) - np.asarray(final) for final, initial in
                zip(self.process.get_model_weights(state).trainable,
                    self.initial_weights.trainable)]
    return audit.audit_report(self.auditor.query, state.aggregator, movement,
                              self.config.delta, self.config.audit_confidence)

  def evaluate(self, state):
    """Loss and accuracy on the server-held test data."""
    eval_state = self.evaluation.set_model_weights(
        self.evaluation.initialize(), self.process.get_model_weights(state))
    metrics = {}
    _flatten('', self.evaluation.next(eval_state, [self.test_data]).metrics,
             metrics)
    return collections.OrderedDict(
        eval_loss=metrics.get('client_work/eval/current_round_metrics/loss',
                              math.nan),
        eval_accuracy=metrics.get(
            'client_work/eval/current_round_metrics/'
            'sparse_categorical_accuracy',
            metrics.get('client_work/eval/current_round_metrics/accuracy',
                        math.nan)))


# What a session is not built from: a later run in this process that differs
# from an earlier one only in these reuses its session (`_session`).
_NOT_BUILT_FROM = ('root_output_dir', 'experiment_name', 'rounds', 'eval_every',
                   'progress', 'checkpoint_every', 'checkpoint_interval_s',
                   'release_uncovered_metrics')
_SESSIONS_KEPT = 3
_sessions = collections.OrderedDict()
# Dropped before the interpreter tears its modules down: a traced function
# freed after that prints a TypeError traceback from TensorFlow's finalizer.
atexit.register(_sessions.clear)


def _session(config: TrainConfig, task_builder) -> _Session:
  """The session of `config`, built once per process where that is safe.

  Runs in one process (tests, notebooks, sweeps) that differ only in where
  they write and how long they run share the task, the traced process, the
  in-process runner and the client tensors: nothing is traced twice. A run
  calibrated by `target_epsilon` shares only with runs of as many rounds
  (its noise multiplier depends on them). A session holds no run's state
  (the state, with its noise key, is drawn by `initial_state` or restored
  from the run's checkpoint). Runs on TFF's workers and audited runs always
  build their own.
  """
  if config.executor != 'inprocess' or config.audit_canaries:
    return _Session(config, task_builder)
  ignored = set(_NOT_BUILT_FROM)
  if config.target_epsilon is not None:
    ignored.discard('rounds')  # The noise is calibrated for the rounds.
  defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)
              if f.name in ignored}
  key = (task_builder, dataclasses.replace(config, **defaults))
  try:
    session = _sessions.pop(key, None)
  except TypeError:  # An unhashable field value: build afresh.
    return _Session(config, task_builder)
  if session is None:
    session = _Session(config, task_builder)
  _sessions[key] = session
  while len(_sessions) > _SESSIONS_KEPT:
    _sessions.popitem(last=False)
  return session


def run(config: TrainConfig, task_builder: TaskBuilder) -> dict[str, Any]:
  """Trains (or resumes, or reports a finished) run per `config`.

  Args:
    config: the run's configuration (`TrainConfig`).
    task_builder: `task_builder(config)` returns the task to train: a
      `tff.simulation.baselines.BaselineTask` (its `datasets.train_data`,
      `train_preprocess_fn`, `test_data`, `eval_preprocess_fn` and
      `model_fn`), optionally with `round_train_data(client_id, seed)` (data
      drawn afresh every round) and `problem` (a synthetic objective). It is
      called only when the run trains and this process holds no session
      built from the same configuration and builder (`_session`); a
      `ValueError` it raises is reported as a `ConfigError`. `scripts.train`
      passes `scripts.program.build_task` (the `--task` names of this
      repository's `tasks`).
  """
  validate(config)
  out = config.output_dir
  status = run_directory.existing_run(config)
  if status != 'new' and config.private:
    run_directory.check_released(config)  # Nothing released is ever trained again.
  if status == 'finished':
    summary = run_directory.finished_summary(config)
    if summary is not None:
      csv_path = os.path.join(out, 'metrics.csv')
      if run_records.repair_metrics_csv(
          csv_path, run_records.ReleaseLog(out).rows()):
        print(f'{csv_path} did not match {run_records.RELEASES}; it was '
              'rebuilt from it.', flush=True)
      else:
        print(f'{out}/ already holds this finished run (summary.json, '
              'metrics.csv, ledger.json); nothing was changed.', flush=True)
      return summary
    status = 'resume'
  run_directory.check_writable(config)
  if config.noise_seed is not None and config.private:
    print(f'WARNING: --noise_seed={config.noise_seed}: the DP noise is '
          'reproducible and predictable; this run is NOT private.',
          file=sys.stderr, flush=True)
  # Read-only checks of the records, then the session: all before a write.
  if status == 'resume':
    run_records.ReleaseLog(out)  # Damaged records are refused here.
  set_execution_context(config)
  session = _session(config, task_builder)
  run_directory.prepare_output_dir(config)  # The first write: everything is checked.
  with run_records.exclusive(out):  # One process trains a run at a time.
    # Read again under the lock: another process may have run rounds since.
    return _train(config, session, run_records.ReleaseLog(out),
                  status == 'resume')


def _train(config, session, log, resuming):
  """The rounds of `config` from where its records stop; the summary."""
  out = config.output_dir
  checkpoints = run_records.Checkpoints(os.path.join(out, 'checkpoints'))
  state, start_round, pending = _restore(config, session, log, checkpoints)
  ledger = run_directory.ledger_of(log)
  writers = _MetricsWriters(out, log, resuming, config, session.private)
  if pending is not None:
    # Killed between the checkpoint and the release: release the saved row
    # (the round is never computed again).
    round_num, row, event = pending
    ledger.record(round_num, privacy_ledger.event_from_dict(event))
    writers.release(round_num, row, event)
  released = released_metric(config, session.private)
  model = _model_layout(session.process)  # For `run_records.share`.
  progress = _Progress(config, start_round, released)
  last_eval = run_directory.last_eval(log.rows())
  last_checkpoint = -math.inf
  for round_num in range(start_round, config.rounds + 1):
    state, row = session.train_round(state, round_num, ledger)
    event = _event_dict(session.last_event)
    row.update(eval_loss=math.nan, eval_accuracy=math.nan)
    if round_num % config.eval_every == 0 or round_num == config.rounds:
      last_eval = session.evaluate(state)
      row.update(last_eval)
    if session.private:
      # Checkpoint (with the row), then release: no released round is ever
      # computed again, which would release a second aggregate under the
      # same noise. A kill between the two releases the row on resume.
      # The pending row holds only what its release will show.
      pending_row = {k: v for k, v in row.items() if released((k,))}
      checkpoints.save(round_num, _state_leaves(session.process, state), dict(
          pending=dict(row=run_records.strict_json(pending_row), event=event),
          log_hash=log.hash_at(round_num - 1), model=model))
      writers.release(round_num, row, event)
    else:
      # Release, then checkpoint when due: a kill in between re-runs the
      # rounds after the checkpoint and rewrites their rows.
      writers.release(round_num, row, event)
      if (round_num % config.checkpoint_every == 0 and
          time.monotonic() - last_checkpoint >= config.checkpoint_interval_s
         ) or round_num == config.rounds:
        last_checkpoint = time.monotonic()
        checkpoints.save(round_num, _state_leaves(session.process, state),
                         dict(pending=None, log_hash=log.hash_at(round_num),
                              model=model))
    progress.update(round_num, row, last_eval)
  progress.close()
  return _finish(config, session, ledger, log, session.audit_report(state))


class _Progress:
  """A tqdm bar, or one line per round; shows only what a round releases.

  `released(path)` is the run's release filter (`released_metric`): under
  DP the clients' training loss and the round's seconds (which grow with
  the cohort) are withheld, so the bar shows neither them nor tqdm's rate
  and times.
  """

  def __init__(self, config, start_round, released):
    self._config = config
    self._released = released
    self._bar = None
    if config.progress:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      timings = released(('seconds',))
      self._bar = tqdm(
          total=config.rounds, initial=start_round - 1,
          desc=config.experiment_name, unit='round',
          bar_format=None if timings else
          '{l_bar}{bar}| {n_fmt}/{total_fmt}{postfix}')

  def update(self, round_num, row, last_eval):
    shown = collections.OrderedDict()
    for key, label in (('train_loss', 'loss'), ('objective', 'objective'),
                       ('clip_norm', 'clip'), ('epsilon', 'eps')):
      if key in row and self._released((key,)):
        shown[label] = row[key]
    shown['acc'] = last_eval.get('eval_accuracy', math.nan)
    if self._bar is None:
      print(f'round {round_num}/{self._config.rounds} ' + ' '.join(
          f'{k}={v:.4g}' for k, v in shown.items()), flush=True)
    else:
      self._bar.update(1)
      self._bar.set_postfix(collections.OrderedDict(
          (k, f'{v:.3g}') for k, v in shown.items()))

  def close(self):
    if self._bar is not None:
      self._bar.close()


def _noise_label(config, session):
  if not session.private:
    return 'none'
  mechanism = (f'{config.noise_mechanism} (b = {config.bands}) correlated '
               'across rounds; ' if config.noise.correlated else '')
  if config.bounding == config_lib.TFF_GAUSSIAN:
    return mechanism + ("TFF's own generator (not checked for secrecy by "
                        'tff_clip)')
  if config.noise_seed is not None:
    return mechanism + (f'reproducible from --noise_seed={config.noise_seed}'
                        ': predictable, NOT private')
  return mechanism + 'secret (OS entropy; the key is kept only in checkpoints/)'


def _ledger_report(ledger, config, session, log):
  report = {'delta': config.delta, 'noise_multiplier': session.noise_multiplier,
            'sampling': config.sampling,
            'noise': _noise_label(config, session),
            'ledger': ledger.to_dict()}
  if len(ledger):  # Each round's epsilon, as released in its row.
    report['epsilon_per_round_accountant'] = accounting.RDP
    report['epsilon_per_round'] = [
        [r['round'], r['row']['epsilon']] for r in log.records
        if r['event'] is not None]
  return report


def _finish(config, session, ledger, log, audit_report=None):
  out = config.output_dir
  rows = log.rows()
  summary = _summary(config, session, ledger, run_directory.last_eval(rows),
                     rows[-1] if rows else {})
  if audit_report is not None:
    summary['empirical_epsilon'] = audit_report
  run_records.write_json(os.path.join(out, 'ledger.json'),
             _ledger_report(ledger, config, session, log))
  from tff_clip import plotting  # pylint: disable=g-import-not-at-top
  plotting.plot_metrics(os.path.join(out, 'metrics.csv'),
                        os.path.join(out, 'plot.png'),
                        title=config.experiment_name)
  # Last: its presence marks the run finished.
  run_records.write_json(os.path.join(out, 'summary.json'), summary)
  return run_records.strict_json(summary)


def _summary(config, session, ledger, last_eval, last_row):
  z = session.noise_multiplier
  summary = collections.OrderedDict(
      experiment=config.experiment_name, task=config.task,
      rounds=config.rounds, population_size=session.population,
      clients_per_round=config.clients_per_round, sampling=config.sampling,
      noise_multiplier=z, delta=config.delta,
      noise=_noise_label(config, session),
      final_eval_accuracy=last_eval.get('eval_accuracy', math.nan),
      final_eval_loss=last_eval.get('eval_loss', math.nan))
  if 'objective' in last_row:
    # The synthetic problems' measure of progress (f(w) - f(w*), ||x||^2).
    summary['objective_name'] = session.task.problem.report_name
    summary['final_objective'] = last_row['objective']
  if session.private:
    summary.update(run_directory.epsilons(ledger, config.delta))  # 0 if empty.
    released = [k for k in NOT_COVERED if k in last_row]
    if released:
      summary['not_covered_by_epsilon'] = released
    if z > 0 and config.sampling != sampling_lib.MIN_SEPARATION:
      # Same noise on the average (z / n fixed) at production scale.
      scaled_z = (z / config.clients_per_round *
                  EXTRAPOLATION_CLIENTS_PER_ROUND)
      summary['extrapolated'] = collections.OrderedDict(
          population_size=EXTRAPOLATION_POPULATION,
          clients_per_round=EXTRAPOLATION_CLIENTS_PER_ROUND,
          noise_multiplier=scaled_z,
          epsilon=accounting.compute_training_epsilon(
              scaled_z, clients_per_round=EXTRAPOLATION_CLIENTS_PER_ROUND,
              population_size=EXTRAPOLATION_POPULATION, rounds=config.rounds,
              delta=config.delta, sampling=config.sampling).epsilon,
          accountant=accounting.RDP)
  else:
    summary['epsilon'] = None  # No DP: no guarantee.
  return summary
