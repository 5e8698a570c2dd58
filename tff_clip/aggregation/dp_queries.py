"""The tensorflow-privacy DP queries behind `tff_clip.aggregation.dp.dp_factory`.

`BoundedGaussianSumQuery` bounds every record (`tff_clip.aggregation.bounding`) and adds
the noise mechanism's Gaussian noise to the sum (`tff_clip.aggregation.noise_mechanisms`,
one object for the noise added and the `DpEvent` recorded);
`CountQuantileEstimatorQuery` and `AdaptiveBoundedSumQuery` make its norm
adaptive (Andrew et al. 2021); `ActualCountNormalizedQuery` and
`ResultDtypeQuery` finish the mean. The noise key is secret: drawn from OS
entropy when the graph runs unless `noise_seed` is given (see
`secret_key`). The privacy model and the references are in `tff_clip.aggregation.dp`.
"""

from __future__ import annotations

import collections
import math
from typing import Optional

import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_privacy as tfp

from tff_clip import checks
from tff_clip.aggregation import bounding
from tff_clip.aggregation import mechanisms
from tff_clip.aggregation import spec as spec_lib
from tff_clip.names import NOISE_PLACEMENTS

__all__ = [
    'ActualCountNormalizedQuery',
    'AdaptiveBoundedSumQuery',
    'BoundedGaussianSumQuery',
    'CountQuantileEstimatorQuery',
    'ResultDtypeQuery',
    'secret_key',
    'summed_records',
]


# ----------------------------------------------------------------------------
# Noise. The Gaussian mechanism's guarantee assumes the adversary cannot
# predict the noise: every draw here comes either from a key drawn from OS
# entropy when the graph runs (the default) or, only when the user passes
# `noise_seed`, from that seed (reproducible, and then NOT private).

_INT64 = np.iinfo(np.int64)


def secret_key() -> tf.Tensor:
  """A fresh [2] int64 key from OS entropy, drawn when the graph runs.

  The raw op with seed = seed2 = 0 makes its kernel seed itself from the OS
  (TensorFlow's `GuardedPhiloxRandom::Init`), whatever global or op seed the
  program set. `tf.random.uniform` would not do: after `tf.random.set_seed`
  (which training scripts call for reproducible initialisation) its op seed,
  and so the noise, would be a function of a public seed.
  """
  return tf.raw_ops.RandomUniformInt(
      shape=tf.constant([2], tf.int32), minval=tf.constant(_INT64.min),
      maxval=tf.constant(_INT64.max), seed=0, seed2=0)


def _initial_key(noise_seed: Optional[int]) -> tf.Tensor:
  if noise_seed is None:
    return secret_key()
  return tf.constant([noise_seed, 0], tf.int64)


def _fold_in(key, data):
  return tf.random.experimental.stateless_fold_in(key, tf.cast(data, tf.int64))


def _fingerprint(leaves) -> tf.Tensor:
  """An int64 fingerprint of a record: distinct records, distinct keys."""
  flat = tf.concat([tf.reshape(tf.cast(x, tf.float64), [-1]) for x in leaves]
                   + [tf.zeros([1], tf.float64)], axis=0)
  digest = tf.fingerprint(tf.reshape(flat, [1, -1]))  # uint8 [1, 8]
  return tf.bitcast(tf.reshape(digest, [8]), tf.int64)


def _add_noise(structure, stddev, key=None):
  """Adds N(0, stddev^2) to every coordinate, in float32 or wider.

  `key`: a [2] int64 stateless key (one fold per leaf), or None for the raw
  OS-seeded stateful kernel (client-side noise, where no server key may be
  shipped to clients).
  """
  out = []
  for i, leaf in enumerate(tf.nest.flatten(structure)):
    shape = tf.shape(leaf)
    if key is None:
      noise = tf.raw_ops.RandomStandardNormal(
          shape=shape, dtype=tf.float32, seed=0, seed2=0) * stddev
    else:
      noise = tf.random.stateless_normal(shape, _fold_in(key, i),
                                         stddev=stddev, dtype=tf.float32)
    out.append(leaf + tf.cast(noise, leaf.dtype))
  return tf.nest.pack_sequence_as(structure, out)


def _widen(structure):
  """float16/bfloat16 leaves to float32: sums and noise in >= float32.

  Summing n bounded float16 records in float16 rounds every partial sum: from
  about 2048 records the rounding alone moves the sum by as much as a record,
  doubling the sensitivity the accounting assumes.
  """
  return tf.nest.map_structure(
      lambda x: tf.cast(x, tf.float32)
      if x.dtype in (tf.float16, tf.bfloat16) else x, structure)


