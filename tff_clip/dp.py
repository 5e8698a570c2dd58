"""User-level differential privacy for every bounding: Gaussian noise on the sum.

Privacy model: user-level (client-level) DP under add/remove-one-client
adjacency (McMahan et al. 2018, "Learning Differentially Private Recurrent
Language Models"; Zhang et al. 2022's DP-FedAvg and Pelikan et al. 2025). Each round:

  1. every client update u_i is bounded by `tff_clip.bounding` (clip,
     normalize, per-layer clip, per-layer normalize); non-finite updates become
     zeros. Any one client then moves the SUM by at most S, the L2 sensitivity:
     S = C for global clip/normalize and S = sqrt(sum_h C_h^2) = C for
     per-layer bounding with budgets C_h;
  2. isotropic Gaussian noise N(0, (z S)^2 I) is added ONCE to the sum: every
     coordinate of every layer gets the same std z S. (Nesting one Gaussian
     query per layer would give layer h std z C_h, weakening the guarantee by
     sqrt(H) -- the trap this module avoids.);
  3. the noisy sum is divided by the expected clients per round (the unbiased
     estimator of McMahan et al. 2018, used by Pelikan et al. 2025), or optionally by the
     actual count (released in the clear: see `dp_factory`).

Every round records the `dp_accounting.DpEvent` it actually ran in the
aggregator state (TFF's `DifferentiallyPrivateFactory` convention:
`tff.aggregators.differential_privacy.extract_dp_event_from_state`), and
`tff_clip.accounting` composes those events with the sampling used.

Adaptive clipping (Andrew et al., "Differentially Private Learning with
Adaptive Clipping", NeurIPS 2021): C <- C exp(-eta_C (b_bar - gamma)), b_bar
the noisy fraction of clients with norm <= C (count noise std sigma_b),
reusing tensorflow-privacy's `QuantileEstimatorQuery`. The value noise
multiplier z_v is raised so that the two releases together are exactly as
private as one Gaussian mechanism with the requested z:
    z_v = (z^-2 - k (2 sigma_b)^-2)^-1/2,
with k = 1 for one global norm, and k = H for per-layer adaptive clipping,
whose H-dimensional count vector (entries +-1/2) has L2 sensitivity
sqrt(H)/2. The z = 0 case uses the noise-free estimator (CE-FedAvg with a
moving threshold, Zhang et al. 2022).

Built on tensorflow-privacy's `DPQuery` interface and wrapped by
`tff.aggregators.DifferentiallyPrivateFactory`, so the factories stay
secure-sum compatible and expose their `DpEvent` like TFF's.

References:
* Zhang et al. 2022: "Understanding Clipping for Federated Learning:
  Convergence and Client-Level Differential Privacy", ICML 2022.
* Pelikan et al. 2025: "Enabling Differentially Private Federated
  Learning for Speech Recognition", NeurIPS 2025.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import math
from typing import Optional

import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_clip import aggregators
from tff_clip import bounding
from tff_clip import checks
from tff_clip import mechanisms
from tff_clip import spec as spec_lib

__all__ = [
    'ActualCountNormalizedQuery',
    'AdaptiveBoundedSumQuery',
    'BoundedGaussianSumQuery',
    'CountQuantileEstimatorQuery',
    'ResultDtypeQuery',
    'adaptive_noise_multipliers',
    'default_clipped_count_stddev',
    'dp_factory',
    'extract_dp_event',
]

from tff_clip.names import NOISE_PLACEMENTS  # pylint: disable=g-bad-import-order,wrong-import-position


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
  """Bound every record with `tff_clip.bounding`, add N(0, (z S)^2 I) to the sum.

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

  def __init__(self, bounding_method: str, clip_norm, noise_multiplier: float,
               layer_fractions: Optional[np.ndarray] = None,
               noise_seed: Optional[int] = None,
               noise_placement: str = 'central',
               expected_clients: Optional[float] = None,
               noise_mechanism=spec_lib.parameter('noise_mechanism').default,
               bands: int = 1, *, rounds: Optional[int] = None,
               separation: Optional[int] = None, **options):
    # One object draws the noise and states its DpEvent: `noise_mechanism`
    # is one (`tff_clip.noise_mechanisms`), or the name it is built from with
    # `bands`, `rounds`, `separation` and its class's `options`.
    self._noise = mechanisms.noise_mechanism(
        noise_mechanism, bands, rounds=rounds, separation=separation,
        **options)
    self._method = bounding_method
    self._per_layer = mechanisms.bounding(bounding_method,
                                          'bounding').per_layer
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
    """The noise mechanism object (`tff_clip.noise_mechanisms`)."""
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
    """L2 sensitivity S of the sum: C, or sqrt(sum C_h^2) for budget vectors."""
    if self._vector:
      return tf.sqrt(tf.reduce_sum(tf.square(clip_norm)))
    return clip_norm

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
      # correlated noise, (C^{-1} w)_t: `tff_clip.correlated_noise`).
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
    # Per participation: `tff_clip.accounting` composes one per cycle.
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
  """

  def __init__(self, initial_estimate, target_quantile, learning_rate,
               below_estimate_stddev, expected_num_records,
               geometric_update=True, noise_seed=None):
    initial_estimate = np.asarray(initial_estimate, np.float32)
    self._shape = initial_estimate.shape
    self._num_counts = int(initial_estimate.size)
    self._count_noise_seed = noise_seed
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
    sum_state = sum_state._replace(clip_norm=tf.maximum(new_norm, 0.0))
    event = dp_accounting.ComposedDpEvent([sum_event, estimator_event])
    return noised, self.GlobalState(sum_state, estimator_state), event

  def derive_metrics(self, global_state):
    return self._sum_query.derive_metrics(global_state.sum_state)


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
# Noise calibration for adaptive clipping.


# Re-exported from the TensorFlow-free spec (`tff_clip.spec`).
adaptive_noise_multipliers = spec_lib.adaptive_noise_multipliers
default_clipped_count_stddev = spec_lib.default_clipped_count_stddev
MAX_VALUE_NOISE_INFLATION = spec_lib.MAX_VALUE_NOISE_INFLATION


# ----------------------------------------------------------------------------
# The factory.


def _initial_budgets(spec, fractions, initial_norms):
  """The per-layer budgets C_h a per-layer query starts from (else None)."""
  if not spec.per_layer:
    return None
  if np.ndim(initial_norms) == 1:  # Per-layer quantiles: one norm per layer.
    return np.asarray(initial_norms, np.float64)
  return float(initial_norms) * np.asarray(fractions, np.float64)


class DPBoundingFactory(tff.aggregators.UnweightedAggregationFactory,
                        tff.aggregators.WeightedAggregationFactory):
  """Bounding + Gaussian noise + mean, as an aggregation factory.

  Unweighted by nature (DP-FedAvg weighs clients uniformly). It also accepts
  `create(value_type, weight_type)` so it drops into
  `build_weighted_fed_avg(model_aggregator=...)`: the weights are then
  IGNORED -- every client counts once, as with `client_weighting=UNIFORM` --
  because weighting by example counts would make the sensitivity depend on
  private data.
  """

  def __init__(self, spec: spec_lib.DPSpec,
               record_aggregation_factory: Optional[
                   tff.aggregators.UnweightedAggregationFactory] = None):
    self._spec = spec
    self._record_aggregation_factory = record_aggregation_factory

  @property
  def spec(self) -> spec_lib.DPSpec:
    """The checked description of the mechanism (frozen)."""
    return self._spec

  @property
  def record_aggregation_factory(self):
    """How bounded records are summed (None: `tff.aggregators.SumFactory`)."""
    return self._record_aggregation_factory

  def build_query(self, value_type) -> tfp.SumAggregationDPQuery:
    """The tensorflow-privacy query `create` wraps, for `value_type`.

    A new query on every call (the factory is not changed), e.g. for
    `tff_clip.audit.CanaryFactory`, which wraps it in its canaries.
    """
    spec = self._spec
    method = spec.bounding_method
    per_layer = spec.per_layer
    num_layers = len(tf.nest.flatten(
        tff.types.type_to_tf_tensor_specs(value_type)))
    fractions = None
    if per_layer:
      fractions = bounding.layer_budget_fractions(
          value_type, spec.split,
          None if spec.adaptive else spec.clip_norm)
    z = spec.noise_multiplier
    n = spec.clients_per_round
    initial_norms = spec.clip_norm  # A scalar, or one per layer.
    if not spec.adaptive:
      query = sum_query = BoundedGaussianSumQuery(
          method, spec.clip_norm, z, fractions, spec.noise_seed,
          spec.noise_placement, n, spec.noise)
    else:
      per_layer_quantiles = per_layer and spec.per_layer_quantiles
      num_counts = num_layers if per_layer_quantiles else 1
      count_stddev = spec.clipped_count_stddev
      if count_stddev is None:
        count_stddev = default_clipped_count_stddev(z, n, num_counts)
      value_z = adaptive_noise_multipliers(z, count_stddev, num_counts)
      initial = spec.initial_clip_norm
      if per_layer_quantiles:
        # Every layer starts at C0 / sqrt(H) (sqrt(sum C_h^2) = C0), not at
        # the `split` fractions: a layer's norm is unknown until estimated,
        # and the 'dim' start (C0 sqrt(d_h / d)) clipped the EMNIST CNN's
        # small layers to 1-9% of their update norms for a whole run
        # (docs/frontier.md, "Per-layer bounding on the CNN").
        initial = np.full([num_layers], spec.initial_clip_norm /
                          np.sqrt(num_layers), np.float32)
      initial_norms = initial
      sum_query = BoundedGaussianSumQuery(
          method, initial, value_z, fractions, spec.noise_seed,
          spec.noise_placement, n, spec.noise)
      # The count noise gets its own seed stream (seed + 1): reusing the
      # value noise's seed would correlate the two releases.
      count_seed = (None if spec.noise_seed is None else
                    spec.noise_seed + 1)
      estimator = CountQuantileEstimatorQuery(
          initial, spec.target_quantile, spec.clip_learning_rate,
          None if z == 0 else count_stddev, n, geometric_update=True,
          noise_seed=count_seed)
      query = AdaptiveBoundedSumQuery(sum_query, estimator,
                                      per_layer_quantiles)
    # The products the mechanism computes, in the dtypes it computes them.
    leaf_dtypes = [np.dtype(leaf.dtype.as_numpy_dtype) for leaf in
                   tf.nest.flatten(tff.types.type_to_tf_tensor_specs(
                       value_type))]
    spec.check_noise_scale(
        dtypes=sorted(set(leaf_dtypes), key=str),
        value_noise_multiplier=value_z if spec.adaptive else z,
        budgets=_initial_budgets(spec, fractions, initial_norms))
    sum_query.set_template(tff.types.type_to_tf_tensor_specs(value_type))
    if spec.denominator == 'expected':
      query = tfp.NormalizedQuery(query, denominator=float(n))
    else:
      query = ActualCountNormalizedQuery(query)
    dtypes = tf.nest.map_structure(
        lambda spec: spec.dtype, tff.types.type_to_tf_tensor_specs(value_type))
    return ResultDtypeQuery(query, dtypes)

  def create(self, value_type, weight_type=None):
    value_type = tff.types.to_type(value_type)
    aggregators.check_value_type(value_type)
    query = self.build_query(value_type)
    factory = tff.aggregators.DifferentiallyPrivateFactory(
        query, self._record_aggregation_factory)
    if weight_type is None:
      return factory.create(value_type)
    # Weights ignored on purpose (see the class docstring); the state is the
    # unweighted process's, so `extract_dp_event` works the same.
    return tff.aggregators.as_weighted_aggregator(factory).create(
        value_type, weight_type)


def dp_factory(
    bounding_method: str,
    *,
    record_aggregation_factory: Optional[
        tff.aggregators.UnweightedAggregationFactory] = None,
    **parameters,
) -> DPBoundingFactory:
  """User-level DP aggregation: bound, add N(0,(z S)^2 I) to the sum, average.

  The DP parameters are declared once, in `tff_clip.spec.DPSpec` (this
  function's signature is generated from it); `noise_multiplier` and
  `clients_per_round` are required. `record_aggregation_factory`: how the
  bounded records are summed (default `tff.aggregators.SumFactory`; a
  secure sum fits here).

  Args:
{parameters}

  Returns:
    A `DPBoundingFactory`.
  """
  unknown = sorted(set(parameters) - set(spec_lib.PARAMETERS))
  if unknown:
    raise TypeError(f'`{unknown[0]}` is not a parameter of dp_factory; its DP '
                    f'parameters are {spec_lib.PARAMETERS[1:]}.')
  spec = spec_lib.DPSpec(bounding_method=bounding_method, **parameters)
  if record_aggregation_factory is not None and not isinstance(
      record_aggregation_factory,
      tff.aggregators.UnweightedAggregationFactory):
    raise TypeError('`record_aggregation_factory` must be an unweighted '
                    f'tff.aggregators factory; got {record_aggregation_factory!r}.')
  return DPBoundingFactory(spec, record_aggregation_factory)


def _signature_from_spec(function):
  """`function`'s signature with the DP parameters of `DPSpec` spelled out."""
  signature = inspect.signature(function)
  first, record, _ = signature.parameters.values()
  declared = [
      inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY,
                        default=(inspect.Parameter.empty
                                 if field.default is dataclasses.MISSING
                                 else field.default),
                        annotation=field.type)
      for field in dataclasses.fields(spec_lib.DPSpec)[1:]]
  function.__signature__ = signature.replace(
      parameters=[first, *declared, record])
  function.__doc__ = function.__doc__.replace(
      '{parameters}', spec_lib.parameters_doc())
  return function


_signature_from_spec(dp_factory)


def extract_dp_event(aggregator_state) -> dp_accounting.DpEvent:
  """The `DpEvent` of the last round, from a DP aggregator's state."""
  return tff.aggregators.differential_privacy.extract_dp_event_from_state(
      aggregator_state)
