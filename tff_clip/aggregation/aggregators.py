"""TFF aggregation factories that bound every client update before aggregating.

Each factory wraps an inner factory (the mean by default), so concerns stack
the TFF way: bound, then (optionally, see `tff_clip.aggregation.dp`) noise, then mean.
The bounding math lives in `tff_clip.aggregation.bounding`; this module only moves values
between placements and reports what happened.

Boundings (one client's update u, clip norm C, per-layer budgets C_h):
  * 'clip'                 u * min(1, C/||u||)    difference clipping, CE-FedAvg
                                                  (Zhang et al. 2022, Zhang et al. 2022)
  * 'normalize'            C u / ||u||            DP-NormFedAvg (Das et al.,
                                                  Das et al. 2022)
  * 'per_layer_clip'       u_h * min(1, C_h/||u_h||), sum_h C_h^2 = C^2
                                                  (Pelikan et al. 2025, Pelikan et al. 2025)
  * 'per_layer_normalize'  C_h u_h / ||u_h||

`clip_norm` is a float or a `tff.templates.EstimationProcess` (TFF's
convention, see `tff.aggregators.clipping_factory`): fixed and adaptive norms
take the same code path. The process's `report` gives the norm in use; its
`next` receives every client's pre-bounding global L2 norm (float32 at
CLIENTS) -- or, for per-layer bounding with a process that reports one norm
per layer ([H] float32), every client's per-layer norms, and the reported
vector is used as the budgets directly.

Measurements (stable names), merged with the inner factory's under 'inner':
  clip_norm        the total norm C in use this round
  layer_budgets    [H] per-layer norms C_h (per-layer boundings only)
  clipped_fraction fraction of (finite) clients whose update was scaled down
  mean_norm        mean pre-bounding global L2 norm over finite updates
  max_norm         max pre-bounding global L2 norm over finite updates
  mean_layer_norms [H] mean pre-bounding per-layer norms (per-layer only)
  max_layer_norms  [H] max pre-bounding per-layer norms (per-layer only)
  nonfinite_count  clients whose update had a NaN/Inf and was zeroed
These describe raw client norms and are NOT differentially private: the DP
factories in `tff_clip.aggregation.dp` report none of them.

References:
* Zhang et al. 2022: "Understanding Clipping for Federated Learning:
  Convergence and Client-Level Differential Privacy", ICML 2022.
* Pelikan et al. 2025: "Enabling Differentially Private Federated
  Learning for Speech Recognition", NeurIPS 2025.
* Das et al. 2022: "On the Convergence of DP FL on Non-Lipschitz
  Objectives, and with Normalized Client Updates".
"""

from __future__ import annotations

import collections
from typing import Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip import checks
from tff_clip.aggregation import bounding
from tff_clip.aggregation import mechanisms
from tff_clip.aggregation import spec

__all__ = [
    'BOUNDINGS',
    'bounding_factory',
    'clip_factory',
    'normalize_factory',
    'per_layer_clip_factory',
    'per_layer_normalize_factory',
]

BOUNDINGS = bounding.BOUNDINGS
NORM_DTYPE = np.float32
# DPSpec's: a bounding splits its norm the same way with or without DP.
_DEFAULT_SPLIT = spec.parameter('split').default

NormSource = Union[float, tff.templates.EstimationProcess]
InnerFactory = Union[tff.aggregators.UnweightedAggregationFactory,
                     tff.aggregators.WeightedAggregationFactory]


# ----------------------------------------------------------------------------
# Argument checks, at construction time: long before any tracing.


def check_norm_source(clip_norm, label: str = 'clip_norm') -> NormSource:
  if isinstance(clip_norm, tff.templates.EstimationProcess):
    return clip_norm
  return checks.positive_float(clip_norm, label)


def check_value_type(value_type, label: str = 'value_type'):
  if isinstance(value_type, tff.types.FederatedType):
    raise TypeError(f'`{label}` must be an unplaced type; got {value_type}.')
  if not tff.types.is_structure_of_floats(value_type):
    raise TypeError(
        f'`{label}` must be a structure of float tensors (float16, float32 '
        f'or float64: TFF has no bfloat16 type); got {value_type}.')
  leaves = tff.structure.flatten(value_type) if isinstance(
      value_type, tff.types.StructType) else [value_type]
  if not leaves:
    raise ValueError(f'`{label}` is an empty structure: there is no update '
                     'to bound.')
  for leaf in leaves:
    if not tff.types.is_tensorflow_compatible_type(leaf) or (
        leaf.shape is None or any(d is None for d in leaf.shape)):
      raise ValueError(f'`{label}` must have fully defined shapes (norms and '
                       f'noise need every dimension); got {value_type}.')
  if all(0 in leaf.shape for leaf in leaves):
    raise ValueError(f'`{label}` has no elements (every tensor is zero-size): '
                     f'there is no update to bound; got {value_type}.')


