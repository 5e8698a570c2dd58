"""A 3 -> 2 linear Keras model with fixed weights, shared by the client tests."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

INITIAL_KERNEL = np.array([[0.5, -0.2], [0.1, 0.3], [-0.4, 0.2]], np.float32)
INITIAL_BIAS = np.array([0.1, -0.1], np.float32)
INPUT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, 3], tf.float32),
    y=tf.TensorSpec([None, 2], tf.float32))


def model_fn():
  """Dense(2) on 3 features, mean squared error, deterministic weights."""
  keras_model = tf.keras.Sequential([
      tf.keras.layers.Dense(
          2, input_shape=(3,),
          kernel_initializer=tf.keras.initializers.Constant(INITIAL_KERNEL),
          bias_initializer=tf.keras.initializers.Constant(INITIAL_BIAS))
  ])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(),
      input_spec=INPUT_SPEC)


def client_datasets(round_num, sizes=(5, 3, 7)):
  """One round's client datasets (batches of 2) for the model above."""
  datasets = []
  for client, size in enumerate(sizes):
    rng = np.random.default_rng([round_num, client])
    x = rng.normal(size=[size, 3]).astype(np.float32)
    y = (x @ rng.normal(scale=2.0, size=[3, 2])).astype(np.float32)
    datasets.append(tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)).batch(2))
  return datasets


def two_rounds_process(state_value, state_type):
  """A process that is not one MapReduce round (no MapReduceForm)."""
  # Two client-to-server aggregations in sequence, the second depending on
  # the first's result: not one MapReduce round, so it cannot be split.
  @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER),
                             tff.FederatedType(np.float32, tff.CLIENTS))
  def two_rounds(state, data):
    first = tff.federated_sum(data)
    again = tff.federated_sum(tff.federated_map(
        tff.tensorflow.computation(lambda x, y: x * y),
        (data, tff.federated_broadcast(first))))
    return state, again

  return tff.templates.IterativeProcess(
      tff.federated_computation(
          lambda: tff.federated_value(state_value, tff.SERVER)), two_rounds)
