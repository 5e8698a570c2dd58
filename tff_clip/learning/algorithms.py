"""One builder: task x client algorithm x bounding/DP x server optimizer.

`build_fedavg` composes a `tff.learning.templates.LearningProcess` from TFF's
own pieces, one per arrow of the data flow:

  model_fn (task)
    -> client work: `tff_clip.learning.client.build_client_work` -- local training with
       `client_optimizer` (wrapped in `tff_clip.learning.optimizers.clipped_optimizer`
       for per-step clipping), optionally BLUR, LUS or model clipping
    -> `model_aggregator`: bounding (`tff_clip.aggregation.aggregators`), noise, mean
    -> server optimizer: TFF's `build_apply_optimizer_finalizer`

with TFF's broadcast distributor, through
`tff.learning.templates.compose_learning_process`. Without client options
and with the default aggregator it is `tff.learning.algorithms.
build_weighted_fed_avg`, the same computation.

The client algorithms and where they come from (see `build_fedavg`):

  * FAT-Clipping-PR (Yang, Qiu, Liu, NeurIPS 2022, Algorithm 2,
    Eq. (2)): `model_aggregator=aggregators.clip_factory(C)`.
  * FAT-Clipping-PI (Yang et al. 2022, Algorithm 3, Eqs. (3)-(4)); local clipping
    C_loc (Pelikan et al., NeurIPS 2025, Algorithm 1 line 11):
    `local_clip_norm=lambda`.
  * BLUR and LUS (Cheng et al., CVPR 2022, Eq. (5), Eqs.
    (11)-(13), Algorithm 2): `blur_strength`, `blur_clip_norm`,
    `lus_sparsity`.
  * Model clipping (Zhang et al., ICML 2022, Section 2.1,
    Claim 2.1): `model_clip_norm`. A baseline that does not converge to the
    optimum, not a recommendation.

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

from collections.abc import Callable
from typing import Any, Optional, Union

import numpy as np
import tensorflow_federated as tff

from tff_clip.aggregation import spec
from tff_clip.learning import client
from tff_clip.learning import optimizers

__all__ = ['build_fedavg', 'server_aggregator', 'server_components',
           'server_finalizer']

_ClientWeighting = tff.learning.ClientWeighting
ModelAggregator = Union[tff.aggregators.WeightedAggregationFactory,
                        tff.aggregators.UnweightedAggregationFactory]


def _check_optimizer(optimizer, label: str) -> None:
  if not isinstance(optimizer, tff.learning.optimizers.Optimizer):
    raise TypeError(
        f'`{label}` must be a `tff.learning.optimizers.Optimizer` (e.g. '
        '`tff.learning.optimizers.build_sgdm(0.1)`); got '
        f'{type(optimizer).__name__}: {optimizer!r}.')


def _weighted_aggregator(model_aggregator, client_weighting):
  """Returns (a weighted factory, the client weighting to use)."""
  if model_aggregator is None:
    model_aggregator = tff.aggregators.MeanFactory()
  if isinstance(model_aggregator, tff.aggregators.WeightedAggregationFactory):
    if client_weighting is None:
      client_weighting = _ClientWeighting.NUM_EXAMPLES
    return model_aggregator, client_weighting
  if isinstance(model_aggregator,
                tff.aggregators.UnweightedAggregationFactory):
    # As `tff.learning.algorithms.build_unweighted_fed_avg`: uniform client
    # weights, which the wrapped factory then ignores.
    if client_weighting not in (None, _ClientWeighting.UNIFORM):
      raise ValueError(
          f'`client_weighting` = {client_weighting} needs a weighted '
          '`model_aggregator`; this one is unweighted (e.g. a DP factory), '
          'so every client counts the same: leave `client_weighting` None or '
          'set it to UNIFORM.')
    return (tff.aggregators.as_weighted_aggregator(model_aggregator),
            _ClientWeighting.UNIFORM)
  raise TypeError(
      '`model_aggregator` must be a `tff.aggregators` factory (weighted or '
      'unweighted, e.g. `tff_clip.aggregation.aggregators.clip_factory(1.0)`); got '
      f'{type(model_aggregator).__name__}: {model_aggregator!r}.')


def server_components(model_weights_type, model_aggregator,
                      server_optimizer: tff.learning.optimizers.Optimizer,
                      client_weighting: Optional[_ClientWeighting] = None):
  """(aggregator, finalizer): `build_fedavg`'s server-side processes.

  What the process's state holds of `model_aggregator` and
  `server_optimizer` (their `initialize`) and all their graphs (their
  `next`); `model_weights_type` is the model's `ModelWeights` type.
  """
  return (server_aggregator(model_weights_type, model_aggregator,
                            client_weighting),
          server_finalizer(model_weights_type, server_optimizer))


def server_aggregator(model_weights_type, model_aggregator,
                      client_weighting: Optional[_ClientWeighting] = None):
  """The aggregation process of `server_components`."""
  aggregator_factory, _ = _weighted_aggregator(model_aggregator,
                                               client_weighting)
  aggregator = aggregator_factory.create(
      model_weights_type.trainable, tff.TensorType(np.float32))
  aggregate_type = aggregator.next.type_signature
  if aggregate_type.parameter[1].member != aggregate_type.result[1].member:
    raise TypeError(
        '`model_aggregator` must return values of the type it receives (the '
        f'trainable weights); got {aggregate_type.parameter[1].member} -> '
        f'{aggregate_type.result[1].member}.')
  return aggregator


def server_finalizer(model_weights_type,
                     server_optimizer: tff.learning.optimizers.Optimizer):
  """The finalizer process of `server_components`."""
  return tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, model_weights_type)


def build_fedavg(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    local_clip_norm: Optional[float] = None,
    blur_strength: Optional[float] = None,
    blur_clip_norm: Optional[float] = None,
    lus_sparsity: Optional[client.Sparsity] = None,
    model_clip_norm: Optional[float] = None,
    model_aggregator: Optional[ModelAggregator] = None,
    client_weighting: Optional[_ClientWeighting] = None,
    metrics_aggregator: Optional[Any] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        client.DEFAULT_LOOP),
) -> tff.learning.templates.LearningProcess:
  """FedAvg with two-sided learning rates and this library's client algorithms.

  Round t: broadcast w_t; every client trains from w_t with
  `client_optimizer` (one step per batch, K = its number of batches) and
  reports u_i = w_t - w_i (shaped by the client options below); the
  `model_aggregator` bounds, noises and averages the u_i; the server
  optimizer steps w_t with the aggregate as its gradient. With SGD at rates
  eta_L (client) and eta (server) that is Yang et al. 2022's generalised FedAvg
  (Algorithm 1): w_{t+1} = w_t - eta * eta_L * mean_i sum_k g_i^k.

  Which argument gives which algorithm:

  * FAT-Clipping-PR (Yang, Qiu, Liu, NeurIPS 2022, Algorithm 2,
    Eq. (2)): `model_aggregator=tff_clip.aggregation.aggregators.clip_factory(C)`. The
    client's message, the model delta, is clipped once per round. TFF's delta
    is eta_L times the paper's Delta = sum_k g^k (for SGD), so C = eta_L *
    lambda reproduces Algorithm 2 with the server rate explicit,
    w_{t+1} = w_t - eta * eta_L * mean_i min(1, lambda/||Delta_i||) Delta_i;
    eta = 1 gives the printed form (line 15).
  * FAT-Clipping-PI (Yang et al. 2022, Algorithm 3, Eqs. (3)-(4)): `local_clip_norm=
    lambda`. Every local gradient is clipped to lambda before its step
    (`tff_clip.learning.optimizers.clipped_optimizer` around `client_optimizer`, so it
    composes with SGDM, Adam, ...), each SGD step moves the model by at most
    eta_L * lambda, and the message is the sum of the K clipped steps, not
    clipped again unless `model_aggregator` bounds it too (DP). Pelikan et al. 2025's
    local clipping C_loc (Pelikan et al., NeurIPS 2025, Algorithm 1 line 11)
    is the same mechanism. With K = 1 and C = eta_L * lambda, PR == PI.
  * BLUR (Cheng et al., CVPR 2022, Eq. (5)): `blur_strength=
    lambda`, `blur_clip_norm=S` (the bound's clip norm); needs lambda <
    1 / client learning rate (Lemma 2).
  * LUS (Cheng et al. 2022, Eqs. (11)-(13)): `lus_sparsity=c`, c in [0, 1), one for
    every layer or one per trainable layer; the bound and the noise of
    `model_aggregator` then act on the sparse update (noise on the full
    vector). BLUR + LUS is Cheng et al. 2022's Algorithm 2.
  * Model clipping (Zhang et al., ICML 2022, Section 2.1):
    `model_clip_norm=c`. BASELINE ONLY, Claim 2.1: it does not converge to
    the optimum. Clients report w_t - clip(w_i, c), so the server averages
    the clipped models when `server_optimizer` is SGD at learning rate 1 (see
    `tff_clip.learning.client.clipped_model_update`).

  Per-step clipping composes with every other option; BLUR and LUS combine;
  model clipping combines with neither.

  Under DP only the model update goes through `model_aggregator`: the
  process's `client_work` metrics (the clients' summed training loss and
  example counts, TFF's usual output) are aggregated without noise and are
  not covered by epsilon; release them only as `scripts.train` does (it
  withholds them under DP, docs/privacy.md).

  Args:
    model_fn: a no-arg callable returning a new
      `tff.learning.models.VariableModel` (e.g. from
      `tff.learning.models.from_keras_model`) on each call.
    client_optimizer: a `tff.learning.optimizers.Optimizer`, eta_L.
    server_optimizer: a `tff.learning.optimizers.Optimizer`, eta (e.g.
      `build_sgdm(1.0)`, TFF's default, or `tff_clip.learning.optimizers.build_lamb`).
    local_clip_norm: lambda > 0 for per-step clipping (PI), or None.
    blur_strength: BLUR's lambda > 0, or None.
    blur_clip_norm: BLUR's S > 0, required with `blur_strength`.
    lus_sparsity: LUS's c in [0, 1) (or one per trainable layer), or None;
      refused if it keeps every entry of every layer (e.g. c = 0).
    model_clip_norm: model clipping's c > 0 (baseline), or None.
    model_aggregator: a `tff.aggregators` factory, weighted or unweighted
      (e.g. `tff_clip.aggregation.aggregators.clip_factory`, a DP factory). Default: the
      weighted mean, `tff.aggregators.MeanFactory()`. An unweighted factory
      gets uniform client weights, as in `build_unweighted_fed_avg`.
    client_weighting: a `tff.learning.ClientWeighting`. Default: NUM_EXAMPLES
      for a weighted aggregator, UNIFORM for an unweighted one (which accepts
      no other).
    metrics_aggregator: as in TFF (default
      `tff.learning.metrics.sum_then_finalize`).
    loop_implementation: the clients' training loop, a
      `tff.learning.LoopImplementation` (default DATASET_ITERATOR, see
      `tff_clip.learning.client.build_client_work`).

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    TypeError: if `model_fn` is not callable, an optimizer is not a TFF
      optimizer, `model_aggregator` is not a TFF factory, or a number is not
      a number.
    ValueError: if a clip norm or strength is not positive and finite,
      blur_strength >= 1 / client learning rate, a sparsity is outside
      [0, 1), model clipping is combined with BLUR or LUS, or an unweighted
      aggregator is asked to weight by examples.
  """
  if not callable(model_fn):
    raise TypeError(
        '`model_fn` must be a no-arg callable returning a '
        f'`tff.learning.models.VariableModel`; got {model_fn!r}.')
  _check_optimizer(client_optimizer, 'client_optimizer')
  _check_optimizer(server_optimizer, 'server_optimizer')
  spec.check_client_arguments(local_clip_norm=local_clip_norm)
  if client_weighting is not None and not isinstance(client_weighting,
                                                     _ClientWeighting):
    raise TypeError(
        '`client_weighting` must be a `tff.learning.ClientWeighting`; got '
        f'{client_weighting!r}.')
  client.check_client_work_args(
      client_optimizer,
      blur_strength=blur_strength,
      blur_clip_norm=blur_clip_norm,
      lus_sparsity=lus_sparsity,
      model_clip_norm=model_clip_norm)
  _, client_weighting = _weighted_aggregator(model_aggregator,
                                             client_weighting)

  if local_clip_norm is not None:
    client_optimizer = optimizers.clipped_optimizer(client_optimizer,
                                                    float(local_clip_norm))
  client_work = client.build_client_work(
      model_fn,
      client_optimizer,
      client_weighting=client_weighting,
      blur_strength=blur_strength,
      blur_clip_norm=blur_clip_norm,
      lus_sparsity=lus_sparsity,
      model_clip_norm=model_clip_norm,
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation)

  @tff.tensorflow.computation
  def initial_model_weights_fn():
    model = model_fn()
    if not isinstance(model, tff.learning.models.VariableModel):
      raise TypeError(
          '`model_fn` must return a `tff.learning.models.VariableModel`; got '
          f'{type(model).__name__}.')
    return tff.learning.models.ModelWeights.from_model(model)

  model_weights_type = initial_model_weights_fn.type_signature.result
  distributor = tff.learning.templates.build_broadcast_process(
      model_weights_type)
  aggregator, finalizer = server_components(
      model_weights_type, model_aggregator, server_optimizer,
      client_weighting)
  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn, distributor, client_work, aggregator,
      finalizer)
