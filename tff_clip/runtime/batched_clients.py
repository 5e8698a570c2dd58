"""A round's client work as one TensorFlow call over the whole cohort.

`InProcessRunner.next` calls the `MapReduceForm`'s `work` once per client and
`accumulate` once per client: for a small model most of a round is Python's
overhead around those small calls (docs/benchmarks.md, "Where a frontier
training's time goes"). `BatchedRunner` computes what `work`, `accumulate` and
`report` compute together, the pre-noise aggregate of the round, in one
`tf.function` over the cohort's examples as padded tensors with a client
axis, and hands it to the form's own `update`, which adds the DP noise with
the secret key in the server state, moves the adaptive norms and takes the
server step exactly as on the per-client path:

  prepare(state)  -- the form's graph, unchanged (the client input)
  one call:  the clients' batches [C, S, B, ...] with masks;
             S local SGD steps on all C clients at once (explicit batched
             matrix products; a padded example contributes nothing, a
             client takes exactly as many steps as it has batches);
             the model deltas (zeroed when not finite, as TFF does), the
             training metrics' sums, then the aggregator's client half on
             every client (tff_clip's queries: tensor ops over the client
             axis, `dp_queries.summed_records`, each client bounded as
             alone with the exact norm guarantee; others: the query's own
             `preprocess_record`, client by client or all at once,
             `client_execution.VECTORIZED_RECORDS_FROM`) and their sums
  update(state, aggregate)  -- the form's graph, unchanged (noise, server)

What is supported (`check_supported` says why not, in one line):

* models from `tff.learning.models.from_keras_model` whose Keras model is a
  `Sequential` chain of `Dense` (on inputs of any rank), `Conv1D` and
  `Conv2D` (channels last, valid or same padding, any strides and
  dilations), `Embedding` (without `mask_zero`) layers with any Keras
  activation, and weightless examplewise layers (`Flatten`, `Reshape`,
  `Activation`, `ReLU`, `Softmax`, max, average and global pooling), whose
  predictions are one vector per example (not one per token), with
  no non-trainable weights (no batch normalization), no dropout and no
  regularization losses, one loss (a Keras `LossFunctionWrapper`, e.g.
  sparse categorical cross-entropy or mean squared error) and metrics that
  are `MeanMetricWrapper`s (e.g. `SparseCategoricalAccuracy`);
* plain SGD on the client (`tff.learning.optimizers.build_sgdm(lr)`), TFF's
  model-delta client work (no BLUR, LUS, model or local clipping);
* the aggregators `tff_clip.aggregation.dp.DPBoundingFactory` (the four
  boundings, fixed or adaptive norms, central noise, the default record
  sum), TFF's `DifferentiallyPrivateFactory` (its Gaussian and tree
  queries, the default record sum) and TFF's default `MeanFactory` (no
  bounding, no DP);
* the clients' data of `tff_clip.runtime.client_data.ClientDatasets` with
  an examplewise preprocessing (`cohort_batches`): the same batches, from the
  same `tf.data` shuffles and seeds, as the datasets the per-client path
  iterates.

Anything else runs on the per-client path (`--client_execution=auto`), or is
refused (`batched`). The aggregate equals the per-client path's to float
tolerance (the clients' sums are taken in another order):
`tests/test_batched_clients.py`.
"""

from __future__ import annotations

import atexit
import collections
import collections.abc
import functools
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.runtime import cohort_steps
from tff_clip.runtime import fused_rounds
from tff_clip.runtime import graph_cache
from tff_clip.runtime import runner_cache
from tff_clip.runtime import tf_graphs

__all__ = ['SMALL_MODEL', 'BatchedRunner', 'Unsupported', 'check_supported']


# The most trainable parameters of a model whose cohort `auto` batches: above
# it a copy of the model per client costs more than the batched calls save
# (docs/benchmarks.md, "The batched path by model size": 1.6x faster at
# 159,010 parameters, 0.72x at 1,663,370).
SMALL_MODEL = 2**18



class Unsupported(ValueError):
  """The batched path cannot reproduce this round exactly (why, in one line)."""


# ----------------------------------------------------------------------------
# The model as a function of stacked weights.

