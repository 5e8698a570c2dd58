"""Client work: local training that shapes the update before it is bounded.

The first arrow of the data flow (task -> client work -> bounding -> noise ->
mean -> server optimizer). Everything here happens on the client, before the
update reaches any aggregator of `tff_clip.aggregation.aggregators`; the bounding, the
noise and the mean stay the aggregator's job, so every client algorithm here
composes with every aggregator.

The math is pure TensorFlow over `tf.nest` structures, testable without TFF:

  * `blur_penalty(weights, reference, clip_norm, strength)`: BLUR, Bounded
    Local Update Regularization (Cheng et al., "Differentially Private
    Federated Learning with Local Regularization and Sparsification", CVPR
    2022, Eq. (5)): the client minimises
      h_i(w) = f_i(w) + (lambda/2) max(0, ||w - w_t||^2 - S^2),
    w_t the model received this round, S the DP clip norm.
  * `lus_scores`, `lus_keep_counts`, `lus_mask`, `lus_sparsify`: LUS, Local
    Update Sparsification (Cheng et al. 2022, Eqs. (11)-(13), Algorithm 2):
    each entry of the update is scored T = |grad f_i(w_local) * delta_w| and
    only the s_h highest-scoring entries of every layer are kept. They live
    in `tff_clip.learning.sparsification` and are re-exported here.
  * `clipped_model_update(initial_weights, local_weights, clip_norm)`: model
    clipping (Zhang et al., "Understanding Clipping for Federated Learning",
    ICML 2022, Section 2.1 and Claim 2.1). A BASELINE ONLY, the
    paper's negative example: it does not converge to the optimum.

`build_client_work` wraps them in a `tff.learning.templates.ClientWorkProcess`
that drops into `tff.learning.templates.compose_learning_process` (see
`tff_clip.learning.algorithms.build_fedavg`). Without any of them it is TFF's own
`build_model_delta_client_work`, i.e. exactly FedAvg's client work; per-step
clipping (FAT-Clipping-PI, Yang et al. 2022; C_loc of Pelikan et al. 2025) is not here but in
the client optimizer (`tff_clip.learning.optimizers.clipped_optimizer`), so it
composes with every client work, these included.

As in TFF, one "layer" is one leaf of the trainable weights (one Keras
variable), in `tf.nest.flatten` order, and the update a client reports is the
model delta `initial_weights - local_weights` (the sign TFF's server
optimizers expect: the server *subtracts* it).

References:
* Zhang et al. 2022: "Understanding Clipping for Federated Learning:
  Convergence and Client-Level Differential Privacy", ICML 2022.
* Yang, Qiu, Liu 2022: "Taming Fat-Tailed Noise in Federated Learning",
  NeurIPS 2022.
* Pelikan et al. 2025: "Enabling Differentially Private Federated
  Learning for Speech Recognition", NeurIPS 2025.
* Cheng et al. 2022: "Differentially Private Federated Learning with
  Local Regularization and Sparsification", CVPR 2022.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.aggregation import bounding
from tff_clip.aggregation import spec
from tff_clip.learning.sparsification import (
    lus_keep_counts, lus_mask, lus_scores, lus_sparsify)

__all__ = [
    'blur_penalty',
    'build_client_work',
    'check_client_work_args',
    'clipped_model_update',
    'lus_keep_counts',
    'lus_mask',
    'lus_scores',
    'lus_sparsify',
]

Sparsity = spec.Sparsity

_ClientWeighting = tff.learning.ClientWeighting
_Loop = tff.learning.LoopImplementation
# The training loop of every client work built here. TFF defaults to
# DATASET_REDUCE (the `ReduceDataset` op, which XLA can compile for TPUs);
# DATASET_ITERATOR (`for batch in iter(data)`) costs about half as much per
# client on CPU (the reduce op instantiates its function on every run) and
# keeps the loop's ops on the device `tf.device` places them on (TFF's note on
# multi-GPU hosts), so it is the default here.
DEFAULT_LOOP = _Loop.DATASET_ITERATOR
_LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY


# ----------------------------------------------------------------------------
# Argument checks, at build time: long before any tracing.


def _learning_rate(optimizer: tff.learning.optimizers.Optimizer,
                   label: str) -> float:
  """The learning rate in `optimizer`'s initial hyperparameters."""
  # TFF reads hparams the same way (`build_model_delta_client_work`): the
  # hyperparameters do not depend on the weights' specs.
  hparams = optimizer.get_hparams(
      optimizer.initialize(tf.TensorSpec([], tf.float32)))
  if _LEARNING_RATE_KEY not in hparams:
    raise ValueError(
        f'`{label}` has no `{_LEARNING_RATE_KEY}` hyperparameter, so the BLUR '
        'condition blur_strength < 1 / client_learning_rate cannot be checked;'
        f' its hyperparameters are {list(hparams)}.')
  return float(np.asarray(hparams[_LEARNING_RATE_KEY]))


