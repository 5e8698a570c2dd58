"""User-level differential privacy for every bounding: Gaussian noise on the sum.

Privacy model: user-level (client-level) DP under add/remove-one-client
adjacency (McMahan et al. 2018, "Learning Differentially Private Recurrent
Language Models"; Zhang et al. 2022's DP-FedAvg and Pelikan et al. 2025). Each round:

  1. every client update u_i is bounded by `tff_clip.aggregation.bounding` (clip,
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
`tff_clip.privacy.accounting` composes those events with the sampling used.

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

import dataclasses
import inspect
import math
from typing import Optional

import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_clip.aggregation import aggregators
from tff_clip.aggregation import bounding
from tff_clip.aggregation import dp_queries
from tff_clip.aggregation import noise_following
from tff_clip.aggregation import spec as spec_lib

# The queries (`tff_clip.aggregation.dp_queries`) are re-exported below.
__all__ = dp_queries.__all__ + [
    'BaseDPBoundingFactory',
    'DPBoundingFactory',
    'TFF_NAMES',
    'UnweightedDPBoundingFactory',
    'WeightedDPBoundingFactory',
    'adaptive_noise_multipliers',
    'default_clipped_count_stddev',
    'dp_factory',
    'extract_dp_event',
]


# The queries (`tff_clip.aggregation.dp_queries`) and the placements, re-exported: `dp` is
# where users find them.
from tff_clip.aggregation.dp_queries import ActualCountNormalizedQuery, AdaptiveBoundedSumQuery, BoundedGaussianSumQuery, CountQuantileEstimatorQuery, ResultDtypeQuery, secret_key  # pylint: disable=g-bad-import-order,wrong-import-position,unused-import
from tff_clip.names import NOISE_PLACEMENTS  # pylint: disable=g-bad-import-order,wrong-import-position,unused-import


# ----------------------------------------------------------------------------
# Noise calibration for adaptive clipping.


# Defined with the rules that follow the noise (`noise_following`).
adaptive_noise_multipliers = noise_following.adaptive_noise_multipliers
default_clipped_count_stddev = noise_following.default_clipped_count_stddev
MAX_VALUE_NOISE_INFLATION = noise_following.MAX_VALUE_NOISE_INFLATION


# ----------------------------------------------------------------------------
# The factory.


def _initial_budgets(spec, fractions, initial_norms):
  """The per-layer budgets C_h a per-layer query starts from (else None)."""
  if not spec.per_layer:
    return None
  if np.ndim(initial_norms) == 1:  # Per-layer quantiles: one norm per layer.
    return np.asarray(initial_norms, np.float64)
  return float(initial_norms) * np.asarray(fractions, np.float64)


class BaseDPBoundingFactory:
  """Bounding + Gaussian noise + mean: what the three DP factories share.

  `dp_factory` returns one of its subclasses, by `weighted`:
  `DPBoundingFactory` (both kinds), `UnweightedDPBoundingFactory` or
  `WeightedDPBoundingFactory`. Every client counts once in all three: the
  DP mean is unweighted (weighting by example counts would make the
  sensitivity depend on private data), a weighted `create` ignores the
  weights.
  """

  def __init__(self, spec: spec_lib.DPSpec,
               record_aggregation_factory: Optional[
                   tff.aggregators.UnweightedAggregationFactory] = None,
               resolved: Optional[noise_following.ResolvedMechanism] = None):
    self._spec = spec
    self._record_aggregation_factory = record_aggregation_factory
    if resolved is not None and (
        resolved.noise_multiplier != spec.noise_multiplier or
        resolved.clients_per_round != spec.clients_per_round):
      raise ValueError(
          f'`resolved` was resolved at z = {resolved.noise_multiplier}, n = '
          f'{resolved.clients_per_round}; the spec has z = '
          f'{spec.noise_multiplier}, n = {spec.clients_per_round}.')
    self._resolved = resolved

  @property
  def spec(self) -> spec_lib.DPSpec:
    """The checked description of the mechanism (frozen)."""
    return self._spec

  @property
  def record_aggregation_factory(self):
    """How bounded records are summed (None: `tff.aggregators.SumFactory`)."""
    return self._record_aggregation_factory

  def resolve(self, value_type) -> noise_following.ResolvedMechanism:
    """The mechanism that runs for updates of `value_type`: what
    `build_query` builds from. The `resolved` object the factory was made
    with (the training program resolves once, before it builds anything,
    and records that object), refused for a `value_type` of another size
    or number of layers; else `noise_following.resolve` with d the number
    of values in `value_type` and its tensors as the layers."""
    leaves = tf.nest.flatten(tff.types.type_to_tf_tensor_specs(value_type))
    dimension = sum(leaf.shape.num_elements() for leaf in leaves)
    if self._resolved is None:
      return noise_following.resolve(self._spec, dimension,
                                     layers=max(len(leaves), 1))
    if (self._resolved.dimension, self._resolved.layers) != (
        dimension, max(len(leaves), 1)):
      raise ValueError(
          f'`resolved` was resolved for {self._resolved.dimension} values in '
          f'{self._resolved.layers} tensors; the update has {dimension} in '
          f'{len(leaves)}.')
    return self._resolved

  def build_query(self, value_type) -> tfp.SumAggregationDPQuery:
    """The tensorflow-privacy query `create` wraps, for `value_type`.

    A new query on every call (the factory is not changed), e.g. for
    `tff_clip.privacy.audit.CanaryFactory`, which wraps it in its canaries.
    """
    spec = self._spec
    tensor_specs = tff.types.type_to_tf_tensor_specs(value_type)
    leaves = tf.nest.flatten(tensor_specs)
    # The model's size d: with z and n it sets the default bounding and
    # quantile (`tff_clip.aggregation.noise_following`), resolved once.
    resolved = self.resolve(value_type)
    method = resolved.bounding
    per_layer = spec.per_layer
    num_layers = len(leaves)
    fractions = None
    if per_layer:
      fractions = bounding.layer_budget_fractions(
          value_type, spec.split,
          None if spec.adaptive else spec.clip_norm)
    n = spec.clients_per_round
    initial_norms = spec.clip_norm  # A scalar, or one per layer.
    # The value's noise multiplier: z, or with an adaptive norm its share
    # of z beside the clipped count's noise (`noise_following.noise_split`).
    value_z = resolved.value_noise_multiplier
    if not spec.adaptive:
      query = sum_query = BoundedGaussianSumQuery(
          method, spec.clip_norm, value_z, fractions, spec.noise_seed,
          spec.noise_placement, n, spec.noise)
    else:
      per_layer_quantiles = per_layer and spec.per_layer_quantiles
      initial = spec.initial_clip_norm
      if per_layer_quantiles:
        # Every layer starts at C0 / sqrt(H) (sqrt(sum C_h^2) = C0), not at
        # the `split` fractions: a layer's norm is unknown until estimated,
        # and the 'dim' start (C0 sqrt(d_h / d)) clipped the EMNIST CNN's
        # small layers to 1-9% of their update norms for a whole run
        # (docs/frontier_tuned.md, "Per-layer bounding on the CNN").
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
          initial, resolved.target_quantile, spec.clip_learning_rate,
          resolved.clipped_count_stddev, n, geometric_update=True,
          noise_seed=count_seed, switch=resolved.quantile_switch)
      query = AdaptiveBoundedSumQuery(sum_query, estimator,
                                      per_layer_quantiles)
    # The products the mechanism computes, in the dtypes it computes them.
    leaf_dtypes = [np.dtype(leaf.dtype.as_numpy_dtype) for leaf in leaves]
    spec.check_noise_scale(
        dtypes=sorted(set(leaf_dtypes), key=str),
        value_noise_multiplier=value_z,
        budgets=_initial_budgets(spec, fractions, initial_norms))
    sum_query.set_template(tensor_specs)
    if spec.denominator == 'expected':
      query = tfp.NormalizedQuery(query, denominator=float(n))
    else:
      query = ActualCountNormalizedQuery(query)
    dtypes = tf.nest.map_structure(lambda leaf: leaf.dtype, tensor_specs)
    return ResultDtypeQuery(query, dtypes)

  def _create_process(self, value_type, weight_type=None):
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


class DPBoundingFactory(BaseDPBoundingFactory,
                        tff.aggregators.UnweightedAggregationFactory,
                        tff.aggregators.WeightedAggregationFactory):
  """Bounding + Gaussian noise + mean, weighted and unweighted alike.

  Unweighted by nature (DP-FedAvg weighs clients uniformly). It also accepts
  `create(value_type, weight_type)` so it drops into
  `build_weighted_fed_avg(model_aggregator=...)`: the weights are then
  IGNORED -- every client counts once, as with `client_weighting=UNIFORM` --
  because weighting by example counts would make the sensitivity depend on
  private data. Being both kinds, TFF's wrappers (`zeroing_factory`,
  `clipping_factory`) make it weighted; `dp_factory(..., weighted=False)`
  gives the unweighted-only factory they keep unweighted.
  """

  def create(self, value_type, weight_type=None):
    return self._create_process(value_type, weight_type)


class UnweightedDPBoundingFactory(BaseDPBoundingFactory,
                                  tff.aggregators.UnweightedAggregationFactory):
  """An `UnweightedAggregationFactory` only, like TFF's
  `DifferentiallyPrivateFactory`: `tff.aggregators.zeroing_factory(norm,
  dp_factory(..., weighted=False))` stays unweighted, for
  `build_unweighted_fed_avg`."""

  def create(self, value_type):
    return self._create_process(value_type)


class WeightedDPBoundingFactory(BaseDPBoundingFactory,
                                tff.aggregators.WeightedAggregationFactory):
  """A `WeightedAggregationFactory` only, for `build_weighted_fed_avg`;
  the weights are ignored (see `DPBoundingFactory`)."""

  def create(self, value_type, weight_type):
    return self._create_process(value_type, weight_type)


# TFF's names for dp_factory's parameters (`DifferentiallyPrivateFactory.
# gaussian_adaptive`/`gaussian_fixed`/`tree_aggregation`,
# `tff.learning.ddp_secure_aggregator`): refused with the name to use, so
# that a TFF user's call fails in one line instead of meaning something else.
TFF_NAMES = {
    'target_unclipped_quantile': 'target_quantile',
    'initial_l2_norm_clip': 'initial_clip_norm',
    'learning_rate': 'clip_learning_rate',
    'clip': 'clip_norm',
    'l2_norm_clip': 'clip_norm',
    'expected_clients_per_round': 'clients_per_round',
}

_WEIGHTINGS = {None: DPBoundingFactory, False: UnweightedDPBoundingFactory,
               True: WeightedDPBoundingFactory}


def dp_factory(
    bounding_method: str,
    *,
    record_aggregation_factory: Optional[
        tff.aggregators.UnweightedAggregationFactory] = None,
    weighted: Optional[bool] = None,
    **parameters,
) -> BaseDPBoundingFactory:
  """User-level DP aggregation: bound, add N(0,(z S)^2 I) to the sum, average.

  The DP parameters are declared once, in `tff_clip.aggregation.spec.DPSpec` (this
  function's signature is generated from it); `noise_multiplier` and
  `clients_per_round` are required. `record_aggregation_factory`: how the
  bounded records are summed (default `tff.aggregators.SumFactory`; a
  secure sum fits here). `weighted`: None (default) gives a factory that is
  both an unweighted and a weighted `tff.aggregators` factory (it drops into
  `build_unweighted_fed_avg` and `build_weighted_fed_avg` alike); False an
  `UnweightedAggregationFactory` only, like TFF's
  `DifferentiallyPrivateFactory` (what `tff.aggregators.zeroing_factory`
  needs as its inner factory to stay unweighted); True a weighted one only.
  The DP mean ignores client weights in all three. TFF's names for the same
  parameters (`target_unclipped_quantile`, `initial_l2_norm_clip`, `clip`,
  ...) are refused with the name to use (`TFF_NAMES`).

  Refused here, each naming its argument, because they would run without a
  word and not be what was asked: a parameter this aggregation would not
  read (`spec.unread`: `split` given to a global bounding or to per-layer
  quantiles, an adaptive norm's parameters to a fixed `clip_norm`, `bands` to
  independent noise, `blt_buffers` to noise other than BLT); correlated noise (`noise_mechanism` banded, tree, blt) without
  `min_separation` (it is private only when each client takes part at most
  once every `min_separation` >= `bands` rounds, which the caller's sampler
  must enforce); BLT without `rounds` (its factorization is optimized for
  the run's length).

  Args:
{parameters}

  Returns:
    A `DPBoundingFactory` (weighted None), `UnweightedDPBoundingFactory`
    (False) or `WeightedDPBoundingFactory` (True).
  """
  unknown = sorted(set(parameters) - set(spec_lib.PARAMETERS))
  for name in unknown:
    if name in TFF_NAMES:
      raise TypeError(
          f'`{name}` is TFF\'s name; tff_clip calls it `{TFF_NAMES[name]}`: '
          f'dp_factory(..., {TFF_NAMES[name]}=...).')
  if unknown:
    raise TypeError(f'`{unknown[0]}` is not a parameter of dp_factory; its DP '
                    f'parameters are {spec_lib.PARAMETERS[1:]}.')
  missing = [name for name in spec_lib.PARAMETERS[1:] if name not in
             parameters and spec_lib.parameter(name).default is
             dataclasses.MISSING]
  if missing:
    raise TypeError(f'dp_factory() needs `{missing[0]}`.')
  spec = spec_lib.DPSpec(bounding_method=bounding_method, **parameters)
  unread = spec_lib.unread(spec, parameters)
  if unread is not None:
    raise ValueError(
        f'`{unread[0]}` applies only with {unread[1]}; this aggregation '
        'would not read it. Leave it out.')
  if spec.noise.correlated and spec.min_separation is None:
    raise ValueError(
        f'`min_separation`: noise_mechanism={spec.noise.name!r} correlates '
        'the noise of successive rounds and is private only when each client '
        f'takes part at most once every min_separation >= bands ({spec.bands})'
        ' rounds; give the separation your sampler enforces '
        '(docs/correlated_noise.md).')
  spec.noise.check_participation()  # E.g. BLT without `rounds`.
  if record_aggregation_factory is not None and not isinstance(
      record_aggregation_factory,
      tff.aggregators.UnweightedAggregationFactory):
    raise TypeError('`record_aggregation_factory` must be an unweighted '
                    f'tff.aggregators factory; got {record_aggregation_factory!r}.')
  nested = _nested_factories(record_aggregation_factory)
  for inner in nested:
    _check_record_sum(inner, record_aggregation_factory)
    _check_secure_sum_range(spec, inner)
  if not isinstance(weighted, (bool, type(None))):
    raise TypeError('`weighted` must be None (both kinds), False (an '
                    'UnweightedAggregationFactory) or True (a '
                    f'WeightedAggregationFactory); got {weighted!r}.')
  return _WEIGHTINGS[weighted](spec, record_aggregation_factory)


def _nested_factories(factory) -> list:
  """`factory` and every factory it wraps, outermost first: those held as
  attributes (`HadamardTransformFactory`'s inner one) and those TFF's
  zeroing and clipping wrappers hold in the closure of their `create`."""
  kinds = (tff.aggregators.UnweightedAggregationFactory,
           tff.aggregators.WeightedAggregationFactory)
  found, pending = [], [factory] if factory is not None else []
  while pending:
    current = pending.pop(0)
    if any(current is seen for seen in found):
      continue
    found.append(current)
    held = list(getattr(current, '__dict__', {}).values())
    for cell in getattr(type(current).create, '__closure__', None) or ():
      try:
        held.append(cell.cell_contents)
      except ValueError:  # A cell not filled yet.
        pass
    pending += [value for value in held if isinstance(value, kinds)]
  return found


def _check_record_sum(inner, outer) -> None:
  """Refuses what would not sum the bounded records as they are: a mean
  (`tff.learning.secure_aggregator(weighted=False)` ends in one: the
  records would be averaged, then divided by the cohort again), or TFF's
  zeroing and clipping wrappers, which change each client's record by its
  norm and release, without noise, how many they zeroed or clipped and the
  norm they estimated from the clients' records (epsilon covers none)."""
  where = ('' if inner is outer else
           f' (inside {type(outer).__name__})')
  if isinstance(inner, (tff.aggregators.UnweightedMeanFactory,
                        tff.aggregators.MeanFactory)):
    raise TypeError('`record_aggregation_factory` must sum the bounded '
                    'records (e.g. tff.aggregators.SecureSumFactory); got a '
                    f'mean, {type(inner).__name__}{where}.')
  if type(inner).__module__ == _TFF_ROBUST_MODULE:
    raise TypeError(
        '`record_aggregation_factory` must sum the bounded records as they '
        f'are; got TFF\'s zeroing or clipping, {type(inner).__name__}{where}, '
        'which changes each record by its norm and releases, without noise, '
        'how many records it zeroed or clipped (epsilon does not cover them).'
        ' The DP factory bounds every record already; give '
        'tff.aggregators.SecureSumFactory.')


_TFF_ROBUST_MODULE = tff.aggregators.zeroing_factory.__module__


def _check_secure_sum_range(spec: spec_lib.DPSpec, factory) -> None:
  """Refuses a secure sum that could clamp what the query sums.

  `tff.aggregators.SecureSumFactory` clamps every summand to [lower, upper]
  and reports, without noise, how many clients it clamped
  (`secure_upper_clipped_count`, `secure_lower_clipped_count` in the
  measurements). Beside the bounded values the query sums counts of its
  own: 1 per client (denominator='actual'; a noise-free adaptive norm's
  weight) and +-1/2 per client (an adaptive norm's clipped count); clamped,
  they would double the mean or bias the norm's estimate. A fixed norm's
  values reach C in each coordinate, with client noise C plus
  `CLAMP_FREE_STDDEVS` client noise standard deviations: clamped, the mean
  is biased, the clamped counts tell how many clients' updates reached past
  the thresholds, and clamped client noise is not the Gaussian the
  accountant charges (a threshold at C keeps only noise pointing inward).
  An adaptive norm's reach moves, and so do estimated thresholds: with
  client noise they are refused; else only the counts are checked.
  """
  if not isinstance(factory, tff.aggregators.SecureSumFactory):
    return
  counts = []
  if spec.denominator == 'actual' or (spec.adaptive and
                                      spec.noise_multiplier == 0):
    counts.append(1.0)
  if spec.adaptive:
    counts += [-0.5, 0.5]
  client_noise = spec.noise_placement == 'client' and spec.noise_multiplier > 0
  upper = factory._upper_bound_threshold  # pylint: disable=protected-access
  lower = factory._lower_bound_threshold  # pylint: disable=protected-access
  constant = isinstance(upper, (float, np.floating))
  if client_noise and (spec.adaptive or not constant):
    raise ValueError(
        "`record_aggregation_factory`: with noise_placement='client' a "
        'SecureSumFactory clamps each client\'s noisy record, and clamped '
        'noise is not the Gaussian noise the accountant charges; its '
        'constant thresholds can be checked against a fixed `clip_norm` '
        'only (give one, and constant float thresholds, or '
        "noise_placement='central').")
  if not constant:  # Integers: TFF refuses them.
    if counts and isinstance(upper, tff.templates.EstimationProcess):
      raise ValueError(
          '`record_aggregation_factory`: a SecureSumFactory with estimated '
          'thresholds may clamp the counts this query sums beside the values '
          f'(each of {sorted(set(counts))} per client); give constant '
          f'thresholds from at most {min(counts):g} to at least '
          f'{max(counts):g}.')
    return
  lower = -upper if lower is None else lower
  if counts and (lower > min(counts) or upper < max(counts)):
    raise ValueError(
        f'`record_aggregation_factory`: SecureSumFactory clamps every summand '
        f'to [{lower:g}, {upper:g}], and this query sums counts of '
        f'{sorted(set(counts))} per client beside the values (the mean or the '
        f'clip norm would come out wrong); give thresholds from at most '
        f'{min(counts):g} to at least {max(counts):g}.')
  if spec.adaptive:
    return
  # Each coordinate of a bounded record is at most C in magnitude; with
  # client noise each client adds N(0, (z C / sqrt(n))^2) to it.
  stddev = (spec.noise_multiplier * spec.clip_norm /
            math.sqrt(spec.clients_per_round)) if client_noise else 0.0
  reach = spec.clip_norm + CLAMP_FREE_STDDEVS * stddev
  if lower <= -reach and upper >= reach:
    return
  if client_noise:
    raise ValueError(
        f'`record_aggregation_factory`: SecureSumFactory clamps every summand '
        f'to [{lower:g}, {upper:g}], and with noise_placement=\'client\' a '
        f'summand is a value of at most C = {spec.clip_norm:g} plus client '
        f'noise of std z C / sqrt(n) = {stddev:.4g}: clamped, the noise is '
        'not the Gaussian the accountant charges. Give thresholds from at '
        f'most {-reach:.6g} to at least {reach:.6g} (C + '
        f'{CLAMP_FREE_STDDEVS:g} std), or noise_placement=\'central\'.')
  raise ValueError(
      f'`record_aggregation_factory`: SecureSumFactory clamps every summand '
      f'to [{lower:g}, {upper:g}], inside the bounded values\' reach of C = '
      f'{spec.clip_norm:g}: it would bias the mean, and its measurements '
      'would release, without noise, how many clients it clamped (which '
      f'epsilon does not cover). Give thresholds from at most {-reach:g} to '
      f'at least {reach:g}.')


# Client noise under a secure sum: thresholds at C + 20 standard deviations
# clamp a coordinate with probability 2 Phi(-20) = 5.5e-89; over every
# coordinate, client and round a run can have (1e9 x 1e6 x 1e5) below
# 1e-60. The clamped mechanism differs from the Gaussian one only on that
# event, so it is (epsilon, delta + 1e-60)-DP where the ledger says
# (epsilon, delta).
CLAMP_FREE_STDDEVS = 20.0


def _signature_from_spec(function):
  """`function`'s signature with the DP parameters of `DPSpec` spelled out."""
  signature = inspect.signature(function)
  first, record, weighted, _ = signature.parameters.values()
  declared = [
      inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY,
                        default=(inspect.Parameter.empty
                                 if field.default is dataclasses.MISSING
                                 else field.default),
                        annotation=field.type)
      for field in dataclasses.fields(spec_lib.DPSpec)[1:]]
  function.__signature__ = signature.replace(
      parameters=[first, *declared, record, weighted])
  function.__doc__ = function.__doc__.replace(
      '{parameters}', spec_lib.parameters_doc())
  return function


_signature_from_spec(dp_factory)


def extract_dp_event(aggregator_state) -> dp_accounting.DpEvent:
  """The `DpEvent` of the last round, from a DP aggregator's state.

  Raises TypeError, naming where the DP state is, for any other state: a
  learning process's whole state (the DP state is `state.aggregator`), a
  wrapper's (TFF's `zeroing_factory` holds it at `['inner_agg']`) or a
  non-private factory's.
  """
  if not _is_dp_state(aggregator_state):
    found = list(_dp_state_paths(aggregator_state, ''))
    where = (f'; its DP aggregator state is at `{found[0]}`: '
             f'dp.extract_dp_event(state{found[0]})' if len(found) == 1 else
             f'; it holds DP aggregator states at {found}: pick one'
             if found else ', which holds no DP aggregator state (a '
             'non-private factory\'s?)')
    raise TypeError('`aggregator_state` must be the state of a DP '
                    'aggregator (`state.aggregator` of a process built with '
                    f'dp_factory); got {type(aggregator_state).__name__}'
                    f'{where}.')
  return tff.aggregators.differential_privacy.extract_dp_event_from_state(
      aggregator_state)


def _is_dp_state(value) -> bool:
  # TFF's `DPAggregatorState`, or the same fields as a runtime returns them.
  return hasattr(value, 'dp_event') and hasattr(value, 'is_init_state')


def _dp_state_paths(value, path: str):
  """The paths (`.aggregator['inner_agg']`) of the DP states in `value`."""
  if _is_dp_state(value):
    yield path
  elif isinstance(value, dict):
    for key, item in value.items():
      yield from _dp_state_paths(item, f'{path}[{key!r}]')
  elif hasattr(value, '_fields'):  # A NamedTuple (LearningAlgorithmState).
    for name in value._fields:
      yield from _dp_state_paths(getattr(value, name), f'{path}.{name}')
  elif isinstance(value, (list, tuple)):
    for index, item in enumerate(value):
      yield from _dp_state_paths(item, f'{path}[{index}]')