_PASSTHROUGH = ('InputLayer',)
# Layers without weights that act on each example alone: applied to the
# cohort's examples with the client and batch axes merged into one.
_EXAMPLEWISE = (
    'Flatten', 'Reshape', 'Activation', 'ReLU', 'Softmax', 'MaxPooling1D',
    'MaxPooling2D', 'AveragePooling1D', 'AveragePooling2D',
    'GlobalAveragePooling1D', 'GlobalAveragePooling2D', 'GlobalMaxPooling1D',
    'GlobalMaxPooling2D')
_CONVOLUTIONS = ('Conv1D', 'Conv2D')


def _keras_parts(model):
  """(keras model, loss object, metrics) of a `from_keras_model` model."""
  keras_model = getattr(model, '_keras_model', None)
  loss_fns = getattr(model, '_loss_fns', None)
  if keras_model is None or loss_fns is None:
    raise Unsupported('the model is not TFF\'s `from_keras_model`')
  if len(loss_fns) != 1:
    raise Unsupported('the model has more than one loss')
  loss = loss_fns[0]
  if not isinstance(loss, tf.keras.losses.Loss) or not hasattr(loss, 'fn'):
    raise Unsupported(f'the loss {loss!r} is not a Keras LossFunctionWrapper')
  if loss.reduction not in (tf.keras.losses.Reduction.AUTO,
                            tf.keras.losses.Reduction.SUM_OVER_BATCH_SIZE):
    raise Unsupported(f'the loss reduces by {loss.reduction!r}')
  if keras_model.losses:
    raise Unsupported('the Keras model has regularization losses')
  if keras_model.non_trainable_weights:
    raise Unsupported('the Keras model has non-trainable weights')
  return keras_model, loss, model.get_metrics()


def _check_convolution(layer, kind):
  if layer.data_format != 'channels_last':
    raise Unsupported(f'a {kind} layer is not channels_last')
  if getattr(layer, 'groups', 1) != 1:
    raise Unsupported(f'a {kind} layer has groups')
  if layer.padding not in ('valid', 'same'):
    raise Unsupported(f'a {kind} layer has {layer.padding} padding')


def _layer_plan(keras_model) -> list:
  """[(kind, layer, weight indices)] in the order the model applies them."""
  if not isinstance(keras_model, tf.keras.Sequential):
    raise Unsupported('the Keras model is not a Sequential chain')
  index = {id(v): i for i, v in enumerate(keras_model.trainable_weights)}
  plan = []
  for layer in keras_model.layers:
    kind = type(layer).__name__
    if kind in _PASSTHROUGH:
      continue
    if kind in ('Dense',) + _CONVOLUTIONS:
      if kind != 'Dense':
        _check_convolution(layer, kind)
      plan.append((kind.lower(), layer, [index[id(layer.kernel)]] +
                   ([index[id(layer.bias)]] if layer.use_bias else [])))
    elif kind == 'Embedding':
      if layer.mask_zero:
        raise Unsupported('an Embedding layer masks zeros')
      plan.append(('embedding', layer, [index[id(layer.embeddings)]]))
    elif kind in _EXAMPLEWISE:
      plan.append(('examplewise', layer, []))
    else:
      raise Unsupported(f'the model has a {kind} layer')
  # The cohort call masks and counts a loss or metric value per example
  # [C, B]; a model with more predictions per example (a token's, [B, T,
  # ...]) would mix its masks up with the client axis, or fail.
  if len(keras_model.output_shape) != 2:
    raise Unsupported(f'the model predicts a tensor of shape '
                      f'{keras_model.output_shape} per batch, not one vector '
                      'per example')
  return plan


# ----------------------------------------------------------------------------
# The client input and the aggregate, leaf by leaf.


def _names(struct_type):
  return [name for name, _ in tff.structure.to_elements(struct_type)]


def _leaves(type_spec) -> list:
  if isinstance(type_spec, tff.StructType):
    return [leaf for _, t in tff.structure.to_elements(type_spec)
            for leaf in _leaves(t)]
  return [type_spec]