# ----------------------------------------------------------------------------
# Queries.


class BoundedGaussianSumQuery(tfp.SumAggregationDPQuery):
  """Bound every record with `tff_clip.aggregation.bounding`, add N(0, (z S)^2 I) to the sum.

  The generalisation of tensorflow-privacy's `GaussianSumQuery` (global
  clipping only, and NaN-propagating) to the four boundings of this project.
  Its global state holds the clip norm: a scalar C, or for per-layer bounding
  either C (budgets C f_h with the static fractions f) or a vector [H] of
  budgets (per-layer adaptive clipping). The sensitivity S is C, or
  sqrt(sum C_h^2) for a budget vector.
  """

  GlobalState = collections.namedtuple(
      'GlobalState', ['clip_norm', 'noise_multiplier', 'noise_key', 'round'])
  # `client_noise_key` is all zeros unless client-side noise is seeded: the
  # server's (secret) key is never broadcast to clients.
  SampleParams = collections.namedtuple('SampleParams',
                                        ['clip_norm', 'client_noise_key'])
  CorrelatedGlobalState = collections.namedtuple(
      'CorrelatedGlobalState', GlobalState._fields + ('noise_history',))

  def set_template(self, template):
    """The record's tensor specs (correlated noise keeps past noise)."""
    self._template = template

  def greatest_clip_norm(self, noise_multiplier) -> tf.Tensor:
    """The S above which the record's dtypes could not hold the
    mechanism's numbers (`spec.greatest_norm`, for the state's z): an
    adaptive norm (per-layer: sqrt(sum C_h^2)) is kept at or below it.
    Post-processing of the released estimate: it costs no privacy."""
    template = getattr(self, '_template', None)
    dtypes = {np.float32} if template is None else {
        np.dtype(leaf.dtype.as_numpy_dtype) for leaf in tf.nest.flatten(
            template)}
    z = tf.cast(noise_multiplier, tf.float64)
    return tf.cast(spec_lib.greatest_norm(
        z, self._expected_clients or 1.0, sorted(map(np.dtype, dtypes),
                                                  key=str),
        minimum=tf.minimum) * (1.0 - 2.0**-20), tf.float32)

  def __init__(self, bounding_method, clip_norm, noise_multiplier: float,
               layer_fractions: Optional[np.ndarray] = None,
               noise_seed: Optional[int] = None,
               noise_placement: str = spec_lib.parameter(
                   'noise_placement').default,
               expected_clients: Optional[float] = None,
               noise_mechanism=spec_lib.parameter('noise_mechanism').default,
               bands: int = spec_lib.parameter('bands').default, *,
               rounds: Optional[int] = None,
               separation: Optional[int] = None, **options):
    # One object draws the noise and states its DpEvent: `noise_mechanism`
    # is one (`tff_clip.aggregation.noise_mechanisms`), or the name it is built from with
    # `bands`, `rounds`, `separation` and its class's `options`.
    self._noise = mechanisms.noise_mechanism(
        noise_mechanism, bands, rounds=rounds, separation=separation,
        **options)
    # The bounding object (`tff_clip.aggregation.boundings`), or its name.
    self._method = mechanisms.bounding(bounding_method, 'bounding')
    self._per_layer = self._method.per_layer
    self._clip_norm = np.asarray(clip_norm, np.float32)
    self._vector = self._clip_norm.ndim == 1
    if self._per_layer and not self._vector and layer_fractions is None:
      raise ValueError('`layer_fractions` is required for per-layer bounding '
                       'with a scalar clip norm.')
    self._fractions = (None if layer_fractions is None else
                       np.asarray(layer_fractions, np.float64))
    self._noise_multiplier = float(noise_multiplier)
    self._noise_seed = noise_seed
    checks.one_of(noise_placement, 'noise_placement', NOISE_PLACEMENTS)
    if noise_placement == 'client' and not expected_clients:
      raise ValueError('`clients_per_round` is required for client noise.')
    self._placement = noise_placement
    self._noise.check_placement(noise_placement)
    self._expected_clients = expected_clients
    self._template = None

  @property
  def noise_mechanism(self):
    """The noise mechanism object (`tff_clip.aggregation.noise_mechanisms`)."""
    return self._noise

  def initial_global_state(self):
    # The key lives in the aggregator state: checkpointed (server-private),
    # so a resumed run continues the same stream, and never released.
    state = self.GlobalState(tf.constant(self._clip_norm, tf.float32),
                             tf.constant(self._noise_multiplier, tf.float32),
                             _initial_key(self._noise_seed),
                             tf.constant(0, tf.int64))
    noise_state = self._noise.initial_state(self._template)
    if noise_state is None:
      return state
    # E.g. correlated noise's past noise vectors: server-private state too.
    return self.CorrelatedGlobalState(*state, noise_state)

  def initial_sample_state(self, template=None):
    # Records are summed in >= float32 (see `_widen`).
    return tf.nest.map_structure(
        lambda spec: tf.zeros(spec.shape, _widen(tf.zeros([], spec.dtype)).dtype),
        template)

  def budgets(self, clip_norm):
    """Per-layer budgets for a (scalar or vector) clip norm state."""
    if self._vector:
      return clip_norm
    return bounding.budgets_from_fractions(clip_norm, self._fractions)

  def sensitivity(self, clip_norm):
    """L2 sensitivity S of the sum: C, or sqrt(sum C_h^2) for budget vectors
    (summed in float64: float32 squares of budgets below 1e-19 flush to 0,
    which would make S, and the noise, 0 while the budgets pass records)."""
    if self._vector:
      return tf.cast(tf.norm(tf.cast(clip_norm, tf.float64)), tf.float32)
    return clip_norm

  def least_clip_norm(self, noise_multiplier) -> tf.Tensor:
    """The C (or C_h) below which the noise std z C (client noise:
    z C / sqrt(n)) would fall under `spec.MIN_NOISE_STDDEV`, for the state's
    float32 z (read from the state, not traced in: cells of other z share
    the graph): an adaptive norm is kept at or above it (0 without noise).
    Post-processing of the released estimate: it costs no privacy."""
    floor = spec_lib.MIN_NOISE_STDDEV * (
        math.sqrt(self._expected_clients) if self._placement == 'client'
        else 1.0)
    z = tf.cast(noise_multiplier, tf.float32)
    return tf.where(z > 0, floor / tf.maximum(z, np.finfo(np.float32).tiny),
                    0.0)

  def derive_sample_params(self, global_state):
    client_key = tf.zeros([2], tf.int64)
    if self._placement == 'client' and self._noise_seed is not None:
      client_key = _fold_in(global_state.noise_key, global_state.round)
    return self.SampleParams(global_state.clip_norm, client_key)

  def preprocess_record_impl(self, params, record):
    """Returns (bounded record in >= float32, `bounding.BoundedUpdate`)."""
    clip_norm = params.clip_norm
    if self._per_layer:
      result = bounding.bound(record, self._method,
                              budgets=self.budgets(clip_norm))
    else:
      result = bounding.bound(record, self._method, clip_norm=clip_norm)
    value = _widen(result.value)
    if self._placement == 'client':
      # Zhang et al. 2022 / Pelikan et al. 2025 client-level form: each of the n expected clients
      # adds N(0, (z S)^2 / n); their sum carries N(0, (z S)^2). Fresh OS
      # entropy on each client, or (seeded runs only) a key from the seed,
      # the round and the record itself, so clients draw different noise.
      stddev = (self._noise_multiplier * self.sensitivity(clip_norm) /
                math.sqrt(self._expected_clients))
      key = None
      if self._noise_seed is not None:
        key = _fold_in(params.client_noise_key,
                       _fingerprint(tf.nest.flatten(value)))
      value = _add_noise(value, stddev, key)
    return value, result

  def preprocess_record(self, params, record):
    return self.preprocess_record_impl(params, record)[0]

  def get_noised_result(self, sample_state, global_state):
    stddev = global_state.noise_multiplier * self.sensitivity(
        global_state.clip_norm)
    if self._placement == 'central':
      # x_t + z S_t n_t, n_t the mechanism's unit noise of round t (for
      # correlated noise, (C^{-1} w)_t: `tff_clip.aggregation.correlated_noise`).
      noise_state = getattr(global_state, 'noise_history', None)
      unit, noise_state = self._noise.unit_noise(
          sample_state, global_state.noise_key, global_state.round,
          noise_state)
      result = tf.nest.map_structure(
          lambda s, u: s + tf.cast(stddev * u, s.dtype), sample_state, unit)
      if noise_state is not None:
        global_state = global_state._replace(noise_history=noise_state)
    else:
      result = sample_state  # Each client added its share.
    new_state = global_state._replace(round=global_state.round + 1)
    # Per participation: `tff_clip.privacy.accounting` composes one per cycle.
    event = self._noise.participation_event(global_state.noise_multiplier)
    return result, new_state, event

  def derive_metrics(self, global_state):
    metrics = collections.OrderedDict(
        clip_norm=self.sensitivity(global_state.clip_norm))
    if self._per_layer:
      metrics['layer_budgets'] = self.budgets(global_state.clip_norm)
    metrics['noise_stddev'] = (global_state.noise_multiplier *
                               self.sensitivity(global_state.clip_norm))
    return metrics