def check_client_work_args(client_optimizer=None,
                           *,
                           blur_strength=None,
                           blur_clip_norm=None,
                           lus_sparsity=None,
                           model_clip_norm=None) -> None:
  """Raises for bad client-algorithm arguments; see `build_client_work`.

  Run at build time, before any model is constructed, so a bad argument is
  reported by name before any tracing.
  """
  if client_optimizer is not None and not isinstance(
      client_optimizer, tff.learning.optimizers.Optimizer):
    raise TypeError(
        '`client_optimizer` must be a `tff.learning.optimizers.Optimizer` '
        '(e.g. `tff.learning.optimizers.build_sgdm(0.1)`); got '
        f'{type(client_optimizer).__name__}: {client_optimizer!r}.')
  learning_rate = None
  if client_optimizer is not None and blur_strength is not None:
    learning_rate = _learning_rate(client_optimizer, 'client_optimizer')
  spec.check_client_arguments(
      blur_strength=blur_strength, blur_clip_norm=blur_clip_norm,
      lus_sparsity=lus_sparsity, model_clip_norm=model_clip_norm,
      client_learning_rate=learning_rate)


# ----------------------------------------------------------------------------
# BLUR (Cheng et al. 2022, Section 4.1).


def blur_penalty(weights, reference, clip_norm, strength) -> tf.Tensor:
  """The BLUR regulariser (strength/2) * max(0, ||w - w_t||^2 - S^2).

  Cheng et al., CVPR 2022, Eq. (5): the client minimises
  h_i(w) = f_i(w) + (lambda/2) R_t(w), R_t(w) = max(0, ||w - w_t||^2 - S^2),
  with w_t the model received this round and S the clip norm of the DP bound.
  Inside the ball ||w - w_t|| <= S the penalty and its gradient are zero (the
  objective is the plain loss, the boundary included); outside, its gradient
  is lambda (w - w_t), which pulls w back towards w_t: a gradient step of
  size eta scales w - w_t by (1 - lambda eta) (Eq. (7), Lemma 2), hence
  lambda < 1/eta.

  Args:
    weights: a structure of float tensors (or variables), w.
    reference: the same structure (flattened, the same leaves in order), w_t.
    clip_norm: S, a float or scalar tensor.
    strength: lambda, a float or scalar tensor.

  Returns:
    A scalar, float32 (float64 if any leaf is float64), differentiable in
    `weights`.

  Raises:
    ValueError: if the structures have different numbers of leaves.
  """
  flat_weights, flat_reference = bounding.flatten_alike(
      weights, reference, 'weights', 'reference')
  dtype = tf.float64 if any(
      tf.as_dtype(x.dtype) == tf.float64 for x in flat_weights) else tf.float32
  squared_distance = tf.constant(0, dtype)
  for w, r in zip(flat_weights, flat_reference):
    squared_distance += tf.reduce_sum(
        tf.square(tf.cast(w, dtype) - tf.cast(r, dtype)))
  excess = squared_distance - tf.square(tf.cast(clip_norm, dtype))
  # tf.where, not tf.maximum: on the sphere (excess == 0) the gradient must be
  # the plain loss's, zero from the penalty.
  hinge = tf.where(excess > 0, excess, tf.zeros_like(excess))
  return 0.5 * tf.cast(strength, dtype) * hinge


# ----------------------------------------------------------------------------
# Model clipping (Zhang et al. 2022, Section 2.1): a baseline, not a recommendation.