def _dp_query(aggregator, value_type):
  """The DP query whose `preprocess_record` is each client's record and
  whose records TFF's `SumFactory` sums: of tff_clip's DP factory, of TFF's
  `DifferentiallyPrivateFactory`, or of a factory whose `create` is its
  `dp_factory(value_type)`'s (`tff_clip.program.tff_tree`)."""
  from tff_clip.aggregation import dp  # pylint: disable=g-import-not-at-top
  if isinstance(aggregator, dp.DPBoundingFactory):
    if aggregator.record_aggregation_factory is not None:
      raise Unsupported('the DP records are not summed by TFF\'s SumFactory')
    if aggregator.spec.noise_placement != 'central':
      raise Unsupported('the noise is placed on the clients')
    return aggregator.build_query(value_type)
  if hasattr(aggregator, 'dp_factory'):
    aggregator = aggregator.dp_factory(value_type)
  if not isinstance(aggregator, tff.aggregators.DifferentiallyPrivateFactory):
    raise Unsupported(
        f'the aggregator {type(aggregator).__name__} is not a DP factory '
        'of tff_clip\'s or TFF\'s, or TFF\'s mean')
  records = aggregator._record_aggregation_factory  # pylint: disable=protected-access
  if type(records) is not tff.aggregators.SumFactory:  # pylint: disable=unidiomatic-typecheck
    raise Unsupported('the DP records are not summed by TFF\'s SumFactory')
  return aggregator._query  # pylint: disable=protected-access


def check_supported(runner, model_fn, aggregator, client_optimizer: str,
                    client_options: bool = False) -> None:
  """Raises `Unsupported` (one line) unless `BatchedRunner` can run `runner`'s
  rounds exactly; see the module docstring."""
  _Plan(runner, model_fn, aggregator, client_optimizer, client_options)


# model_fn -> (model_fn, its parts): a session's model is its task's, and a
# sweep's sessions share a task (`_model_parts`).
_MODEL_PARTS_KEPT = 4
_model_parts_of = collections.OrderedDict()
atexit.register(_model_parts_of.clear)


def _model_parts(model_fn):
  """(loss, metrics, layer plan, weight specs) of `model_fn`'s model, built
  once per `model_fn` (a Keras model takes ~0.1 s to build, a tenth of a
  frontier session; its parts are stateless functions of the weights)."""
  found = _model_parts_of.pop(id(model_fn), None)
  if found is None or found[0] is not model_fn:
    with tf.Graph().as_default():
      keras_model, loss, metrics = _keras_parts(model_fn())
      found = (model_fn, (loss, metrics, _layer_plan(keras_model),
                          [tf.TensorSpec(v.shape, v.dtype)
                           for v in keras_model.trainable_weights]))
  _model_parts_of[id(model_fn)] = found
  while len(_model_parts_of) > _MODEL_PARTS_KEPT:
    _model_parts_of.popitem(last=False)
  return found[1]


class _Plan:
  """What the batched round needs of the process, checked."""

  def __init__(self, runner, model_fn, aggregator, client_optimizer,
               client_options):
    if client_optimizer != 'sgd':
      raise Unsupported(f'the client optimizer is {client_optimizer}, not sgd')
    if client_options:
      raise Unsupported('the client work has options (BLUR, LUS, local or '
                        'model clipping)')
    work_type = runner._work.type_signature  # pylint: disable=protected-access
    if any(_leaves(t) for t in runner._secure_types):  # pylint: disable=protected-access
      raise Unsupported('the aggregator uses secure sums')
    client_input_type = work_type.parameter[1]
    if len(client_input_type) not in (2, 3):
      raise Unsupported('the client input is not <weights, hparams, '
                        'aggregator>')
    weights_type, hparams_type = client_input_type[0], client_input_type[1]
    agg_params_type = (client_input_type[2] if len(client_input_type) == 3
                       else tff.StructType([]))
    if _leaves(weights_type[1]):
      raise Unsupported('the model has non-trainable weights')
    if _names(hparams_type) != ['learning_rate']:
      raise Unsupported('the client optimizer is not plain SGD')
    self.num_trainable = len(_leaves(weights_type[0]))
    self.num_agg_params = len(_leaves(agg_params_type))
    report_type = runner._report.type_signature.result  # pylint: disable=protected-access
    self.report_type = report_type
    metrics_type = report_type[0]
    self.metric_names = _names(metrics_type)
    self.metric_leaves = [len(_leaves(metrics_type[i]))
                          for i in range(len(metrics_type))]

    self.loss, metrics, self.plan, self.weight_specs = _model_parts(model_fn)
    with tf.Graph().as_default():
      self.metrics = {}
      for metric in metrics:
        name = metric.name
        if name in ('loss', 'num_examples', 'num_batches'):
          continue
        if not isinstance(metric, tf.keras.metrics.MeanMetricWrapper):
          raise Unsupported(f'the metric {name} is not a MeanMetricWrapper')
        self.metrics[name] = metric
      expected = set(self.metrics) | {'loss', 'num_examples', 'num_batches'}
      if set(self.metric_names) != expected:
        raise Unsupported(f'the metrics {self.metric_names} are not the '
                          f'model\'s {sorted(expected)}')
      # The type the process created its aggregator for.
      value_type = weights_type[0]
      if aggregator is None or isinstance(
          aggregator, tff.aggregators.MeanFactory):
        self.query = None
        if self.num_agg_params or len(report_type) != 3:
          raise Unsupported('the mean aggregator has another form')
      else:
        self.query = _dp_query(aggregator, value_type)
        self.params_structure = self.query.derive_sample_params(
            self.query.initial_global_state())
        if (len(tf.nest.flatten(self.params_structure)) !=
            self.num_agg_params or len(report_type) != 2):
          raise Unsupported('the DP aggregator has another form')
        template = tff.types.type_to_tf_tensor_specs(value_type)
        self.sample_specs = [
            tf.TensorSpec(t.shape, t.dtype) for t in tf.nest.flatten(
                self.query.initial_sample_state(template))]
        if [(s.dtype.as_numpy_dtype, tuple(s.shape))
            for s in self.sample_specs] != [
                (t.dtype.type, tuple(t.shape))
                for t in _leaves(report_type[1])]:
          raise Unsupported('the DP aggregator\'s sums have another form')
    self.weighted = self.query is None