class CountQuantileEstimatorQuery(tfp.QuantileEstimatorQuery):
  """tensorflow-privacy's quantile estimator, for one norm or one per layer.

  Andrew et al. 2021. The record is a client's norm (scalar) or its vector of
  per-layer norms [H]; its contribution to the count is (norm <= C) - 1/2
  per entry, whose L2 norm is at most sqrt(H)/2. The below-estimate count is
  a `BoundedGaussianSumQuery` with that sensitivity, so (a) its
  `GaussianDpEvent` carries noise multiplier sigma_b / (sqrt(H)/2) and the
  accounting needs nothing special, and (b) its noise can be seeded like the
  value noise (`noise_seed`), which tensorflow-privacy's stateful
  `GaussianSumQuery` cannot. `below_estimate_stddev=None` gives the
  noise-free (exact count) estimator.

  `switch` (a `noise_following.QuantileSwitch`, one norm only) moves the
  target quantile once, from the released estimates alone: the state then
  also counts the rounds and keeps the estimate released at the switch's
  reference round, and its `target_quantile` is the one tracked next.
  """

  _SwitchState = collections.namedtuple('_SwitchState', [
      'current_estimate', 'target_quantile', 'learning_rate',
      'below_estimate_state', 'round', 'reference_estimate'])

  def __init__(self, initial_estimate, target_quantile, learning_rate,
               below_estimate_stddev, expected_num_records,
               geometric_update=True, noise_seed=None, switch=None):
    initial_estimate = np.asarray(initial_estimate, np.float32)
    self._shape = initial_estimate.shape
    self._num_counts = int(initial_estimate.size)
    self._count_noise_seed = noise_seed
    if switch is not None and self._shape:
      raise ValueError('A quantile switch reads one norm; got '
                       f'{self._num_counts} per-layer estimates.')
    self._switch = switch
    super().__init__(initial_estimate, target_quantile, learning_rate,
                     below_estimate_stddev, expected_num_records,
                     geometric_update)

  def _construct_below_estimate_query(self, below_estimate_stddev,
                                      expected_num_records):
    if below_estimate_stddev is None:
      return tfp.NoPrivacyAverageQuery()
    sensitivity = 0.5 * math.sqrt(self._num_counts)
    return tfp.NormalizedQuery(
        BoundedGaussianSumQuery(
            'clip', sensitivity, below_estimate_stddev / sensitivity,
            noise_seed=self._count_noise_seed),
        denominator=expected_num_records)

  def initial_sample_state(self, template=None):
    del template
    return self._below_estimate_query.initial_sample_state(
        tf.zeros(self._shape, tf.float32))

  def preprocess_record(self, params, record):
    below = tf.cast(record <= params.current_estimate, tf.float32) - 0.5
    return self._below_estimate_query.preprocess_record(
        params.below_estimate_params, below)

  def initial_global_state(self):
    state = super().initial_global_state()
    if self._switch is None:
      return state
    return self._SwitchState(*state, round=tf.constant(0, tf.int32),
                             reference_estimate=state.current_estimate)

  def get_noised_result(self, sample_state, global_state):
    estimate, state, event = super().get_noised_result(sample_state,
                                                       global_state)
    if self._switch is None:
      return estimate, state, event
    # Post-processing of the released estimates: the event is unchanged.
    switch = self._switch
    round_num = state.round + 1
    reference = tf.where(tf.equal(round_num, switch.reference_round),
                         estimate, state.reference_estimate)
    moves = tf.logical_and(tf.equal(round_num, switch.at_round),
                           estimate >= switch.growth * reference)
    target = tf.where(moves, tf.constant(switch.quantile, tf.float32),
                      state.target_quantile)
    return estimate, state._replace(
        round=round_num, reference_estimate=reference,
        target_quantile=target), event

  def derive_metrics(self, global_state):
    metrics = super().derive_metrics(global_state)
    if self._switch is not None:  # Where it can move: the one tracked next.
      metrics['target_quantile'] = global_state.target_quantile
    return metrics


