"""Empirical privacy audit in the same training run: canary clients.

The ledger (`tff_clip.privacy.accounting`) says what epsilon a run may claim IF the
code does what it says. This module measures, on the very run that trains
the model, how distinguishable a client's participation actually is:

1. Canary clients (Andrew et al., "One-shot Empirical Privacy Estimation for
   Federated Learning", ICLR 2024, Sec. 3-4, Algorithm 2). m = 2K candidate
   canaries, each a random direction drawn from a secret audit seed. Each
   candidate is *inserted* into the population with probability 1/2
   (independent fair coins, as one-run auditing requires: Steinke, Nasr,
   Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023,
   Sec. 3); the others are never inserted and give the null distribution.
   Every round each inserted canary takes part with probability
   q = clients_per_round / population, the marginal law of a real client under
   both Poisson and fixed-size sampling.

   A canary is a worst-case client: its raw update has norm
   `canary_raw_norm` (1e6, far above any clip norm) and goes through the DP
   query's own `preprocess_record` -- the project's bounding -- so it arrives
   exactly at the sensitivity: C u/||u|| for global clip/normalize, and every
   layer at its per-layer budget C_h for per-layer bounding (fixed or
   adaptive). Its bounded record is added to the sum of the real clients'
   records BEFORE the noise, inside `get_noised_result` (server-side, the
   `update` part of a MapReduceForm), which is distributionally the same as
   a canary client's bounded record arriving through the secure sum. A
   mechanism that skipped the bounding would let the canary through at norm
   1e6, and the audit sees it.

2. Test statistics (Andrew et al. Sec. 4-5). For candidate j with bounded
   direction c_j:
     * final model:  g_j = cos(c_j, theta_0 - theta_T)          (Alg. 2;
       theta_0 - theta_T because TFF's updates are initial - trained);
     * all iterates: g_j = max_t cos(c_j, Delta_t), Delta_t the released
       noisy aggregate of round t (the model delta up to the server
       optimizer), and a second statistic h_j = max_t cos(c_j, Delta_t -
       Delta_{t-1}) that an adversary seeing all iterates can equally compute
       and that exposes noise reused across rounds (it cancels in the
       difference).
   The all-iterates statistics are accumulated inside the query state every
   round (so they survive checkpoint/resume); the final-model one is
   computed at the end from the model weights.

   Correlated noise (banded matrix factorization, tree aggregation:
   `tff_clip.aggregation.correlated_noise`) is audited under its own participation:
   canaries take part with minimum separation b, each inserted canary in
   every round of its group (the k = ceil(T / b) participations the ledger
   allows a client), and a third all-iterates statistic undoes the noise's
   correlation before the cosine: w_j = max_t cos(c_j, sum_i a_i
   Delta_{t-i}), with `whitening_weights` a (the bands of C for banded noise,
   the node sums of the tree), whose noise is independent across rounds. With
   adaptive norms the noise scale changes from round to round and the
   whitening is approximate: that can only weaken the attack, never the
   validity of the lower bound, which holds for any statistic.

3. The estimate and the lower bound from those statistics
   (`tff_clip.privacy.audit_statistics`): Andrew et al.'s epsilon of a pair of
   Gaussians fitted to the inserted and the never-inserted candidates' (an
   ESTIMATE, not a bound), and Steinke, Nasr and Jagielski's one-run lower
   bound at the stated confidence (Thm. 5.2), which a correct mechanism
   keeps below the ledger's epsilon. Each canary's privacy is that of the
   ledger (Poisson sampling with the run's q and noise; under fixed-size
   sampling the ledger accounts replace-one adjacency, which is weaker than
   the canary's add/remove, so the comparison stays valid).

What the numbers do NOT say: a small empirical epsilon does not prove the
run private (the canary is one attack, the estimate has sampling error and
the lower bound only certifies leakage it saw), and the real clients'
privacy may differ from a worst-case canary's only in being better. See
docs/audit.md.

Randomness: the canary directions, the coins and the per-round
participation derive from the audit seed, which is drawn from the OS's
secret randomness unless the caller fixes it (`seed=`). It lives in the
aggregator state (checkpointed with it, like the noise seed) and must stay
as secret as the noise: whoever knows it knows which canaries were inserted.
"""

from __future__ import annotations

import collections
import math
import secrets
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_clip import checks
from tff_clip.aggregation import aggregators
from tff_clip.aggregation import mechanisms

