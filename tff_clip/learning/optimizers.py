"""Optimizers: per-step clipping, layer-wise adaptive server optimizers, decay.

Every builder here returns a `tff.learning.optimizers.Optimizer`, so it plugs
into any TFF learning algorithm (FedAvg, FedProx, Mime, ...) as a client or
server optimizer, and its learning rate can be scheduled with
`tff.learning.optimizers.schedule_learning_rate`.

  * `clipped_optimizer(inner_optimizer, clip_norm)`: clip every gradient to
    `clip_norm` (global L2 norm over the whole weight structure) before each
    step of any inner optimizer. This is the per-iteration clipping of
    FAT-Clipping-PI (Yang, Qiu, Liu, NeurIPS 2022, Algorithm 3
    line 7, Eq. (3)) and the local clipping bound C_loc of Pelikan et al.
    (NeurIPS 2025, Algorithm 1 line 11).
  * `build_lamb` / `build_lars`: layer-wise adaptive optimizers (one "layer"
    is one leaf tensor, as in `tff_clip.aggregation.bounding`), the server optimizer of
    Pelikan et al. 2025 (Appendix E.4, Eq. (E.7)). Defaults and edge cases follow optax's
    `lamb` / `lars`.
  * `build_server_sgdm` and `exponential_decay`: the server momentum and the
    0.99^k learning-rate decay of Das et al. (Das et al. 2022, Appendix G). Both reuse
    TFF (`build_sgdm`, `schedule_learning_rate`).

State and hyperparameters follow TFF's conventions (`sgdm.py`, `adam.py`): the
state is an `OrderedDict` holding the hyperparameters (learning rate under
`tff.learning.optimizers.LEARNING_RATE_KEY`), a step count where one is
needed, and per-leaf moments with the structure of the weights. Gradient
leaves that are `None` leave their weights and moments untouched.

References:
* Yang, Qiu, Liu 2022: "Taming Fat-Tailed Noise in Federated Learning",
  NeurIPS 2022.
* Pelikan et al. 2025: "Enabling Differentially Private Federated
  Learning for Speech Recognition", NeurIPS 2025.
* Das et al. 2022: "On the Convergence of DP FL on Non-Lipschitz
  Objectives, and with Normalized Client Updates".
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip import checks
from tff_clip.aggregation import bounding

__all__ = [
    'build_lamb',
    'build_lars',
    'build_server_sgdm',
    'clipped_optimizer',
    'exponential_decay',
]

_Optimizer = tff.learning.optimizers.Optimizer
_LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY
_BETA_1_KEY = 'beta_1'
_BETA_2_KEY = 'beta_2'
_EPSILON_KEY = 'epsilon'
_WEIGHT_DECAY_KEY = 'weight_decay'
_MOMENTUM_KEY = 'momentum'
_TRUST_COEFFICIENT_KEY = 'trust_coefficient'
_STEP_KEY = 'step'
# TFF's names: `accumulator` is Adam's first moment and SGDM's momentum
# buffer, `preconditioner` Adam's second moment; reused so states read alike.
_ACCUMULATOR_KEY = 'accumulator'
_PRECONDITIONER_KEY = 'preconditioner'


# ----------------------------------------------------------------------------
# Argument checks (at build time, long before any tracing).


def _known(value):
  """`value` as a number if it is known when the optimizer is built, else
  None: a symbolic tensor (e.g. a learning rate computed inside a TFF
  computation) cannot be checked at build time and is let through, as TFF's
  own optimizers do."""
  if tf.is_symbolic_tensor(value):
    return None
  number = value.numpy() if tf.is_tensor(value) else value
  if isinstance(number, np.ndarray) and number.ndim == 0:
    number = number[()]
  return number


def _check(rule, value, label: str, **kwargs) -> None:
  """A hyperparameter known at build time, checked by the `tff_clip.checks`
  `rule` (TypeError for a value of the wrong type, ValueError out of range)."""
  number = _known(value)
  if number is not None:
    rule(number, label, **kwargs)


def _check_non_negative(value, label):
  _check(checks.nonnegative_float, value, label)


def _check_positive(value, label):
  _check(checks.positive_float, value, label)


def _check_decay(value, label):
  _check(checks.probability, value, label, low_open=False)


def _check_optimizer(optimizer, label: str) -> None:
  if not isinstance(optimizer, _Optimizer):
    raise TypeError(
        f'`{label}` must be a `tff.learning.optimizers.Optimizer` (e.g. '
        '`tff.learning.optimizers.build_sgdm(0.1)`); got '
        f'{type(optimizer).__name__}: {optimizer!r}.')


# ----------------------------------------------------------------------------
# Shared pieces.


def _zeros_like_specs(specs):
  return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)


def _check_hparams(rules, hparams):
  """Each hyperparameter known now checked by its rule in `rules` (a map
  from name to `_check_*`), when the optimizer is built and by `set_hparams`
  (e.g. beta_1 = 1 would make Adam's bias correction 0)."""
  for key, value in hparams.items():
    rules[key](value, key)


def _set_hparams(state, hparams, rules):
  unknown = [key for key in hparams if key not in rules]
  if unknown:
    raise KeyError(
        f'Unknown hyperparameters {unknown}; this optimizer has {list(rules)}.')
  _check_hparams(rules, hparams)
  updated = collections.OrderedDict(state)
  updated.update(hparams)
  return updated


def _as(value, dtype):
  """`value` in `dtype`. A Python or numpy number is converted directly:
  `tf.cast` would first make it a float32 tensor, so that 0.1 became
  0.10000000149 in float64."""
  if isinstance(value, (int, float, np.number)):
    return tf.constant(value, dtype)
  return tf.cast(value, dtype)


def _widened(leaf):
  """`leaf` in the dtype it is stepped in: float64 stays, narrower floats
  (float16, bfloat16) become float32."""
  dtype = tf.float64 if leaf.dtype == tf.float64 else tf.float32
  return tf.cast(leaf, dtype)


def _trust_ratios(weights, directions, trust_coefficient=1.0, epsilon=0.0):
  """Layer-wise trust ratios, one per leaf (LARS / LAMB), in float64.

  r_h = trust_coefficient * ||w_h|| / (||u_h|| + epsilon), and r_h = 1 when
  either norm is zero: as in optax's `scale_by_trust_ratio`, a zero-initialised
  layer (a bias) must still move, and a zero update stays zero anyway. The
  norms and the ratio are float64, so that float64 weights keep their
  precision (and norms below float32's range are not 0); callers cast each
  ratio to the dtype the leaf is stepped in.

  Args:
    weights: the leaves w_h (phi = identity, Pelikan et al. 2025 Eq. (E.7)).
    directions: the leaves u_h, in the same order.
    trust_coefficient: scalar multiplier (LARS's eta; 1 for LAMB).
    epsilon: scalar added to the denominator (LARS's eps; 0 for LAMB).

  Returns:
    float64 [H].
  """
  weight_norms = bounding.layer_l2_norms(weights, tf.float64)
  update_norms = bounding.layer_l2_norms(directions, tf.float64)
  trust_coefficient = _as(trust_coefficient, tf.float64)
  epsilon = _as(epsilon, tf.float64)
  ratios = trust_coefficient * tf.math.divide_no_nan(
      weight_norms, update_norms + epsilon)
  return tf.where((weight_norms > 0) & (update_norms > 0), ratios,
                  tf.ones_like(ratios))


def _present(flat_gradients):
  """Indices of the gradient leaves that are not `None`."""
  return [i for i, g in enumerate(flat_gradients) if g is not None]


# ----------------------------------------------------------------------------
# Per-step clipping.


class _ClippedOptimizer(_Optimizer):
  """Clips each gradient to `clip_norm`, then steps `inner_optimizer`."""

  def __init__(self, inner_optimizer: _Optimizer, clip_norm: float):
    self._inner = inner_optimizer
    self._clip_norm = float(clip_norm)

  @property
  def inner_optimizer(self) -> _Optimizer:
    return self._inner

  @property
  def clip_norm(self) -> float:
    return self._clip_norm

  def initialize(self, specs: Any) -> Any:
    return self._inner.initialize(specs)

  def next(self, state, weights, gradients):
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(
        gradients)
    flat = tf.nest.flatten(gradients)
    present = _present(flat)
    if present:
      # One global norm over every leaf that has a gradient (`None` leaves
      # have no gradient to clip and are passed through as `None`).
      clipped = bounding.clip([flat[i] for i in present], self._clip_norm)
      for i, leaf in zip(present, clipped):
        flat[i] = leaf
    gradients = tf.nest.pack_sequence_as(gradients, flat)
    return self._inner.next(state, weights, gradients)

  def get_hparams(self, state):
    return self._inner.get_hparams(state)

  def set_hparams(self, state, hparams):
    return self._inner.set_hparams(state, hparams)


def clipped_optimizer(inner_optimizer: _Optimizer,
                      clip_norm: float) -> _Optimizer:
  """Clips every gradient to `clip_norm` before each step of an optimizer.

  Each step computes g <- g * min(1, clip_norm / ||g||), with ||g|| the L2
  norm over all leaves of the gradient structure, and then runs
  `inner_optimizer`'s step on the clipped gradient. This is FAT-Clipping-PI's
  per-iteration clipping (Yang, Qiu, Liu, NeurIPS 2022 -- Yang et al. 2022 --
  Algorithm 3 line 7, Eq. (3): every local stochastic gradient clipped to
  lambda) and the local clipping bound C_loc of Pelikan et al. (NeurIPS 2025 --
  Pelikan et al. 2025 -- Algorithm 1 line 11). Used as a TFF client optimizer it gives
  any TFF algorithm (FedAvg, FedProx, Mime, ...) per-step clipping; with SGD
  at learning rate eta, each local step then moves the weights by at most
  eta * clip_norm.

  The clip is `tff_clip.aggregation.bounding.clip`: a gradient with a NaN or an Inf is
  replaced by zeros (so that step leaves SGD's weights where they are)
  instead of poisoning the model.

  The state is `inner_optimizer`'s state, unchanged, and the hyperparameters
  are `inner_optimizer`'s, so `tff.learning.optimizers.schedule_learning_rate`
  works on the result (and the result can wrap a scheduled optimizer).

  Args:
    inner_optimizer: a `tff.learning.optimizers.Optimizer` (SGD(M), Adam,
      LAMB, ...).
    clip_norm: a positive finite float, the bound on each step's gradient
      norm; a normal float32 number (TensorFlow flushes subnormals to 0).

  Returns:
    A `tff.learning.optimizers.Optimizer`.

  Raises:
    TypeError: if `inner_optimizer` is not a TFF optimizer, or `clip_norm` is
      not a number.
    ValueError: if `clip_norm` is not positive, finite and normal.
  """
  _check_optimizer(inner_optimizer, 'inner_optimizer')
  if tf.is_tensor(clip_norm):
    raise TypeError(
        f'`clip_norm` must be a Python float; got a tensor {clip_norm!r}.')
  _check_positive(clip_norm, 'clip_norm')
  checks.normal_float(clip_norm, 'clip_norm')  # A subnormal one acts as 0.
  return _ClippedOptimizer(inner_optimizer, clip_norm)


# ----------------------------------------------------------------------------
# LAMB.

_LAMB_HPARAMS_RULES = collections.OrderedDict(
    ((_LEARNING_RATE_KEY, _check_non_negative), (_BETA_1_KEY, _check_decay),
     (_BETA_2_KEY, _check_decay), (_EPSILON_KEY, _check_positive),
     (_WEIGHT_DECAY_KEY, _check_non_negative)))
_LAMB_HPARAMS_KEYS = tuple(_LAMB_HPARAMS_RULES)


class _Lamb(_Optimizer):
  """LAMB, see `build_lamb`."""

  def __init__(self, learning_rate, beta_1, beta_2, epsilon, weight_decay):
    self._hparams = collections.OrderedDict(
        zip(_LAMB_HPARAMS_KEYS,
            (learning_rate, beta_1, beta_2, epsilon, weight_decay)))

  def initialize(self, specs):
    state = collections.OrderedDict(self._hparams)
    state[_STEP_KEY] = tf.constant(0, tf.int32)
    state[_ACCUMULATOR_KEY] = _zeros_like_specs(specs)
    state[_PRECONDITIONER_KEY] = _zeros_like_specs(specs)
    return state

  def next(self, state, weights, gradients):
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(
        gradients)
    tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
    step = state[_STEP_KEY] + 1
    flat_w = tf.nest.flatten(weights)
    flat_g = tf.nest.flatten(gradients)
    flat_m = tf.nest.flatten(state[_ACCUMULATOR_KEY])
    flat_v = tf.nest.flatten(state[_PRECONDITIONER_KEY])
    if not len(flat_w) == len(flat_m) == len(flat_v):
      raise ValueError(
          'The LAMB state does not match the weights; was `initialize` called '
          'with specs of these weights?')
    present = _present(flat_g)

    directions = {}
    for i in present:
      # Half-precision leaves are stepped in float32 and rounded once: in
      # float16, beta_2 = 0.9999 is 1, so 1 - beta_2 and the bias correction
      # 1 - beta_2^t were 0 (optax forms them before any rounding too).
      w, g = _widened(flat_w[i]), _widened(flat_g[i])
      beta_1, beta_2, epsilon, weight_decay, t = (
          _as(x, w.dtype) for x in (
              state[_BETA_1_KEY], state[_BETA_2_KEY], state[_EPSILON_KEY],
              state[_WEIGHT_DECAY_KEY], step))
      # Adam moments with bias correction (You et al., ICLR 2020, Algorithm 2;
      # optax `scale_by_adam`).
      m = beta_1 * tf.cast(flat_m[i], w.dtype) + (1 - beta_1) * g
      v = beta_2 * tf.cast(flat_v[i], w.dtype) + (1 - beta_2) * tf.square(g)
      m_hat = m / (1 - tf.pow(beta_1, t))
      v_hat = v / (1 - tf.pow(beta_2, t))
      # u_h + lambda theta_h of Pelikan et al. 2025 Eq. (E.7).
      directions[i] = m_hat / (tf.sqrt(v_hat) + epsilon) + weight_decay * w
      flat_m[i] = tf.cast(m, flat_m[i].dtype)
      flat_v[i] = tf.cast(v, flat_v[i].dtype)

    if present:
      ratios = _trust_ratios([flat_w[i] for i in present],
                             [directions[i] for i in present])
      for k, i in enumerate(present):
        w = _widened(flat_w[i])
        step_size = _as(state[_LEARNING_RATE_KEY], w.dtype) * tf.cast(
            ratios[k], w.dtype)
        flat_w[i] = tf.cast(w - step_size * directions[i], flat_w[i].dtype)

    new_state = collections.OrderedDict(
        (key, state[key]) for key in _LAMB_HPARAMS_KEYS)
    new_state[_STEP_KEY] = step
    new_state[_ACCUMULATOR_KEY] = tf.nest.pack_sequence_as(
        state[_ACCUMULATOR_KEY], flat_m)
    new_state[_PRECONDITIONER_KEY] = tf.nest.pack_sequence_as(
        state[_PRECONDITIONER_KEY], flat_v)
    return new_state, tf.nest.pack_sequence_as(weights, flat_w)

  def get_hparams(self, state):
    return collections.OrderedDict((k, state[k]) for k in _LAMB_HPARAMS_KEYS)

  def set_hparams(self, state, hparams):
    return _set_hparams(state, hparams, _LAMB_HPARAMS_RULES)


def build_lamb(learning_rate: float,
               beta_1: float = 0.9,
               beta_2: float = 0.999,
               epsilon: float = 1e-6,
               weight_decay: float = 0.0) -> _Optimizer:
  """Returns a `tff.learning.optimizers.Optimizer` for LAMB.

  LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT
  in 76 minutes", ICLR 2020, Algorithm 2) is Adam with a layer-wise trust
  ratio; Pelikan et al. (NeurIPS 2025, Pelikan et al. 2025, Appendix E.4, Eq. (E.7)) use
  it as the server optimizer of DP federated learning, where it rescales the
  (clipped, noised) pseudo-gradient of each layer to the layer's weight norm.
  For every leaf h (one layer) of the weights, at step t:

    m_h = beta_1 m_h + (1 - beta_1) g_h
    v_h = beta_2 v_h + (1 - beta_2) g_h^2
    u_h = (m_h / (1 - beta_1^t)) / (sqrt(v_h / (1 - beta_2^t)) + epsilon)
    d_h = u_h + weight_decay * theta_h
    theta_h <- theta_h - learning_rate * ||theta_h|| / ||d_h|| * d_h

  (phi = identity in Eq. (E.7)). As in optax's `lamb`, the trust ratio
  ||theta_h|| / ||d_h|| is 1 when either norm is zero, the Adam moments are
  bias-corrected, and the defaults are optax's. Float64 leaves are stepped
  in float64; float16 and bfloat16 leaves in float32, rounded once (their
  moments are stored in their own dtype).

  Args:
    learning_rate: a non-negative float.
    beta_1: decay of the first moment, in [0, 1).
    beta_2: decay of the second moment, in [0, 1).
    epsilon: a positive float added to sqrt(v) (outside the root).
    weight_decay: a non-negative float, lambda in Eq. (E.7).

  Returns:
    A `tff.learning.optimizers.Optimizer` whose state holds the
    hyperparameters (`learning_rate`, `beta_1`, `beta_2`, `epsilon`,
    `weight_decay`), the step count `step`, and the first (`accumulator`) and
    second (`preconditioner`) moments. Its `set_hparams` refuses the values
    refused here.
  """
  hparams = (learning_rate, beta_1, beta_2, epsilon, weight_decay)
  _check_hparams(_LAMB_HPARAMS_RULES, dict(zip(_LAMB_HPARAMS_KEYS, hparams)))
  return _Lamb(*hparams)


# ----------------------------------------------------------------------------
# LARS.

_LARS_HPARAMS_RULES = collections.OrderedDict(
    ((_LEARNING_RATE_KEY, _check_non_negative), (_MOMENTUM_KEY, _check_decay),
     (_WEIGHT_DECAY_KEY, _check_non_negative),
     (_TRUST_COEFFICIENT_KEY, _check_positive),
     (_EPSILON_KEY, _check_non_negative)))
_LARS_HPARAMS_KEYS = tuple(_LARS_HPARAMS_RULES)


class _Lars(_Optimizer):
  """LARS, see `build_lars`."""

  def __init__(self, learning_rate, momentum, weight_decay, trust_coefficient,
               epsilon, nesterov):
    self._hparams = collections.OrderedDict(
        zip(_LARS_HPARAMS_KEYS,
            (learning_rate, momentum, weight_decay, trust_coefficient,
             epsilon)))
    self._nesterov = nesterov

  def initialize(self, specs):
    state = collections.OrderedDict(self._hparams)
    state[_ACCUMULATOR_KEY] = _zeros_like_specs(specs)
    return state

  def next(self, state, weights, gradients):
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(
        gradients)
    tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
    flat_w = tf.nest.flatten(weights)
    flat_g = tf.nest.flatten(gradients)
    flat_a = tf.nest.flatten(state[_ACCUMULATOR_KEY])
    if len(flat_w) != len(flat_a):
      raise ValueError(
          'The LARS state does not match the weights; was `initialize` called '
          'with specs of these weights?')
    present = _present(flat_g)

    if present:
      directions = [
          flat_g[i] + _as(state[_WEIGHT_DECAY_KEY], flat_w[i].dtype) *
          flat_w[i] for i in present
      ]
      ratios = _trust_ratios(
          [flat_w[i] for i in present], directions,
          trust_coefficient=state[_TRUST_COEFFICIENT_KEY],
          epsilon=state[_EPSILON_KEY])
      for k, i in enumerate(present):
        w = flat_w[i]
        momentum = _as(state[_MOMENTUM_KEY], w.dtype)
        # optax's `lars` order: the learning rate scales the update *before*
        # the momentum trace (so a scheduled rate applies to new gradients
        # only), unlike TFF's SGDM, which scales the accumulated velocity.
        scaled = (_as(state[_LEARNING_RATE_KEY], w.dtype) *
                  tf.cast(ratios[k], w.dtype) * directions[k])
        flat_a[i] = scaled + momentum * flat_a[i]
        update = scaled + momentum * flat_a[i] if self._nesterov else flat_a[i]
        flat_w[i] = w - update

    new_state = collections.OrderedDict(
        (key, state[key]) for key in _LARS_HPARAMS_KEYS)
    new_state[_ACCUMULATOR_KEY] = tf.nest.pack_sequence_as(
        state[_ACCUMULATOR_KEY], flat_a)
    return new_state, tf.nest.pack_sequence_as(weights, flat_w)

  def get_hparams(self, state):
    return collections.OrderedDict((k, state[k]) for k in _LARS_HPARAMS_KEYS)

  def set_hparams(self, state, hparams):
    return _set_hparams(state, hparams, _LARS_HPARAMS_RULES)


def build_lars(learning_rate: float,
               momentum: float = 0.9,
               weight_decay: float = 0.0,
               trust_coefficient: float = 0.001,
               epsilon: float = 0.0,
               nesterov: bool = False) -> _Optimizer:
  """Returns a `tff.learning.optimizers.Optimizer` for LARS.

  LARS (You, Gitman, Ginsburg, "Large Batch Training of Convolutional
  Networks", 2017, Algorithm 1) scales each layer's step by a trust ratio
  eta ||w_h|| / ||g_h + beta w_h||; Pelikan et al. 2025 (Appendix G.4, Tables 8-9)
  compares it with LAMB as the server optimizer. Following optax's `lars`
  (defaults included), for every leaf h of the weights:

    d_h = g_h + weight_decay * w_h
    r_h = trust_coefficient * ||w_h|| / (||d_h|| + epsilon)
          (r_h = 1 when ||w_h|| or ||d_h|| is zero)
    a_h = learning_rate * r_h * d_h + momentum * a_h
    w_h <- w_h - a_h                       (nesterov=False)
    w_h <- w_h - (learning_rate * r_h * d_h + momentum * a_h)  (nesterov=True)

  Args:
    learning_rate: a non-negative float.
    momentum: the momentum decay, in [0, 1).
    weight_decay: a non-negative float.
    trust_coefficient: a positive float, eta above.
    epsilon: a non-negative float added to the trust ratio's denominator.
    nesterov: whether to use Nesterov momentum (fixed at build time, not a
      hyperparameter of the state).

  Returns:
    A `tff.learning.optimizers.Optimizer` whose state holds the
    hyperparameters (`learning_rate`, `momentum`, `weight_decay`,
    `trust_coefficient`, `epsilon`) and the momentum trace `accumulator`.
    Its `set_hparams` refuses the values refused here.
  """
  hparams = (learning_rate, momentum, weight_decay, trust_coefficient,
             epsilon)
  _check_hparams(_LARS_HPARAMS_RULES, dict(zip(_LARS_HPARAMS_KEYS, hparams)))
  return _Lars(*hparams, checks.boolean(nesterov, 'nesterov'))


# ----------------------------------------------------------------------------
# Server momentum and learning-rate decay.


def build_server_sgdm(learning_rate: float, momentum: float) -> _Optimizer:
  """Server SGD with momentum: TFF's `build_sgdm`, arguments checked.

  Das et al. (Das et al. 2022, Appendix G) apply server momentum 0.8 on top of
  DP-FedAvg / DP-NormFedAvg. The update is TFF's: v <- momentum v + g,
  w <- w - learning_rate v. For their 0.99^k decay, wrap the result:
  `tff.learning.optimizers.schedule_learning_rate(build_server_sgdm(lr, 0.8),
  exponential_decay(lr))`.

  Args:
    learning_rate: a non-negative float.
    momentum: the momentum decay, in [0, 1).

  Returns:
    A `tff.learning.optimizers.Optimizer`.
  """
  _check_non_negative(learning_rate, 'learning_rate')
  _check_decay(momentum, 'momentum')
  return tff.learning.optimizers.build_sgdm(learning_rate, momentum=momentum)


def exponential_decay(
    initial_learning_rate: float,
    decay_rate: float = 0.99) -> Callable[[Any], tf.Tensor]:
  """The schedule k -> initial_learning_rate * decay_rate**k.

  Das et al. 2022 (Appendix G, after Bottou 2012) decays the learning
  rate by 0.99 every round: eta_k = 0.99^k eta_0. Use the schedule with
  `tff.learning.optimizers.schedule_learning_rate(optimizer, schedule)`, which
  calls it with the index k (from 0) of the optimizer's step. On a server
  optimizer one step is one round. A client optimizer's state is re-created
  every round, so for a per-round client decay pass the schedule as
  `client_learning_rate_fn` to
  `tff.learning.algorithms.build_weighted_fed_avg_with_optimizer_schedule`.

  Args:
    initial_learning_rate: eta_0, a non-negative float.
    decay_rate: the factor per step, in (0, 1].

  Returns:
    A function of an integer (Python int or integer tensor) returning a
    float32 scalar tensor; usable inside `tf.function` and TFF computations.
  """
  _check_non_negative(initial_learning_rate, 'initial_learning_rate')
  _check(checks.probability, decay_rate, 'decay_rate', high_open=False)

  def schedule(step):
    return tf.cast(initial_learning_rate, tf.float32) * tf.pow(
        tf.cast(decay_rate, tf.float32), tf.cast(step, tf.float32))

  return schedule