class AdaptiveBoundedSumQuery(tfp.SumAggregationDPQuery):
  """`BoundedGaussianSumQuery` whose clip norm tracks a quantile of the norms.

  The structure of tensorflow-privacy's `QuantileAdaptiveClipSumQuery`, but
  for any bounding and with per-layer estimators. The estimator sees each
  client's global norm (global boundings, and per-layer bounding with one
  adaptive C split by the static fractions) or per-layer norms (per-layer
  adaptive: `per_layer_quantiles=True`).
  """

  GlobalState = collections.namedtuple('GlobalState',
                                       ['sum_state', 'estimator_state'])
  SampleState = collections.namedtuple('SampleState',
                                       ['sum_state', 'estimator_state'])
  SampleParams = collections.namedtuple('SampleParams',
                                        ['sum_params', 'estimator_params'])

  def __init__(self, sum_query: BoundedGaussianSumQuery,
               estimator_query: tfp.QuantileEstimatorQuery,
               per_layer_quantiles: bool):
    self._sum_query = sum_query
    self._estimator = estimator_query
    self._per_layer_quantiles = per_layer_quantiles

  def initial_global_state(self):
    return self.GlobalState(self._sum_query.initial_global_state(),
                            self._estimator.initial_global_state())

  def derive_sample_params(self, global_state):
    return self.SampleParams(
        self._sum_query.derive_sample_params(global_state.sum_state),
        self._estimator.derive_sample_params(global_state.estimator_state))

  def initial_sample_state(self, template):
    return self.SampleState(self._sum_query.initial_sample_state(template),
                            self._estimator.initial_sample_state())

  def preprocess_record(self, params, record):
    value, result = self._sum_query.preprocess_record_impl(params.sum_params,
                                                           record)
    # A non-finite update counts as "above the norm" (NaN <= C is False).
    norms = result.layer_norms if self._per_layer_quantiles else (
        result.global_norm)
    below = self._estimator.preprocess_record(params.estimator_params, norms)
    return self.SampleState(value, below)

  def get_noised_result(self, sample_state, global_state):
    noised, sum_state, sum_event = self._sum_query.get_noised_result(
        sample_state.sum_state, global_state.sum_state)
    new_norm, estimator_state, estimator_event = (
        self._estimator.get_noised_result(sample_state.estimator_state,
                                          global_state.estimator_state))
    # Never below the least norm whose noise TensorFlow still draws (a norm
    # driven toward 0 would otherwise release its rounds without noise),
    # never above what the records' dtypes hold (a float16 record bounded
    # to a norm past 65504 would be inf before the noise). The ceiling
    # bounds S: per-layer norms are scaled together to sqrt(sum C_h^2) <= it
    # (each at it, S = sqrt(H) times it: a float16 noisy mean came out inf).
    z = sum_state.noise_multiplier
    norm = tf.maximum(new_norm, self._sum_query.least_clip_norm(z))
    greatest = self._sum_query.greatest_clip_norm(z)
    norm = (norm * tf.minimum(1.0, greatest / self._sum_query.sensitivity(
        norm)) if norm.shape.rank else tf.minimum(norm, greatest))
    sum_state = sum_state._replace(clip_norm=norm)
    event = dp_accounting.ComposedDpEvent([sum_event, estimator_event])
    return noised, self.GlobalState(sum_state, estimator_state), event

  def derive_metrics(self, global_state):
    metrics = self._sum_query.derive_metrics(global_state.sum_state)
    quantile = self._estimator.derive_metrics(
        global_state.estimator_state).get('target_quantile')
    if quantile is not None:
      metrics['target_quantile'] = quantile
    return metrics