__all__ = [
    'CanaryFactory',
    'estimate_range',
    'CanaryQuery',
    'audit_report',
    'canary_state',
    'estimate_epsilon',
    'whitening_weights',
    'gaussian_pair_epsilon',
    'one_run_lower_bound',
    'one_run_p_value',
]

# The statistics (`tff_clip.privacy.audit_statistics`), re-exported.
from tff_clip.privacy.audit_statistics import DEFAULT_CONFIDENCE, GUESS_FRACTIONS, estimate_epsilon, estimate_range, gaussian_pair_epsilon, one_run_lower_bound, one_run_p_value, threat_summary  # pylint: disable=g-bad-import-order,wrong-import-position,unused-import

CANARY_RAW_NORM = 1e6
# The most memory a round's bounded candidates may take to be drawn once
# (`CanaryQuery`); larger models draw each candidate twice instead.
CANARY_STORE_BYTES = 64 * 2**20


# ----------------------------------------------------------------------------
# The canary query.


CanaryGlobalState = collections.namedtuple(
    'CanaryGlobalState',
    ['inner', 'seed', 'round', 'inserted', 'max_cosine', 'max_step_cosine',
     'previous_result', 'max_whitened_cosine', 'past_results'])


def whitening_weights(noise_mechanism: str, bands: int, round_num):
  """a_0..a_{b-1} such that sum_j a_j Delta_{t-j} carries independent noise.

  The released aggregates Delta_t = x_t + s (C^{-1} z)_t of correlated noise
  (`tff_clip.aggregation.correlated_noise`) are correlated across rounds; an adversary
  who knows C undoes it with the mechanism's own weights
  (`NoiseMechanism.whitening_weights`: the bands of C for banded noise, the
  node sums of the tree, [1] for independent noise). `round_num` may be a
  tensor; returns a float32 tensor.
  """
  return mechanisms.noise_mechanism(noise_mechanism,
                                    bands).whitening_weights(round_num)


def _fold(seed, *data):
  for value in data:
    seed = tf.random.experimental.stateless_fold_in(
        seed, tf.cast(value, tf.int64))
  return seed


def _dot(xs, ys):
  return tf.add_n([tf.reduce_sum(tf.cast(x, tf.float32) * tf.cast(y, tf.float32))
                   for x, y in zip(xs, ys)] or [tf.constant(0.0)])


def _cosine(xs, ys):
  return tf.math.divide_no_nan(
      _dot(xs, ys), tf.sqrt(_dot(xs, xs)) * tf.sqrt(_dot(ys, ys)))


def _cosines(candidates, ys):
  """cos(c_j, y) for every row c_j of the [m, d_h] leaves `candidates`."""
  flat_ys = [tf.reshape(tf.cast(y, tf.float32), [-1]) for y in ys]
  dots = tf.add_n([tf.linalg.matvec(c, y)
                   for c, y in zip(candidates, flat_ys)])
  norms = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(c), 1)
                            for c in candidates]))
  return tf.math.divide_no_nan(dots, norms * tf.sqrt(_dot(ys, ys)))