def constant_norm_process(value: float) -> tff.templates.EstimationProcess:
  """An `EstimationProcess` whose report is always `value` (stateless)."""
  init_fn = tff.federated_computation(
      lambda: tff.federated_value((), tff.SERVER))
  next_fn = tff.federated_computation(
      lambda state, norms: state, init_fn.type_signature.result,
      tff.FederatedType(NORM_DTYPE, tff.CLIENTS))
  report_fn = tff.federated_computation(
      lambda state: tff.federated_value(np.float32(value), tff.SERVER),
      init_fn.type_signature.result)
  return tff.templates.EstimationProcess(init_fn, next_fn, report_fn)


def _report_shape(process: tff.templates.EstimationProcess):
  result = process.report.type_signature.result
  member = result.member if isinstance(result, tff.types.FederatedType) else result
  if not isinstance(member, tff.types.TensorType) or member.dtype != NORM_DTYPE:
    raise TypeError(
        '`clip_norm` process must report a float32 tensor at SERVER; found '
        f'{result}.')
  return tuple(member.shape)


# ----------------------------------------------------------------------------
# The factory.

_SUMMARY_NAMES = ('clipped_fraction', 'mean_norm', 'max_norm',
                  'mean_layer_norms', 'max_layer_norms', 'nonfinite_count')