class ResultDtypeQuery(tfp.SumAggregationDPQuery):
  """Casts the released result back to the value's leaf dtypes, last.

  The sum and the noise stay in >= float32 until the mean is final; only the
  post-processed result is rounded to float16/bfloat16.
  """

  def __init__(self, query, dtypes):
    self._query = query
    self._dtypes = dtypes

  def initial_global_state(self):
    return self._query.initial_global_state()

  def derive_sample_params(self, global_state):
    return self._query.derive_sample_params(global_state)

  def initial_sample_state(self, template=None):
    return self._query.initial_sample_state(template)

  def preprocess_record(self, params, record):
    return self._query.preprocess_record(params, record)

  def get_noised_result(self, sample_state, global_state):
    result, new_state, event = self._query.get_noised_result(sample_state,
                                                             global_state)
    leaves = [tf.cast(x, d) for x, d in zip(tf.nest.flatten(result),
                                             tf.nest.flatten(self._dtypes))]
    return tf.nest.pack_sequence_as(result, leaves), new_state, event

  def derive_metrics(self, global_state):
    return self._query.derive_metrics(global_state)


class ActualCountNormalizedQuery(tfp.SumAggregationDPQuery):
  """Mean over the clients actually present: noisy sum / exact count.

  The count is released WITHOUT noise. Under fixed-size sampling it is the
  public cohort size; under Poisson sampling it is private information the
  accounting does not cover. Prefer `NormalizedQuery` with the expected count.
  """

  def __init__(self, numerator_query):
    self._numerator = numerator_query

  def initial_global_state(self):
    return self._numerator.initial_global_state()

  def derive_sample_params(self, global_state):
    return self._numerator.derive_sample_params(global_state)

  def initial_sample_state(self, template):
    return (self._numerator.initial_sample_state(template),
            tf.constant(0.0, tf.float32))

  def preprocess_record(self, params, record):
    return (self._numerator.preprocess_record(params, record),
            tf.constant(1.0, tf.float32))

  def get_noised_result(self, sample_state, global_state):
    noised, new_state, event = self._numerator.get_noised_result(
        sample_state[0], global_state)
    count = tf.maximum(sample_state[1], 1.0)
    result = tf.nest.map_structure(lambda v: v / tf.cast(count, v.dtype),
                                   noised)
    return result, new_state, event

  def derive_metrics(self, global_state):
    return self._numerator.derive_metrics(global_state)