class CanaryQuery(tfp.SumAggregationDPQuery):
  """Wraps a DP sum query: adds the round's canaries to the sum before noise.

  Records of real clients go through the inner query unchanged. In
  `get_noised_result` each inserted candidate takes part with probability
  q; its raw update (a random direction of norm `canary_raw_norm`, per layer
  for per-layer bounding) goes through the inner `preprocess_record` (the
  bounding at the current clip norm) and is accumulated into the sample
  state; then the inner query adds its noise. Afterwards the cosine of every
  candidate's bounded direction with the released aggregate (and with its
  change since the previous round) updates the running maxima in the state.
  The bounded candidates are kept between the two steps when they take at
  most `CANARY_STORE_BYTES`, and drawn again otherwise.

  Participation with minimum separation (`separation=b`, for runs sampled
  with `sampling='min_separation'`): candidate j belongs to one of b groups
  (a draw from the audit seed) and an inserted candidate takes part in round
  t iff t mod b is its group, and then with probability q: with q = 1 every
  canary takes part the k = ceil(T / b) times, b rounds apart, that the
  ledger's accounting allows a client. Correlated noise
  (`noise_mechanism`, `bands`, `rounds`: the inner query's) adds a third
  statistic, the cosine with the whitened aggregate (the mechanism's
  `whitening_weights`); it keeps the past aggregates those weights need
  (`whitening_depth`) in the state.

  The inner query's preprocessed record must start (in `tf.nest.flatten`
  order) with the value's leaves: true of every query in `tff_clip.aggregation.dp`.
  """

  def __init__(self, inner_query: tfp.SumAggregationDPQuery, record_specs,
               num_candidates: int, sampling_probability: float,
               per_layer: bool, seed: Optional[int] = None,
               canary_raw_norm: float = CANARY_RAW_NORM, *,
               separation: Optional[int] = None,
               noise_mechanism='independent', bands: int = 1,
               rounds: Optional[int] = None, **options):
    if not isinstance(inner_query, tfp.SumAggregationDPQuery):
      raise TypeError('`inner_query` must be a tfp.SumAggregationDPQuery; got '
                      f'{inner_query!r}.')
    checks.integer(num_candidates, 'num_candidates', minimum=2)
    sampling_probability = checks.probability(
        sampling_probability, 'sampling_probability', high_open=False)
    self._inner = inner_query
    self._specs = record_specs
    self._flat_specs = tf.nest.flatten(record_specs)
    self._m = int(num_candidates)
    self._q = sampling_probability
    self._per_layer = bool(per_layer)
    self._raw_norm = checks.positive_float(canary_raw_norm, 'canary_raw_norm')
    if seed is None:  # Secret: from the OS, never from public config.
      seed = [secrets.randbits(62), secrets.randbits(62)]
    elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
      seed = [int(seed), 0]
    else:
      raise TypeError(f'`seed` must be an int or None; got {seed!r}.')
    self._seed = np.asarray(seed, np.int64)
    # The inner query's noise (a `NoiseMechanism`, or its name, `bands`,
    # `rounds` and options), under the canaries' participation: refused
    # where it is not private (correlated noise without `separation`, or one
    # below `bands`).
    self._noise = mechanisms.noise_mechanism(
        noise_mechanism, bands, rounds=rounds, separation=separation,
        **options)
    if self._noise.separation != separation:
      raise ValueError(f'`noise_mechanism` {self._noise!r} is not built for '
                       f'the canaries\' `separation` ({separation}).')
    self._noise.check_participation()
    self._separation = self._noise.separation
    # Aggregates kept for the whitened statistic.
    self._depth = self._noise.whitening_depth
    # The bounded candidates kept between the two passes of a round (one
    # draw each, cosines as matrix products) when they fit in
    # CANARY_STORE_BYTES; otherwise drawn again for the cosines.
    size = sum(int(np.prod(s.shape)) for s in self._flat_specs)
    self._store = 4 * size * self._m <= CANARY_STORE_BYTES

  @property
  def num_candidates(self) -> int:
    return self._m

  @property
  def inner_query(self):
    return self._inner

  @property
  def whitens(self) -> bool:
    """Whether the aggregates are whitened (correlated noise)."""
    return self._depth > 0

  def groups(self, seed):
    """Candidate j's participation group (0..separation-1), or None."""
    if self._separation is None:
      return None
    return tf.random.stateless_uniform(
        [self._m], _fold(seed, 4), maxval=self._separation, dtype=tf.int64)

  def takes_part(self, global_state):
    """1.0 for every candidate that takes part in this round, else 0.0."""
    seed = global_state.seed
    present = global_state.inserted * tf.cast(
        tf.random.stateless_uniform(
            [self._m], _fold(seed, 2, global_state.round)) < self._q,
        tf.float32)
    if self._separation is not None:
      present *= tf.cast(tf.equal(self.groups(seed),
                                  global_state.round % self._separation),
                         tf.float32)
    return present

  # -- canaries --

  def raw_canary(self, seed, index):
    """Candidate `index`'s raw update: a random direction of norm R.

    Global boundings: R u/||u||, u ~ N(0, I) (isotropic). Per-layer: every
    layer R u_h/||u_h||, so per-layer bounding puts each layer at C_h.
    """
    key = _fold(seed, 3, index)
    leaves = [tf.random.stateless_normal(spec.shape, _fold(key, i),
                                         dtype=tf.float32)
              for i, spec in enumerate(self._flat_specs)]
    if self._per_layer:
      leaves = [leaf * tf.math.divide_no_nan(
          self._raw_norm, tf.norm(tf.reshape(leaf, [-1]))) for leaf in leaves]
    else:
      scale = tf.math.divide_no_nan(self._raw_norm, tf.sqrt(_dot(leaves, leaves)))
      leaves = [leaf * scale for leaf in leaves]
    leaves = [tf.cast(leaf, spec.dtype)
              for leaf, spec in zip(leaves, self._flat_specs)]
    return tf.nest.pack_sequence_as(self._specs, leaves)

  def bounded_canary(self, params, seed, index):
    """(preprocessed record, its value leaves) of candidate `index`."""
    record = self._inner.preprocess_record(params, self.raw_canary(seed, index))
    flat = tf.nest.flatten(record)
    value = flat[:len(self._flat_specs)]
    return record, value

  def inserted(self, seed):
    """The fair coins: candidate j is a canary client iff inserted[j]."""
    return tf.cast(
        tf.random.stateless_uniform([self._m], _fold(seed, 1)) < 0.5,
        tf.float32)

  # -- DPQuery --

  def initial_global_state(self):
    seed = tf.constant(self._seed)
    zeros = [tf.zeros(s.shape, s.dtype) for s in self._flat_specs]
    return CanaryGlobalState(
        inner=self._inner.initial_global_state(), seed=seed,
        round=tf.constant(0, tf.int64), inserted=self.inserted(seed),
        max_cosine=tf.fill([self._m], -2.0),
        max_step_cosine=tf.fill([self._m], -2.0),
        previous_result=zeros,
        max_whitened_cosine=tf.fill([self._m], -2.0),
        past_results=[tf.zeros([self._depth] + s.shape.as_list(), tf.float32)
                      for s in self._flat_specs])

  def derive_sample_params(self, global_state):
    return self._inner.derive_sample_params(global_state.inner)

  def initial_sample_state(self, template=None):
    return self._inner.initial_sample_state(template)

  def preprocess_record(self, params, record):
    return self._inner.preprocess_record(params, record)

  def derive_metrics(self, global_state):
    # Canary participation is never released.
    return self._inner.derive_metrics(global_state.inner)

  def get_noised_result(self, sample_state, global_state):
    seed = global_state.seed
    params = self._inner.derive_sample_params(global_state.inner)
    takes_part = self.takes_part(global_state)

    def add_canary(j, state, stored):
      record, value = self.bounded_canary(params, seed, j)
      weight = takes_part[j]
      record = tf.nest.map_structure(lambda x: x * tf.cast(weight, x.dtype),
                                     record)
      stored = [a.write(j, tf.cast(v, tf.float32))
                for a, v in zip(stored, value)]
      return (j + 1, self._inner.accumulate_preprocessed_record(state, record),
              stored)

    stored = ([tf.TensorArray(tf.float32, self._m, element_shape=s.shape)
               for s in self._flat_specs] if self._store else [])
    _, sample_state, stored = tf.while_loop(
        lambda j, *_: j < self._m, add_canary,
        (tf.constant(0), sample_state, stored))
    result, inner_state, event = self._inner.get_noised_result(
        sample_state, global_state.inner)

    flat_result = tf.nest.flatten(result)
    step = [r - tf.cast(p, r.dtype)
            for r, p in zip(flat_result, global_state.previous_result)]
    past_results = global_state.past_results
    whitened = flat_result
    if self._depth:
      weights = self._noise.whitening_weights(global_state.round)
      whitened, past_results = [], []
      for r, past in zip(flat_result, global_state.past_results):
        r = tf.cast(r, tf.float32)
        whitened.append(weights[0] * r + tf.tensordot(weights[1:], past, 1))
        past_results.append(tf.concat([r[tf.newaxis], past[:-1]], 0))

    if self._store:
      candidates = [tf.reshape(a.stack(), [self._m, -1]) for a in stored]
      cos, step_cos, white_cos = (
          _cosines(candidates, target)
          for target in (flat_result, step, whitened))
    else:
      def cosines(j, cos, step_cos, white_cos):
        _, value = self.bounded_canary(params, seed, j)
        cos = cos.write(j, _cosine(value, flat_result))
        step_cos = step_cos.write(j, _cosine(value, step))
        white_cos = white_cos.write(j, _cosine(value, whitened))
        return j + 1, cos, step_cos, white_cos

      _, cos, step_cos, white_cos = tf.while_loop(
          lambda j, *_: j < self._m, cosines,
          (tf.constant(0), tf.TensorArray(tf.float32, self._m),
           tf.TensorArray(tf.float32, self._m),
           tf.TensorArray(tf.float32, self._m)))
      cos, step_cos, white_cos = cos.stack(), step_cos.stack(), white_cos.stack()
    new_state = CanaryGlobalState(
        inner=inner_state, seed=seed, round=global_state.round + 1,
        inserted=global_state.inserted,
        max_cosine=tf.maximum(global_state.max_cosine, cos),
        max_step_cosine=tf.maximum(global_state.max_step_cosine, step_cos),
        previous_result=[tf.cast(r, s.dtype)
                         for r, s in zip(flat_result, self._flat_specs)],
        max_whitened_cosine=tf.maximum(global_state.max_whitened_cosine,
                                       white_cos),
        past_results=past_results)
    return result, new_state, event

  # -- after training --

  def final_model_cosines(self, global_state, model_delta) -> np.ndarray:
    """cos(c_j, model_delta) for every candidate (see `audit_report`).

    c_j is the candidate's bounded direction at the final state's clip norm
    (constant for fixed clip norms and global adaptive clipping).
    """
    flat_delta = [tf.constant(np.asarray(x)) for x in
                  tf.nest.flatten(model_delta)]
    if [tuple(x.shape) for x in flat_delta] != [
        tuple(s.shape) for s in self._flat_specs]:
      raise ValueError('`model_delta` must have the aggregated value\'s '
                       f'structure {self._specs}; got shapes '
                       f'{[tuple(x.shape) for x in flat_delta]}.')
    inner_state = tf.nest.map_structure(tf.convert_to_tensor,
                                        global_state.inner)

    @tf.function
    def cosines(inner_state, seed, flat_delta):
      params = self._inner.derive_sample_params(inner_state)

      def body(j, out):
        _, value = self.bounded_canary(params, seed, j)
        return j + 1, out.write(j, _cosine(value, flat_delta))

      _, out = tf.while_loop(lambda j, _: j < self._m, body,
                             (tf.constant(0), tf.TensorArray(tf.float32,
                                                             self._m)))
      return out.stack()

    return cosines(inner_state,
                   tf.constant(np.asarray(global_state.seed, np.int64)),
                   flat_delta).numpy().astype(np.float64)