def clipped_model_update(initial_weights, local_weights, clip_norm):
  """w_t - clip(w_local, c): the update that makes the server average models.

  BASELINE ONLY: the "model clipping" of Zhang et al., ICML 2022 (Zhang et al. 2022,
  Section 2.1; Wei et al. 2020a), where clients clip the local model itself,
  not its difference from w_t, and the server averages the clipped models.
  Claim 2.1 (Appendix A.3.1, Eqs. (19)-(20)) shows it does not converge to the
  optimum: on f(x) = sum_i (x - b_i)^2 / 2 with b = (-c/2, -c/2, kc), k > 4,
  the fixed point is lambda c / (3 - 2 lambda) <= c, lambda = (1 - eta_l)^Q,
  while x* = (k - 1) c / 3 > c. Use difference clipping
  (`tff_clip.aggregation.aggregators.clip_factory`) instead.

  Reported as a model delta, so the TFF server needs nothing special: with
  weights p_i summing to 1 (the mean), server SGD at learning rate eta gives
    w_{t+1} = w_t - eta sum_i p_i (w_t - clip(w_i)) = (1 - eta) w_t
              + eta sum_i p_i clip(w_i),
  which is the mean of the clipped models exactly when eta = 1 (TFF's
  default server optimizer, `build_sgdm(1.0)`).

  Args:
    initial_weights: w_t, a structure of float tensors.
    local_weights: w_local, the same structure.
    clip_norm: c > 0, a float or scalar tensor (global L2 norm of the model).

  Returns:
    The structure of `initial_weights`.
  """
  clipped = bounding.clip(local_weights, clip_norm)
  return tf.nest.map_structure(
      tf.subtract, initial_weights,
      tf.nest.pack_sequence_as(initial_weights, tf.nest.flatten(clipped)))


# ----------------------------------------------------------------------------
# The client work process.


def _batch_size(output) -> tf.Tensor:
  if output.num_examples is None:
    predictions = tf.nest.flatten(output.predictions)[0]
    return tf.shape(predictions, out_type=tf.int64)[0]
  return tf.cast(output.num_examples, tf.int64)


def _client_weight(weighting, has_non_finite_delta, num_examples):
  # TFF's rule (`model_delta_client_work._choose_client_weight`): a client
  # whose local training diverged gets weight 0.
  if weighting == _ClientWeighting.NUM_EXAMPLES:
    weight = tf.cast(num_examples, tf.float32)
  else:
    weight = tf.constant(1.0, tf.float32)
  return tf.where(has_non_finite_delta > 0, tf.constant(0.0, tf.float32),
                  weight)


def _build_client_update(model_fn, optimizer, *, weighting, blur_strength,
                         blur_clip_norm, lus_sparsity, model_clip_norm,
                         loop_implementation):
  """The client's `tf.function`: local training, then the shaped update."""
  model = model_fn()

  def reduce_data(step, data, initial_state):
    """`step` folded over `data`'s batches, as `loop_implementation` says."""
    if loop_implementation == _Loop.DATASET_REDUCE:
      return data.reduce(initial_state(), step)
    state = initial_state()
    for batch in iter(data):
      state = step(state, batch)
    return state

  def mean_gradient(trainable, data):
    """grad f_i(w_local), averaged over the client's examples."""
    # training=False: the gradient of the trained model as it is (no dropout,
    # no batch-norm statistics updated by this extra pass).
    def accumulate(state, batch):
      gradient_sum, count = state
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=False)
      gradients = tape.gradient(output.loss, trainable)
      size = _batch_size(output)
      gradient_sum = tuple(
          s if g is None else s + tf.cast(size, s.dtype) * tf.cast(g, s.dtype)
          for s, g in zip(gradient_sum, gradients))
      return gradient_sum, count + size

    zeros = tuple(tf.zeros_like(v) for v in trainable)
    gradient_sum, count = reduce_data(
        accumulate, data, lambda: (zeros, tf.constant(0, tf.int64)))
    return tuple(
        tf.math.divide_no_nan(s, tf.cast(count, s.dtype)) for s in gradient_sum)

  @tf.function
  def client_update(initial_weights, data, optimizer_hparams):
    model_weights = tff.learning.models.ModelWeights.from_model(model)
    tf.nest.map_structure(lambda v, t: v.assign(t), model_weights,
                          initial_weights)
    trainable = tuple(tf.nest.flatten(model_weights.trainable))
    reference = tuple(tf.nest.flatten(initial_weights.trainable))

    def train_step(state, batch):
      num_examples, optimizer_state = state
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
        loss = output.loss
        if blur_strength is not None:
          # h_i(w) = f_i(w) + (lambda/2) R_t(w): Cheng et al. 2022, Eq. (5) / (7).
          loss += tf.cast(
              blur_penalty(trainable, reference, blur_clip_norm,
                           blur_strength), loss.dtype)
      gradients = tape.gradient(loss, trainable)
      optimizer_state, updated = optimizer.next(optimizer_state, trainable,
                                                tuple(gradients))
      for variable, value in zip(trainable, updated):
        variable.assign(value)
      return num_examples + _batch_size(output), optimizer_state

    def initial_state():
      specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
      optimizer_state = optimizer.set_hparams(
          optimizer.initialize(specs), optimizer_hparams)
      return tf.constant(0, tf.int64), optimizer_state

    num_examples, _ = reduce_data(train_step, data, initial_state)

    local = tuple(tf.identity(v) for v in trainable)
    delta, has_non_finite_delta = (
        tff.learning.tensor_utils.zero_all_if_any_non_finite(
            tuple(tf.subtract(r, w) for r, w in zip(reference, local))))
    if has_non_finite_delta > 0:
      model.reset_metrics()
    # Read before the LUS pass, whose forward passes would count the data a
    # second time in the training metrics.
    metrics = tf.nest.map_structure(tf.identity,
                                    model.report_local_unfinalized_metrics())

    if lus_sparsity is not None:
      with tf.control_dependencies(tf.nest.flatten(metrics)):
        gradient = mean_gradient(trainable, data)
      delta = lus_sparsify(delta, gradient, lus_sparsity)
    if model_clip_norm is not None:
      clipped = clipped_model_update(reference, local, model_clip_norm)
      delta = tuple(
          tf.where(has_non_finite_delta > 0, tf.zeros_like(c), c)
          for c in clipped)

    update = tf.nest.pack_sequence_as(initial_weights.trainable,
                                      list(delta))
    weight = _client_weight(weighting, has_non_finite_delta, num_examples)
    return tff.learning.templates.ClientResult(
        update=update, update_weight=weight), metrics

  return client_update