class _BoundingFactoryBase:
  """Bounds each client value with `bounding.bound`, then the inner factory."""

  def __init__(self, method: str, clip_norm: NormSource,
               split: bounding.Split, inner_agg_factory):
    self._per_layer = mechanisms.bounding(method, 'bounding').per_layer
    self._method = method
    self._clip_norm = check_norm_source(clip_norm)
    if self._per_layer:
      bounding.check_split(split)
      if isinstance(split, bounding.ExplicitBudgets):
        if not isinstance(self._clip_norm, float):
          raise ValueError(
              '`split`: explicit budgets need a fixed float `clip_norm`; with '
              'an adaptive norm use a split name or per-layer weights.')
        bounding.check_sum_rule(split, self._clip_norm)
    self._split = split
    self._inner = inner_agg_factory

  def _norm_process(self):
    if isinstance(self._clip_norm, float):
      return constant_norm_process(self._clip_norm)
    return self._clip_norm

  def _create(self, value_type, weight_type=None, inner=None):
    """Builds the process; `inner` (default: the constructor's) takes the mean."""
    inner = self._inner if inner is None else inner
    value_type = tff.types.to_type(value_type)
    check_value_type(value_type)
    method, per_layer = self._method, self._per_layer
    norm_process = self._norm_process()
    report_shape = _report_shape(norm_process)
    num_layers = len(tf.nest.flatten(
        tff.types.type_to_tf_tensor_specs(value_type)))
    vector_norm = per_layer and report_shape == (num_layers,)
    if report_shape != () and not vector_norm:
      raise TypeError(
          f'`clip_norm` process reports shape {report_shape}; expected a '
          f'scalar{" or one norm per layer (" + str(num_layers) + ",)" if per_layer else ""}.')
    fractions = None
    if per_layer:
      # Static per-layer fractions; the budgets are the (possibly moving)
      # clip norm times these. Checks the split against the layer count here,
      # at `create`, not during tracing.
      fractions = bounding.layer_budget_fractions(
          value_type, self._split,
          self._clip_norm if isinstance(self._clip_norm, float) else None)
    norm_type = tff.types.TensorType(NORM_DTYPE, report_shape)

    @tff.tensorflow.computation(value_type, norm_type)
    def bound_fn(value, norm):
      if per_layer:
        budgets = (norm if vector_norm else
                   bounding.budgets_from_fractions(norm, fractions))
        result = bounding.bound(value, method, budgets=budgets)
      else:
        result = bounding.bound(value, method, clip_norm=norm)
      finite = tf.logical_not(result.nonfinite)
      # What the norm process sees for a non-finite update: +inf ("above any
      # clip"), so a NaN never enters a quantile estimate.
      global_norm = tf.where(finite, result.global_norm, np.inf)
      layer_norms = tf.where(finite, result.layer_norms, np.inf)
      stats = collections.OrderedDict(
          clients=tf.constant(1, tf.int32),
          finite=tf.cast(finite, tf.int32),
          bounded=tf.cast(result.was_bounded, tf.int32),
          nonfinite=tf.cast(result.nonfinite, tf.int32),
          norm_sum=tf.where(finite, result.global_norm, 0.0),
          layer_norm_sum=tf.where(finite, result.layer_norms, 0.0),
      )
      maxima = collections.OrderedDict(
          norm=tf.where(finite, result.global_norm, 0.0),
          layer_norms=tf.where(finite, result.layer_norms, 0.0),
      )
      reported = layer_norms if vector_norm else global_norm
      return result.value, reported, stats, maxima

    if per_layer:
      @tff.tensorflow.computation(norm_type)
      def budgets_fn(norm):
        if vector_norm:
          return norm, tf.sqrt(tf.reduce_sum(tf.square(norm)))
        return bounding.budgets_from_fractions(norm, fractions), norm

    @tff.tensorflow.computation(bound_fn.type_signature.result[2],
                                bound_fn.type_signature.result[3])
    def summarize(stats, maxima):
      finite = tf.maximum(tf.cast(stats['finite'], tf.float32), 1.0)
      out = collections.OrderedDict(
          clipped_fraction=tf.cast(stats['bounded'], tf.float32) / finite,
          mean_norm=stats['norm_sum'] / finite,
          max_norm=maxima['norm'],
      )
      if per_layer:
        out['mean_layer_norms'] = stats['layer_norm_sum'] / finite
        out['max_layer_norms'] = maxima['layer_norms']
      out['nonfinite_count'] = stats['nonfinite']
      return out

    if weight_type is None:
      inner_process = inner.create(value_type)
    else:
      inner_process = inner.create(value_type, weight_type)

    @tff.federated_computation()
    def init_fn():
      return tff.federated_zip(collections.OrderedDict(
          clip_norm=norm_process.initialize(),
          inner=inner_process.initialize()))

    def next_impl(state, value, weight=None):
      norm = norm_process.report(state.clip_norm)
      bounded, reported, stats, maxima = tff.federated_map(
          bound_fn, (value, tff.federated_broadcast(norm)))
      new_norm_state = norm_process.next(state.clip_norm, reported)
      if weight is None:
        inner_output = inner_process.next(state.inner, bounded)
      else:
        inner_output = inner_process.next(state.inner, bounded, weight)
      summary = tff.federated_map(
          summarize, (tff.federated_sum(stats), tff.federated_max(maxima)))
      measurements = collections.OrderedDict()
      if per_layer:
        layer_budgets, total_norm = tff.federated_map(budgets_fn, norm)
        measurements['clip_norm'] = total_norm
        measurements['layer_budgets'] = layer_budgets
      else:
        measurements['clip_norm'] = norm
      for name in _SUMMARY_NAMES:
        if per_layer or 'layer' not in name:
          measurements[name] = summary[name]
      measurements['inner'] = inner_output.measurements
      return tff.templates.MeasuredProcessOutput(
          state=tff.federated_zip(collections.OrderedDict(
              clip_norm=new_norm_state, inner=inner_output.state)),
          result=inner_output.result,
          measurements=tff.federated_zip(measurements))

    state_type = init_fn.type_signature.result
    if weight_type is None:
      next_fn = tff.federated_computation(
          lambda state, value: next_impl(state, value), state_type,
          tff.FederatedType(value_type, tff.CLIENTS))
    else:
      next_fn = tff.federated_computation(
          lambda state, value, weight: next_impl(state, value, weight),
          state_type, tff.FederatedType(value_type, tff.CLIENTS),
          tff.FederatedType(weight_type, tff.CLIENTS))
    return tff.templates.AggregationProcess(init_fn, next_fn)