# ----------------------------------------------------------------------------
# The factory and the report.


class CanaryFactory(tff.aggregators.UnweightedAggregationFactory,
                    tff.aggregators.WeightedAggregationFactory):
  """A `dp.dp_factory` aggregator with 2K canary candidates inside its query.

  Same process, state layout and `DpEvent` as the wrapped factory's (its
  query state is a `CanaryGlobalState` around the original one), so the
  ledger and the training loop see no difference. About K canaries are
  inserted (each of the 2K candidates with probability 1/2).
  """

  def __init__(self, dp_factory, num_canaries: int,
               sampling_probability: float, seed: Optional[int] = None,
               canary_raw_norm: float = CANARY_RAW_NORM, *,
               separation: Optional[int] = None):
    from tff_clip.aggregation import dp  # pylint: disable=g-import-not-at-top
    if not isinstance(dp_factory, dp.BaseDPBoundingFactory):
      raise TypeError('`dp_factory` must come from `tff_clip.aggregation.dp.dp_factory`; '
                      f'got {dp_factory!r}.')
    checks.integer(num_canaries, 'num_canaries', minimum=1)
    checks.probability(sampling_probability, 'sampling_probability',
                       high_open=False)
    self._dp_factory = dp_factory
    self._num_canaries = int(num_canaries)
    self._q = float(sampling_probability)
    self._seed = seed
    self._raw_norm = canary_raw_norm
    self._separation = separation

  def build_query(self, value_type) -> 'CanaryQuery':
    """The `CanaryQuery` that `create` wraps, for `value_type`: a new one
    on every call (the factory is not changed), e.g. for `audit_report`
    after training (the canaries' seed is read from the state)."""
    value_type = tff.types.to_type(value_type)
    aggregators.check_value_type(value_type)
    inner = self._dp_factory.build_query(value_type)
    return CanaryQuery(
        inner, tff.types.type_to_tf_tensor_specs(value_type),
        2 * self._num_canaries, self._q,
        per_layer=self._dp_factory.spec.per_layer,
        seed=self._seed, canary_raw_norm=self._raw_norm,
        separation=self._separation,
        noise_mechanism=self._dp_factory.spec.noise_under(self._separation))

  def create(self, value_type, weight_type=None):
    """The audited aggregation process; like TFF's factories, no side
    effect (`build_query` gives its query)."""
    factory = tff.aggregators.DifferentiallyPrivateFactory(
        self.build_query(value_type),
        self._dp_factory.record_aggregation_factory)
    if weight_type is None:
      return factory.create(value_type)
    return tff.aggregators.as_weighted_aggregator(factory).create(
        value_type, weight_type)