def build_client_work(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer: tff.learning.optimizers.Optimizer,
    *,
    client_weighting: _ClientWeighting = _ClientWeighting.NUM_EXAMPLES,
    blur_strength: Optional[float] = None,
    blur_clip_norm: Optional[float] = None,
    lus_sparsity: Optional[Sparsity] = None,
    model_clip_norm: Optional[float] = None,
    metrics_aggregator: Optional[Any] = None,
    loop_implementation: _Loop = DEFAULT_LOOP,
) -> tff.learning.templates.ClientWorkProcess:
  """A `ClientWorkProcess`: local training with BLUR / LUS / model clipping.

  Each client starts from the broadcast model w_t, runs `client_optimizer`
  over its data (one step per batch, K = number of batches) and reports the
  model delta u = w_t - w_local with its weight:

    * plain (none of the options): TFF's
      `tff.learning.templates.build_model_delta_client_work`, unchanged, i.e.
      FedAvg's client work (Yang et al. 2022 Algorithm 1 with the server rate explicit;
      per-step clipping comes from the optimizer,
      `tff_clip.learning.optimizers.clipped_optimizer`).
    * `blur_strength` (lambda) and `blur_clip_norm` (S): each step minimises
      f_i(w) + (lambda/2) max(0, ||w - w_t||^2 - S^2) (Cheng et al. 2022, Eq. (5));
      lambda * client_learning_rate < 1 is required (Lemma 2).
    * `lus_sparsity` (c): after training, only the s_h entries of u with the
      largest |grad f_i(w_local) * u| are kept in every layer (Cheng et al. 2022, Eqs.
      (11)-(13)); the gradient is the mean over the client's examples of the
      model loss f_i (the BLUR penalty excluded, as in Eq. (11)), one extra
      pass over the data. BLUR and LUS combine (Cheng et al. 2022, Algorithm 2).
    * `model_clip_norm` (c): BASELINE ONLY (Zhang et al. 2022, Claim 2.1): reports
      u = w_t - clip(w_local, c), so that the server (SGD at rate 1) averages
      the clipped local models; see `clipped_model_update`.

  Bounding and noise are not done here: they are the aggregator's (in seed
  004's Algorithm 2 they follow the mask, on the full vector).
  A client whose delta has a NaN or an Inf reports zeros with weight 0 (TFF's
  rule) and its training metrics are reset.

  The state is the client optimizer's hyperparameters (as in TFF), so
  `get_hparams` / `set_hparams` work; the BLUR condition is checked on the
  learning rate at build time only.

  Args:
    model_fn: a no-arg callable returning a new
      `tff.learning.models.VariableModel` on each call.
    client_optimizer: a `tff.learning.optimizers.Optimizer`.
    client_weighting: `tff.learning.ClientWeighting.NUM_EXAMPLES` or
      `UNIFORM`.
    blur_strength: lambda > 0, or None (no BLUR).
    blur_clip_norm: S > 0, required with `blur_strength`: use the clip norm
      of the bound the update goes through.
    lus_sparsity: c in [0, 1) for every layer, or one per trainable layer, or
      None (no LUS); refused if it keeps every entry of every layer.
    model_clip_norm: c > 0 (model clipping, a baseline), or None.
    metrics_aggregator: as in TFF (default
      `tff.learning.metrics.sum_then_finalize`).
    loop_implementation: a `tff.learning.LoopImplementation`, the client's
      training loop over its batches (the same steps either way). Default
      DATASET_ITERATOR (`DEFAULT_LOOP`: faster on CPU, placed on GPUs); TFF's
      own default, DATASET_REDUCE, is the one XLA compiles for TPUs.

  Returns:
    A `tff.learning.templates.ClientWorkProcess`.

  Raises:
    TypeError: if `client_optimizer` is not a TFF optimizer, or a number is
      not a number.
    ValueError: if a norm or strength is not positive and finite,
      blur_strength >= 1/client_learning_rate, a sparsity is outside [0, 1),
      does not match the layers or keeps every entry, or model clipping is
      combined with BLUR or LUS.
  """
  if not callable(model_fn):
    raise TypeError(
        '`model_fn` must be a no-arg callable returning a '
        f'`tff.learning.models.VariableModel`; got {model_fn!r}.')
  check_client_work_args(
      client_optimizer,
      blur_strength=blur_strength,
      blur_clip_norm=blur_clip_norm,
      lus_sparsity=lus_sparsity,
      model_clip_norm=model_clip_norm)
  if not isinstance(client_weighting, _ClientWeighting):
    raise TypeError(
        '`client_weighting` must be a `tff.learning.ClientWeighting`; got '
        f'{client_weighting!r}.')
  if not isinstance(loop_implementation, _Loop):
    raise TypeError(
        '`loop_implementation` must be a `tff.learning.LoopImplementation`; '
        f'got {loop_implementation!r}.')
  if metrics_aggregator is None:
    metrics_aggregator = tff.learning.metrics.sum_then_finalize
  if (blur_strength is None and lus_sparsity is None and
      model_clip_norm is None):
    return tff.learning.templates.build_model_delta_client_work(
        model_fn, client_optimizer, client_weighting, metrics_aggregator,
        loop_implementation=loop_implementation)

  with tf.Graph().as_default():
    # As TFF does: build the model in a throwaway graph, for its types only.
    model = model_fn()
    if not isinstance(model, tff.learning.models.VariableModel):
      raise TypeError(
          '`model_fn` must return a `tff.learning.models.VariableModel`; got '
          f'{type(model).__name__}.')
    metrics_aggregation_fn = metrics_aggregator(model.metric_finalizers())
    trainable_specs = [
        tf.TensorSpec(v.shape, v.dtype) for v in model.trainable_variables
    ]
  if lus_sparsity is not None:
    keep = lus_keep_counts(trainable_specs, lus_sparsity)  # Layer count too.
    if keep == [int(d) for d in bounding.leaf_sizes(trainable_specs)]:
      raise ValueError(
          f'`lus_sparsity` = {lus_sparsity!r} keeps every entry of every '
          'trainable layer (s_h = d_h - floor(c_h d_h) = d_h), so LUS would '
          'change nothing but cost a pass over the data; pass None.')
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))
  weights_type = tff.learning.models.weights_type_from_model(model)

  initial_hparams = client_optimizer.get_hparams(
      client_optimizer.initialize(tf.TensorSpec([], tf.float32)))

  @tff.federated_computation
  def init_fn():
    return tff.federated_value(initial_hparams, tff.SERVER)

  state_type = init_fn.type_signature.result.member

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    return state

  @tff.tensorflow.computation(state_type, state_type)
  def set_hparams_fn(state, hparams):
    del state
    return hparams

  @tff.tensorflow.computation(state_type, weights_type, data_type)
  def client_update_computation(hparams, initial_weights, data):
    client_update = _build_client_update(
        model_fn,
        client_optimizer,
        weighting=client_weighting,
        blur_strength=blur_strength,
        blur_clip_norm=blur_clip_norm,
        lus_sparsity=lus_sparsity,
        model_clip_norm=model_clip_norm,
        loop_implementation=loop_implementation)
    return client_update(initial_weights, data, hparams)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, weights, client_data):
    client_result, model_outputs = tff.federated_map(
        client_update_computation,
        (tff.federated_broadcast(state), weights, client_data))
    measurements = tff.federated_zip(
        collections.OrderedDict(train=metrics_aggregation_fn(model_outputs)))
    return tff.templates.MeasuredProcessOutput(state, client_result,
                                               measurements)

  return tff.learning.templates.ClientWorkProcess(
      init_fn, next_fn, get_hparams_fn=get_hparams_fn,
      set_hparams_fn=set_hparams_fn)