class BoundingFactory(_BoundingFactoryBase,
                      tff.aggregators.UnweightedAggregationFactory,
                      tff.aggregators.WeightedAggregationFactory):
  """Bounding before the mean; usable weighted and unweighted.

  `create(value_type)` bounds then takes `tff.aggregators.UnweightedMeanFactory`
  ; `create(value_type, weight_type)` bounds then takes the weighted
  `tff.aggregators.MeanFactory`. So one object drops into
  `build_weighted_fed_avg(model_aggregator=...)` and
  `build_unweighted_fed_avg(model_aggregator=...)` alike.
  """

  def __init__(self, method, clip_norm, split=_DEFAULT_SPLIT):
    super().__init__(method, clip_norm, split, None)

  def create(self, value_type, weight_type=None):
    # The mean is chosen per call, never stored: `create` leaves the factory
    # as it was, so one factory serves weighted and unweighted calls alike.
    if weight_type is None:
      inner = tff.aggregators.UnweightedMeanFactory()
    else:
      inner = tff.aggregators.MeanFactory()
    return self._create(value_type, weight_type, inner)


class UnweightedBoundingFactory(_BoundingFactoryBase,
                                tff.aggregators.UnweightedAggregationFactory):
  """Bounding before an unweighted inner factory."""

  def create(self, value_type):
    return self._create(value_type)


class WeightedBoundingFactory(_BoundingFactoryBase,
                              tff.aggregators.WeightedAggregationFactory):
  """Bounding before a weighted inner factory (weights go to the inner one)."""

  def create(self, value_type, weight_type):
    return self._create(value_type, weight_type)


def bounding_factory(bounding_method: str,
                     clip_norm: NormSource,
                     split: bounding.Split = _DEFAULT_SPLIT,
                     inner_agg_factory: Optional[InnerFactory] = None):
  """A factory that bounds each client update, then aggregates with the inner.

  Args:
    bounding_method: 'clip', 'normalize', 'per_layer_clip' or
      'per_layer_normalize' (see the module docstring for formulas and
      papers); 'noise_following', tff_clip's default, is 'clip' here, where
      no noise is added.
    clip_norm: C, a positive float, or a `tff.templates.EstimationProcess`
      reporting float32 at SERVER (adaptive norms; for per-layer boundings it
      may report one norm per layer).
    split: per-layer boundings only: 'uniform', 'dim', per-layer weights or
      `bounding.ExplicitBudgets` (see `bounding.layer_budget_fractions`).
    inner_agg_factory: what aggregates the bounded values. None: the mean,
      weighted or unweighted as `create` is called. A weighted (unweighted)
      inner factory makes the result weighted (unweighted), as in TFF.

  Returns:
    A `tff.aggregators` factory.
  """
  # Without noise (r = 0), 'noise_following' bounds as it does at low noise.
  bounding_method = mechanisms.bounding(bounding_method).resolve(
      0.0, 1.0, 1).name
  if inner_agg_factory is None:
    return BoundingFactory(bounding_method, clip_norm, split)
  if isinstance(inner_agg_factory, tff.aggregators.WeightedAggregationFactory):
    return WeightedBoundingFactory(bounding_method, clip_norm, split,
                                   inner_agg_factory)
  if isinstance(inner_agg_factory,
                tff.aggregators.UnweightedAggregationFactory):
    return UnweightedBoundingFactory(bounding_method, clip_norm, split,
                                     inner_agg_factory)
  raise TypeError('`inner_agg_factory` must be a tff.aggregators factory; got '
                  f'{inner_agg_factory!r}.')


def clip_factory(clip_norm: NormSource,
                 inner_agg_factory: Optional[InnerFactory] = None):
  """Global L2 clipping u * min(1, C/||u||) (Zhang et al. 2022, CE-FedAvg)."""
  return bounding_factory('clip', clip_norm, inner_agg_factory=inner_agg_factory)


def normalize_factory(clip_norm: NormSource,
                      inner_agg_factory: Optional[InnerFactory] = None):
  """Normalization C u/||u|| (Das et al. 2022, DP-NormFedAvg); zero stays zero."""
  return bounding_factory('normalize', clip_norm,
                          inner_agg_factory=inner_agg_factory)


def per_layer_clip_factory(clip_norm: NormSource,
                           split: bounding.Split = _DEFAULT_SPLIT,
                           inner_agg_factory: Optional[InnerFactory] = None):
  """Per-layer clipping u_h min(1, C_h/||u_h||), sum C_h^2 = C^2."""
  return bounding_factory('per_layer_clip', clip_norm, split,
                          inner_agg_factory)


def per_layer_normalize_factory(
    clip_norm: NormSource,
    split: bounding.Split = _DEFAULT_SPLIT,
    inner_agg_factory: Optional[InnerFactory] = None):
  """Per-layer normalization C_h u_h/||u_h||, sum C_h^2 = C^2."""
  return bounding_factory('per_layer_normalize', clip_norm, split,
                          inner_agg_factory)