# ----------------------------------------------------------------------------
# Many records at once.


def _bounded_sums(query: BoundedGaussianSumQuery, params, records):
  """(the sum of K bounded records, `bounding.bound_batch`'s result)."""
  per_layer = query._per_layer  # pylint: disable=protected-access
  result = bounding.bound_batch(
      records, query._method,  # pylint: disable=protected-access
      clip_norm=None if per_layer else params.clip_norm,
      budgets=query.budgets(params.clip_norm) if per_layer else None)
  return tf.nest.map_structure(lambda x: tf.reduce_sum(x, axis=0),
                               _widen(result.value)), result


def summed_records(query, params, records):
  """What a round's sample state is after K records: the sum over the
  leading axis of `query.preprocess_record(params, record)`, for `records`
  whose every leaf stacks K records [K, ...], as tensor ops over that axis
  (`bounding.bound_batch`: each record bounded as alone, with its
  guarantee). For this module's queries (central noise) and
  tensorflow-privacy's `NormalizedQuery` and `NoPrivacyAverageQuery` around
  them; None for any other query (sum its records one by one)."""
  # pylint: disable=protected-access
  count = lambda: tf.cast(tf.shape(tf.nest.flatten(records)[0])[0],
                          tf.float32)
  if isinstance(query, BoundedGaussianSumQuery):
    if query._placement != 'central':
      return None  # Each record draws its own noise.
    return _bounded_sums(query, params, records)[0]
  if isinstance(query, AdaptiveBoundedSumQuery):
    if query._sum_query._placement != 'central':
      return None
    values, result = _bounded_sums(query._sum_query, params.sum_params,
                                   records)
    # A non-finite update counts as "above the norm" (NaN <= C is False).
    norms = (result.layer_norms if query._per_layer_quantiles
             else result.global_norm)
    below = summed_records(query._estimator, params.estimator_params, norms)
    return None if below is None else query.SampleState(values, below)
  if isinstance(query, CountQuantileEstimatorQuery):
    below = tf.cast(records <= params.current_estimate, tf.float32) - 0.5
    return summed_records(query._below_estimate_query,
                          params.below_estimate_params, below)
  if isinstance(query, tfp.NormalizedQuery):
    return summed_records(query._numerator, params, records)
  if isinstance(query, tfp.NoPrivacyAverageQuery):
    return (tf.nest.map_structure(lambda x: tf.reduce_sum(x, axis=0),
                                  records), count())
  if isinstance(query, ResultDtypeQuery):
    return summed_records(query._query, params, records)
  if isinstance(query, ActualCountNormalizedQuery):
    inner = summed_records(query._numerator, params, records)
    return None if inner is None else (inner, count())
  return None