# The cohort's traced call, kept for later sessions of the same process
# (a sweep's or a frontier worker's seeds): (trace key, client weighting,
# input specs) -> concrete function. The trace key is the run's exact
# graph-cache key (`tff_clip.program.process_cache.graph_cache_key` with
# `exact=True`): every field a graph is built from, the hyperparameters'
# values and the resolved noise multiplier among them, so an entry is only
# ever taken by a run whose aggregator and model would trace the very same
# graph. Runs without a key (a fixed noise seed, an audited run, the graph
# cache switched off) trace their own.
_TRACES_KEPT = 4
_traces = collections.OrderedDict()
# Freed before the interpreter tears its modules down (as `runner_cache`).
atexit.register(_traces.clear)


class BatchedRunner:
  """`runner` (an `InProcessRunner`) with each round's client work in one call.

  `next(state, cohort)` takes what `ClientDatasets.datasets` returns (a
  `client_data.CohortDatasets`); any other sequence of datasets runs on the
  wrapped runner's per-client path. Everything else is the wrapped
  runner's.

  Args:
    runner: a `tff_clip.runtime.simulation.InProcessRunner`.
    model_fn: the process's `model_fn`.
    aggregator: the process's model aggregator factory (None: TFF's mean).
    client_optimizer: the client optimizer's name ('sgd' is supported).
    client_weighting: `tff.learning.ClientWeighting` of a mean aggregator.
    client_options: whether the client work has BLUR, LUS, local or model
      clipping (not supported).
    trace_key: the key the cohort's traced call is kept under for later
      runs of this process (`_traces`; the training program's
      `process_cache.trace_key`); None traces one for this runner alone.
    batched_records: DP records as tensor ops over the client axis where
      the query allows (`dp_queries.summed_records`), else (or False) as
      `vectorized_records` says: at once (`tf.vectorized_map`) or client by
      client (`client_execution.VECTORIZED_RECORDS_FROM`).
    fuse: the rounds after the first as one call (`fused_rounds`); None:
      where the cohort call was traced earlier in this process (`_traces`).

  Raises:
    Unsupported: where the batched path cannot reproduce the round.
  """

  def __init__(self, runner, model_fn, aggregator=None,
               client_optimizer: str = 'sgd',
               client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
               client_options: bool = False,
               trace_key: Optional[str] = None,
               vectorized_records: bool = False,
               batched_records: bool = True,
               fuse: Optional[bool] = None):
    self._runner = runner
    self._p = _Plan(runner, model_fn, aggregator, client_optimizer,
                    client_options)
    self._uniform = client_weighting == tff.learning.ClientWeighting.UNIFORM
    self._vectorized = vectorized_records
    self._batched_records = batched_records
    self._round = None  # Traced on the first batched round.
    # The later rounds' one call (`fused_rounds`), made after the first
    # round (False: not made). Its trace and its first call's graph
    # optimization (0.3 s and more, measured) pay only over many rounds: by
    # default it is made where this process already traced the run's
    # cohort call (a sweep's or a frontier worker's later trainings, which
    # then share it).
    self._fuse = fuse
    self._fused = None
    self._warm = False  # Whether the cohort call was this process's.
    self._trace_key = trace_key
    # (the state `next` returned last, its leaves as the tensors they were
    # computed as): the next round takes them instead of converting the
    # state's arrays back (the same values).
    self._last_state = (None, None)

  def __getattr__(self, name):
    return getattr(self._runner, name)

  @property
  def parameters(self) -> int:
    """The model's trainable parameters."""
    return sum(s.shape.num_elements() for s in self._p.weight_specs)

  @property
  def runner(self):
    """The wrapped per-client runner."""
    return self._runner

  # --------------------------------------------------------------------------

  def _client_sums(self, vectorized, client_input, examples, index):
    """The report's leaves: metrics and the aggregator's client sums
    (`vectorized`: every client's record at once)."""
    p = self._p
    trainable = client_input[:p.num_trainable]
    learning_rate = client_input[p.num_trainable]
    agg_params = client_input[p.num_trainable + 1:]
    # As TFF's `forward_pass` reads a batch: x and y by key, or in order.
    if isinstance(examples, collections.abc.Mapping):
      x_all, y_all = examples['x'], examples['y']
    else:
      x_all, y_all = examples[0], examples[1]
    num_clients = tf.shape(index)[0]
    local, loss_total, loss_count, metric_sums, batch_sizes = (
        cohort_steps.local_steps(p.plan, p.loss, p.metrics, trainable,
                                 learning_rate, x_all, y_all, index))
    metric_names = list(p.metrics)
    deltas = [w[tf.newaxis] - l for w, l in zip(trainable, local)]
    # TFF's `zero_all_if_any_non_finite`, client by client (selected only in
    # a round that has a non-finite delta: the select of every value cost
    # 1.3 ms of the frontier's round).
    finite = tf.reduce_all(tf.stack([
        tf.reduce_all(tf.math.is_finite(tf.reshape(d, [num_clients, -1])),
                      axis=1) for d in deltas]), axis=0)  # [C]
    deltas = tf.cond(
        tf.reduce_all(finite), lambda: deltas,
        lambda: [tf.where(tf.reshape(finite, [-1] + [1] * (d.shape.rank - 1)),
                          d, tf.zeros_like(d)) for d in deltas])
    # A client whose update is not finite reports no training metrics: TFF's
    # client work resets them (`model.reset_metrics()`), as tff_clip's does.
    kept = lambda v: tf.where(finite, v, tf.zeros_like(v))
    num_examples = kept(tf.reduce_sum(batch_sizes, axis=1))  # [C] int64
    num_batches = kept(
        tf.reduce_sum(tf.cast(batch_sizes > 0, tf.int64), axis=1))
    loss_total, loss_count = kept(loss_total), kept(loss_count)
    metric_sums = [(kept(total), kept(count)) for total, count in metric_sums]

    metrics = collections.OrderedDict()
    for name in p.metric_names:
      if name == 'loss':
        metrics[name] = [tf.reduce_sum(loss_total), tf.reduce_sum(loss_count)]
      elif name == 'num_examples':
        metrics[name] = [tf.reduce_sum(num_examples)]
      elif name == 'num_batches':
        metrics[name] = [tf.reduce_sum(num_batches)]
      else:
        total_m, count_m = metric_sums[metric_names.index(name)]
        metrics[name] = [tf.reduce_sum(total_m), tf.reduce_sum(count_m)]
    out = [leaf for name in p.metric_names for leaf in metrics[name]]

    if p.query is None:  # TFF's weighted mean: sum(w u), sum(w).
      if self._uniform:
        weight = tf.ones([num_clients], tf.float32)
      else:
        weight = tf.cast(num_examples, tf.float32)
      weight = tf.where(finite, weight, tf.zeros_like(weight))
      out += [tf.reduce_sum(
          d * tf.reshape(weight, [-1] + [1] * (d.shape.rank - 1)), axis=0)
              for d in deltas]
      out.append(tf.reduce_sum(weight))
      return out
    params = tf.nest.pack_sequence_as(p.params_structure, list(agg_params))
    if self._batched_records:  # The cohort's records as tensor ops.
      from tff_clip.aggregation import dp_queries  # pylint: disable=g-import-not-at-top
      sums = dp_queries.summed_records(p.query, params, deltas)
      if sums is not None:
        return out + tf.nest.flatten(sums)
    if vectorized:  # Every client's record at once, then the sums.
      records = tf.vectorized_map(
          lambda client_deltas: tf.nest.flatten(
              p.query.preprocess_record(params, client_deltas)), deltas)
      return out + [tf.reduce_sum(r, axis=0) for r in records]

    # Client by client, in cohort order, as TFF's `accumulate` sums them.
    def record(c, sums):
      records = tf.nest.flatten(p.query.preprocess_record(
          params, [d[c] for d in deltas]))
      return c + 1, [s + r for s, r in zip(sums, records)]

    _, sums = tf.while_loop(
        lambda c, _: c < num_clients, record,
        (tf.constant(0), [tf.zeros(s.shape, s.dtype)
                          for s in p.sample_specs]))
    return out + sums

  def _trace(self, client_input, examples):
    """The cohort's traced call for inputs of these types."""
    specs = ([tf.TensorSpec.from_tensor(tf.convert_to_tensor(t))
              for t in client_input],
             tf.nest.map_structure(
                 lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype),
                 examples),
             tf.TensorSpec([None, None, None], tf.int64))
    key = stored = traced = None
    if self._trace_key is not None:
      key = (self._trace_key, self._uniform, self._vectorized,
             self._batched_records, repr(specs))
      traced = _traces.get(key)
      if traced is not None:
        _traces.move_to_end(key)
        self._warm = True
        return traced
      # A later process imports the graph instead of tracing it again.
      stored = graph_cache.entry_key(repr(('batched cohort', *key)))
      traced = runner_cache.traced_function(stored, tf.nest.flatten(specs))
    # Without autograph: the cohort call's control flow is explicit
    # (`tf.while_loop`, the queries' `tf.cond`s), and converting the
    # bounding's and the queries' Python source was most of the first
    # round's seconds (a tensor used as a Python bool would fail the trace
    # loudly, never run otherwise).
    if traced is None:
      traced = tf.function(
          functools.partial(self._client_sums, self._vectorized),
          autograph=False).get_concrete_function(*specs)
      runner_cache.store_traced(stored, traced)
    if key is not None:
      _traces[key] = traced
      while len(_traces) > _TRACES_KEPT:
        _traces.popitem(last=False)
    return traced

  def next(self, state, client_datasets):
    """One round: the process's `next(state, client_datasets)`."""
    batches = getattr(client_datasets, 'cohort_batches', None)
    if batches is None:
      return self._runner.next(state, client_datasets)
    runner = self._runner
    examples, index = batches()
    last, last_leaves = self._last_state
    if state is last:
      state_leaves = last_leaves
    else:  # As tensors once: `_prepare` and `_update` both take them.
      state_leaves = runner._prepare.tensors(  # pylint: disable=protected-access
          tf_graphs.flatten_value(state, runner._state_type, []))  # pylint: disable=protected-access
    if self._fused:
      result = self._fused(state_leaves, examples, index)
    else:
      # Prepare, the cohort call (traced in the first round) and update one
      # by one; the rounds after the first as one call where `fuse` says.
      client_input = list(runner._prepare(*state_leaves))  # pylint: disable=protected-access
      if self._round is None:
        self._round = self._trace(client_input, examples)
      report = fused_rounds.call_cohort(self._round, client_input, examples,
                                        index)
      result = runner._update(*state_leaves, *report)  # pylint: disable=protected-access
      if self._fused is None:
        fuse = self._warm if self._fuse is None else self._fuse
        self._fused = fuse and fused_rounds.fused_round(
            runner._prepare, self._round, runner._update,  # pylint: disable=protected-access
            runner._prepare._specs, examples)  # pylint: disable=protected-access
    output = tf_graphs.pack_value(runner._result_type, result)  # pylint: disable=protected-access
    # The result's first leaves are the new state's, in the state's order.
    self._last_state = (output.state, list(result[:len(state_leaves)]))
    return output
