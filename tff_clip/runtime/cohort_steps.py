"""A cohort's local SGD steps as tensor ops with a client axis.

`tff_clip.runtime.batched_clients.BatchedRunner`'s cohort call trains every
client of a round at once: the model as a function of stacked weights
([C, ...], one copy per client, `forward`) and `local_steps`, which takes
each client's batches in order, exactly as many as the client has.

Step 0 runs on every client (a client without a first batch has a zero
gradient: its weights stay as they are), all from the server's weights: a
model of dense and examplewise layers takes them unstacked, each dense
layer one product over all the clients' examples, and each client's
gradient comes from its own rows (its layer inputs and pre-activations'
gradients), with no copy of the weights per client. Clients differ in their number of
batches, and in a later step usually few have one (a cohort of small
clients of a few batches, `scripts.benchmark_settings.FRONTIER`: a tenth of
the clients take a second step): each later step gathers the clients that
have a batch in it, steps them alone and scatters their weights and sums
back, so a client without that batch is left exactly as it was, as TFF's
client, whose dataset simply ends, leaves it. A client's arithmetic is the
same ops on its own rows either way.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ['forward', 'local_steps']


def _per_client(weight, rank):
  """[C, n] weight reshaped to broadcast against [C, B, ..., n] (`rank`)."""
  return tf.reshape(weight, tf.concat(
      [tf.shape(weight)[:1], tf.ones([rank - 2], tf.int32),
       tf.shape(weight)[1:]], 0))


def forward(plan, weights, x):
  """Predictions [C, B, ...] of each client's model (weights [C, ...]).

  Dense and embedding layers are batched products and gathers over the
  client axis; a convolution is `vectorized_map`ped over the clients (each
  its own kernel); weightless examplewise layers (pooling, flattening,
  activations) run on the examples with the client and batch axes merged.
  """
  for kind, layer, ix in plan:
    if kind == 'examplewise':
      x = _examplewise(layer, x)
      continue
    if kind == 'embedding':
      x = tf.gather(weights[ix[0]], tf.cast(x, tf.int32), batch_dims=1)
      continue
    kernel = weights[ix[0]]
    if kind == 'dense':
      x = tf.einsum('cb...i,cio->cb...o', x, kernel)
    else:  # A convolution: client c's examples with client c's kernel.
      x = tf.vectorized_map(
          lambda args, layer=layer: tf.nn.convolution(
              args[0], args[1], strides=layer.strides,
              padding=layer.padding.upper(), dilations=layer.dilation_rate),
          (x, kernel))
    if len(ix) > 1:
      x = x + _per_client(weights[ix[1]], x.shape.rank)
    x = layer.activation(x)
  return x


def _examplewise(layer, x):
  """A weightless examplewise layer on [C, B, ...] (client and batch axes
  merged: the layer's computation itself, `call`, no Keras bookkeeping of a
  layer built in another graph)."""
  shape = tf.shape(x)
  merged = layer.call(tf.reshape(x, tf.concat([[-1], shape[2:]], 0)))
  return tf.reshape(merged, tf.concat([shape[:2], tf.shape(merged)[1:]], 0))


def _shared_forward(plan, weights, x, tape):
  """`forward` where every client has the same weights (unstacked: step 0
  of a model of dense and examplewise layers): each dense layer one product
  over all the clients' examples. Returns (predictions, [(weight indices,
  layer input, pre-activation)]), each pre-activation watched by `tape`."""
  layers = []
  for kind, layer, ix in plan:
    if kind == 'examplewise':
      x = _examplewise(layer, x)
      continue
    z = tf.einsum('cb...i,io->cb...o', x, weights[ix[0]])
    if len(ix) > 1:
      z = z + weights[ix[1]]
    tape.watch(z)
    layers.append((ix, x, z))
    x = layer.activation(z)
  return x, layers


def _shared_gradients(layers, dz, count):
  """Each client's gradients [C, ...] of `count` weights, from its layer
  inputs and pre-activations' gradients (`_shared_forward`): a client's
  loss depends on its own rows only."""
  gradients = [None] * count
  for (ix, x, _), d in zip(layers, dz):
    gradients[ix[0]] = tf.einsum('cb...i,cb...o->cio', x, d)
    if len(ix) > 1:
      gradients[ix[1]] = tf.reduce_sum(d, axis=tf.range(1, tf.rank(d) - 1))
  return gradients


def _own_examples(examples, rows):
  """[K, B, ...] rows of `examples`, zeros where a row is -1."""
  taken = tf.gather(examples, tf.maximum(rows, 0))
  keep = tf.reshape(rows >= 0, tf.concat(
      [tf.shape(rows), tf.ones([taken.shape.rank - 2], tf.int32)], 0))
  return tf.where(keep, taken, tf.zeros_like(taken))


def _masked(values, step_mask):
  """`values` [K, B] with padding slots 0 (selected, not multiplied: a
  slot's value may be inf, and inf * 0 is NaN)."""
  return tf.where(step_mask > 0, values, tf.zeros_like(values))


def local_steps(plan, loss, metrics, trainable, learning_rate, x_all, y_all,
                index):
  """Every client's local SGD steps on its batches.

  Args:
    plan: `batched_clients._layer_plan` of the model.
    loss: the model's Keras `LossFunctionWrapper`.
    metrics: {name: Keras `MeanMetricWrapper`}, in the sums' order.
    trainable: the server's trainable weights (every client starts there).
    learning_rate: the client learning rate (a scalar or [1] tensor).
    x_all, y_all: the examples the index points into.
    index: [C, S, B] int64 rows of `x_all`, -1 for padding.

  Returns:
    (local weights [C, ...], loss sums [C], loss weights [C] (the batch
    sizes' sums), [(metric sums [C], metric counts [C])], batch sizes [C, S]
    int64).
  """
  mask = index >= 0  # [C, S, B]
  # A padding slot holds the client's own first example of that batch
  # (-1, then zeros, where it has no such batch: step 0 of an empty
  # client), never another client's: a slot's contribution is masked out,
  # but 0 times a non-finite gradient is NaN, so an inf or NaN example of
  # any client of the population in the slot would have made this client's
  # update non-finite and zeroed it (its DP record a function of another
  # client's data).
  gather_index = tf.where(mask, index, index[:, :, :1])
  num_clients = tf.shape(index)[0]
  num_steps = tf.shape(index)[1]
  batch_sizes = tf.reduce_sum(tf.cast(mask, tf.int64), axis=2)  # [C, S]
  rate = tf.reshape(learning_rate, [])

  def step(weights, rows, step_mask, size, shared=False):
    """One step of some clients: weights [K, ...] (`shared`: unstacked, the
    same for all), rows and step_mask [K, B], size [K] -> (new weights [K,
    ...], loss sums, [(metric sums, counts)])."""
    x, y = _own_examples(x_all, rows), _own_examples(y_all, rows)
    with tf.GradientTape() as tape:
      if shared:
        predictions, layers = _shared_forward(plan, weights, x, tape)
      else:
        tape.watch(weights)
        predictions = forward(plan, weights, x)
      per_example = tf.cast(loss.call(y, predictions), tf.float32)
      # Keras's SUM_OVER_BATCH_SIZE over the client's real examples.
      client_loss = tf.math.divide_no_nan(
          tf.reduce_sum(_masked(per_example, step_mask), axis=1), size)
      total = tf.reduce_sum(client_loss)
    if shared:
      gradients = _shared_gradients(
          layers, tape.gradient(total, [z for _, _, z in layers]),
          len(weights))
      weights = [w[tf.newaxis] - rate * g for w, g in zip(weights, gradients)]
    else:
      gradients = [tf.convert_to_tensor(g)  # An embedding's: sparse.
                   for g in tape.gradient(total, weights)]
      weights = [w - rate * g for w, g in zip(weights, gradients)]
    sums = []
    for metric in metrics.values():
      values = tf.cast(metric._fn(  # pylint: disable=protected-access
          y, predictions, **metric._fn_kwargs), tf.float32)  # pylint: disable=protected-access
      sums.append((tf.reduce_sum(_masked(values, step_mask), axis=1),
                   tf.reduce_sum(step_mask, axis=1)))
    # TFF's loss metric: Mean(batch loss, sample_weight=batch size).
    return weights, client_loss * size, sums

  def first(weights, loss_total, loss_count, metric_sums):
    """Step 0 on every client (from the same weights: a model of dense and
    examplewise layers takes them unstacked, `_shared_forward`)."""
    size = tf.cast(batch_sizes[:, 0], tf.float32)
    rows, step_mask = gather_index[:, 0], tf.cast(mask[:, 0], tf.float32)
    if shared:
      weights, losses, sums = step(trainable, rows, step_mask, size, True)
    else:
      weights, losses, sums = step(weights(), rows, step_mask, size)
    return (weights, loss_total + losses, loss_count + size,
            [(t + st, c + sc) for (t, c), (st, sc) in zip(metric_sums, sums)])

  def later(s, weights, loss_total, loss_count, metric_sums):
    """Step s on the clients that have a batch s, scattered back."""
    active = tf.where(batch_sizes[:, s] > 0)  # [K, 1]
    rows = tf.gather_nd(gather_index[:, s], active)
    size = tf.cast(tf.gather_nd(batch_sizes[:, s], active), tf.float32)
    new, losses, sums = step(
        [tf.gather_nd(w, active) for w in weights], rows,
        tf.cast(tf.gather_nd(mask[:, s], active), tf.float32), size)
    add = lambda total, part: tf.tensor_scatter_nd_add(total, active, part)
    return (s + 1,
            [tf.tensor_scatter_nd_update(w, active, n)
             for w, n in zip(weights, new)],
            add(loss_total, losses), add(loss_count, size),
            [(add(t, st), add(c, sc))
             for (t, c), (st, sc) in zip(metric_sums, sums)])

  shared = all(kind in ('dense', 'examplewise') for kind, _, _ in plan)
  tiled = lambda: [tf.tile(w[tf.newaxis], tf.concat(
      [[num_clients], tf.ones([w.shape.rank], tf.int32)], 0))
                   for w in trainable]  # Each client's copy.
  zero = tf.zeros([num_clients], tf.float32)
  sums = (zero, zero, [(zero, zero) for _ in metrics])
  start = tf.cond(num_steps > 0, lambda: first(tiled, *sums),
                  lambda: (tiled(), *sums))
  _, local, loss_total, loss_count, metric_sums = tf.while_loop(
      lambda s, *_: s < num_steps, later, (tf.constant(1), *start))
  return local, loss_total, loss_count, metric_sums, batch_sizes