def canary_state(aggregator_state) -> CanaryGlobalState:
  """The `CanaryGlobalState` inside an aggregator's (or learning) state."""
  stack = [aggregator_state]
  while stack:
    node = stack.pop()
    if isinstance(node, CanaryGlobalState) or (
        hasattr(node, '_fields') and
        tuple(node._fields) == CanaryGlobalState._fields):
      return CanaryGlobalState(*node)
    if hasattr(node, '_fields'):
      stack.extend(node)
    elif isinstance(node, (list, tuple)):
      stack.extend(node)
    elif isinstance(node, dict):
      stack.extend(node.values())
    elif hasattr(node, '__attrs_attrs__'):
      stack.extend(getattr(node, a.name) for a in node.__attrs_attrs__)
  raise ValueError('`aggregator_state` holds no canary state: was the '
                   'aggregator built by `audit.CanaryFactory`?')


def audit_report(query: CanaryQuery, aggregator_state, model_delta,
                 delta: float,
                 confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Any]:
  """Both threat models' estimates and lower bounds.

  Args:
    query: the run's `CanaryQuery` (`CanaryFactory.build_query` of the
      aggregated value's type: the state holds the canaries' seed).
    aggregator_state: the final aggregator (or whole learning) state.
    model_delta: the model's total movement in the aggregated value's
      structure AND sign convention, or None to skip the final-model threat
      model. For TFF's FedAvg, whose client updates are (initial - trained)
      weights and whose server subtracts the aggregate, that is
      theta_0 - theta_T. (The estimate does not care about the sign; the
      lower bound guesses the highest cosines, so it does.)
    delta: the run's delta.
    confidence: of the lower bounds, in (0, 1).

  Returns:
    {'final_model': {...}, 'all_iterates': {...}, ...}: per threat model
    `estimate` (Andrew et al.), `lower_bound` (Steinke et al., at
    `confidence`) and the fitted means/stds.
  """
  state = canary_state(aggregator_state)
  inserted = np.asarray(state.inserted) > 0.5
  report = collections.OrderedDict(
      candidates=int(inserted.size), inserted=int(inserted.sum()),
      rounds=int(state.round), delta=delta, confidence=confidence)

  if model_delta is not None:
    report['final_model'] = threat_summary(
        [query.final_model_cosines(state, model_delta)], inserted, delta,
        confidence)
  iterates = [np.asarray(state.max_cosine, np.float64),
               np.asarray(state.max_step_cosine, np.float64)]
  if query.whitens:
    iterates.append(np.asarray(state.max_whitened_cosine, np.float64))
  report['all_iterates'] = threat_summary(iterates, inserted, delta,
                                         confidence)
  return report


def format_report(report: dict[str, Any], ledger_epsilon: float,
                  accountant: Optional[str] = None) -> str:
  """Human-readable lines for the end of a run; `accountant` names the
  ledger epsilon's (the run's one figure)."""
  named = f' by {accountant.upper()}' if accountant else ''
  lines = [f'empirical privacy audit: {report["inserted"]} canary clients '
           f'inserted of {report["candidates"]} candidates, delta = '
           f'{report["delta"]:g} (ledger epsilon = {ledger_epsilon:.4g}'
           f'{named})']
  for name, label in (('final_model', 'final model '),
                      ('all_iterates', 'all iterates')):
    if name in report:
      row = report[name]
      lines.append(
          f'  {label}: estimated epsilon = {row["estimate"]:.3g}, lower bound '
          f'= {row["lower_bound"]:.3g} at {report["confidence"]:.0%} '
          'confidence')
  lines.append('  (an estimate and a lower bound from one attack, not a '
               'guarantee: see docs/audit.md)')
  return '\n'.join(lines)
