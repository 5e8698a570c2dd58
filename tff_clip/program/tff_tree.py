"""TFF's adaptive tree aggregator, restarted, with secretly keyed noise.

`TreeAdaptiveFactory` is TFF's `DifferentiallyPrivateFactory.tree_adaptive`
(tensorflow-privacy's `QAdaClipTreeResSumQuery` in a `RestartQuery`,
normalized by the expected cohort) restarted every `restart_every` rounds,
as `--bounding=tff_tree_adaptive` runs it beside tff_clip's own correlated
noise. Its noise key comes from OS entropy (`secret_tree_seed`) unless a
`noise_seed` makes the run reproducible.
"""

from __future__ import annotations

from typing import Optional

import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_clip.aggregation import dp

__all__ = ['TreeAdaptiveFactory', 'secret_tree_seed']


def secret_tree_seed(query):
  """`query` (a tensorflow-privacy DPQuery), with its tree noise keyed secretly.

  tensorflow-privacy's `GaussianNoiseGenerator` without a seed seeds itself
  from the clock (`floor(time * 1e6)`): guessable from a run's file times.
  Its state is `(seeds, stddev)`; in the initial state each generator's
  `seeds` (the value's tree and the quantile estimate's) are replaced by a
  `dp.secret_key()` of its own (OS entropy, drawn when the graph runs), so
  the tree noise is as secret as tff_clip's own.
  """

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


class TreeAdaptiveFactory(tff.aggregators.UnweightedAggregationFactory):
  """TFF's `tree_adaptive`, restarted every `restart_every` rounds.

  Built when the model's specs are known (`create`). `clipped_count_stddev`
  None: tff_clip's default count noise (TFF's n / 20 fails at large z).
  """

  def __init__(self, noise_multiplier: float, clients_per_round: float,
               initial_clip_norm: float, target_quantile: float,
               clip_learning_rate: float,
               clipped_count_stddev: Optional[float], restart_every: int,
               noise_seed: Optional[int] = None):
    self._noise_multiplier = noise_multiplier
    self._clients_per_round = float(clients_per_round)
    self._initial_clip_norm = initial_clip_norm
    self._target_quantile = target_quantile
    self._clip_learning_rate = clip_learning_rate
    self._clipped_count_stddev = clipped_count_stddev
    self._restart_every = restart_every
    self._noise_seed = noise_seed

  def create(self, value_type):
    return self.dp_factory(value_type).create(value_type)

  def dp_factory(self, value_type):
    """TFF's `DifferentiallyPrivateFactory` of the query for `value_type`
    (what `create` creates; the batched client path reads its query)."""
    specs = tff.types.type_to_tf_tensor_specs(value_type)
    n = self._clients_per_round
    count_stddev = self._clipped_count_stddev or (
        dp.default_clipped_count_stddev(self._noise_multiplier, n, 1))
    value_z, count_stddev = (
        tff.aggregators.differential_privacy.adaptive_clip_noise_params(
            self._noise_multiplier, n, count_stddev))
    query = tfp.QAdaClipTreeResSumQuery(
        self._initial_clip_norm, value_z, specs, self._target_quantile,
        self._clip_learning_rate, count_stddev, n,
        geometric_update=True, noise_seed=self._noise_seed)
    query = tfp.RestartQuery(
        query, tfp.restart_query.PeriodicRoundRestartIndicator(
            period=self._restart_every, warmup=None))
    query = tfp.NormalizedQuery(query, denominator=n)
    if self._noise_seed is None:
      query = secret_tree_seed(query)
    return tff.aggregators.DifferentiallyPrivateFactory(query)
