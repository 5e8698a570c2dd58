"""Keras models of the tasks: TFF's where TFF has them, the rest written here.

Reused from `tff.simulation.baselines` / `tff.simulation.models`:
  * EMNIST CNN with dropout (Reddi et al. 2021, "Adaptive Federated
    Optimization", App. C; TFF's `emnist_models.create_conv_dropout_model`).
  * ResNet-18 with GroupNorm instead of BatchNorm (Reddi et al. 2021 for
    CIFAR-100; Hsieh et al. 2020 show BatchNorm fails under non-IID FedAvg;
    TFF's `resnet_models.create_resnet18`).
  * Shakespeare char-LSTM: embedding 8, 2 x LSTM 256 (McMahan et al. 2017,
    Reddi et al. 2021; TFF's `char_prediction_models.create_recurrent_model`).
  * Stack Overflow next-word LSTM and tag logistic regression (TFF's).

Written here (TFF has no equivalent):
  * `create_mlp`: one hidden layer, 784-200-10 = 159,010 parameters, the
    "2-layer MLP with one hidden layer", 159K parameters, of Zhang et al. 2022
    (Table 3). TFF's `2nn` has two hidden layers (199,210).
  * `create_logistic_regression`: multinomial logistic regression.
  * `create_cifar_cnn`: the CIFAR "CNN-2-Layers" of Yang et al. 2022 and Cheng et al. 2022 -- the
    McMahan et al. (2017) CIFAR model, "two convolutional layers followed by
    two fully connected layers and then a linear transformation layer ...
    about 10^6 parameters" (the TensorFlow CIFAR-10 tutorial model, without
    its parameter-free local response normalization): 1,068,298 parameters on
    24x24 crops.
  * The one-weight-vector models of the papers' synthetic problems
    (`create_linear_model`, `create_noisy_quadratic_model`).

References:
* Zhang et al. 2022: "Understanding Clipping for Federated Learning:
  Convergence and Client-Level Differential Privacy", ICML 2022.
* Yang, Qiu, Liu 2022: "Taming Fat-Tailed Noise in Federated Learning",
  NeurIPS 2022.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.emnist import emnist_models
from tensorflow_federated.python.simulation.baselines.shakespeare import char_prediction_models
from tensorflow_federated.python.simulation.baselines.stackoverflow import tag_prediction_tasks
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_models
from tensorflow_federated.python.simulation.models import resnet_models

__all__ = [
    'HalfSquaredErrorSum',
    'MeanOfOutputs',
    'NoisyQuadraticLayer',
    'create_cifar_cnn',
    'create_emnist_cnn',
    'create_linear_model',
    'create_logistic_regression',
    'create_mlp',
    'create_noisy_quadratic_model',
    'create_resnet18',
    'create_shakespeare_lstm',
    'create_stackoverflow_lstm',
    'create_stackoverflow_tag_model',
]


def _check_positive(value: int, name: str):
  if value < 1:
    raise ValueError(f'`{name}` must be a positive integer; got {value}.')


def create_emnist_cnn(only_digits: bool = False,
                      seed: Optional[int] = None) -> tf.keras.Model:
  """Reddi et al.'s EMNIST CNN (2 conv, max-pool, dropout): 1,206,590 params.

  That count is for 62 classes (`only_digits=False`); 10 classes: 1,199,882.
  """
  return emnist_models.create_conv_dropout_model(only_digits=only_digits,
                                                 debug_seed=seed)


def create_mlp(input_shape=(28, 28, 1),
               hidden_units: int = 200,
               num_classes: int = 10) -> tf.keras.Model:
  """One-hidden-layer MLP (Zhang et al. 2022: 784-200-10, 159,010 parameters)."""
  _check_positive(hidden_units, 'hidden_units')
  _check_positive(num_classes, 'num_classes')
  return tf.keras.Sequential([
      tf.keras.layers.Flatten(input_shape=tuple(input_shape)),
      tf.keras.layers.Dense(hidden_units, activation='relu'),
      tf.keras.layers.Dense(num_classes, activation='softmax'),
  ])


def create_logistic_regression(input_shape=(28, 28, 1),
                               num_classes: int = 10) -> tf.keras.Model:
  """Multinomial logistic regression: softmax(W x + b)."""
  _check_positive(num_classes, 'num_classes')
  return tf.keras.Sequential([
      tf.keras.layers.Flatten(input_shape=tuple(input_shape)),
      tf.keras.layers.Dense(num_classes, activation='softmax'),
  ])


def create_cifar_cnn(input_shape=(24, 24, 3),
                     num_classes: int = 10) -> tf.keras.Model:
  """The CIFAR CNN-2-Layers of McMahan et al. 2017 (Yang et al. 2022, Cheng et al. 2022)."""
  _check_positive(num_classes, 'num_classes')
  conv = lambda: tf.keras.layers.Conv2D(64, 5, padding='same',
                                        activation='relu')
  pool = lambda: tf.keras.layers.MaxPool2D(3, strides=2, padding='same')
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=tuple(input_shape)),
      conv(), pool(),
      conv(), pool(),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(384, activation='relu'),
      tf.keras.layers.Dense(192, activation='relu'),
      tf.keras.layers.Dense(num_classes, activation='softmax'),
  ])


def create_resnet18(input_shape=(24, 24, 3),
                    num_classes: int = 10) -> tf.keras.Model:
  """ResNet-18 with GroupNorm (no BatchNorm under federated averaging)."""
  return resnet_models.create_resnet18(
      input_shape=tuple(input_shape), num_classes=num_classes,
      norm_layer=resnet_models.NormLayer.GROUP_NORM)


def create_shakespeare_lstm(vocab_size: int,
                            sequence_length: int) -> tf.keras.Model:
  """Char-LSTM: embedding 8, 2 x LSTM 256, dense logits (TFF's baseline)."""
  return char_prediction_models.create_recurrent_model(
      vocab_size=vocab_size, sequence_length=sequence_length)


def create_stackoverflow_lstm(extended_vocab_size: int) -> tf.keras.Model:
  """Next-word LSTM: embedding 96, LSTM 670, dense 96, logits (TFF's)."""
  return word_prediction_models.create_recurrent_model(
      vocab_size=extended_vocab_size)


def create_stackoverflow_tag_model(word_vocab_size: int,
                                   tag_vocab_size: int) -> tf.keras.Model:
  """Bag-of-words -> sigmoid tags logistic regression (TFF's)."""
  # pylint: disable-next=protected-access
  return tag_prediction_tasks._build_logistic_regression_model(
      input_size=word_vocab_size, output_size=tag_vocab_size)


def _constant_initializer(value: np.ndarray):
  value = np.asarray(value, dtype=np.float32)

  def initializer(shape, dtype=None):
    del dtype
    return tf.constant(value.reshape(shape), dtype=tf.float32)

  return initializer


def create_linear_model(initial_weights) -> tf.keras.Model:
  """y = <a, w>: the weights ARE the optimization variable w of the problem.

  Used for least-squares problems f_i(w) = sum_j 1/2 (<a_ij, w> - b_ij)^2:
  each example is one (a_ij, b_ij) pair and `HalfSquaredErrorSum` is the loss.

  Args:
    initial_weights: the starting point w_0, shape [d].

  Returns:
    A Keras model with one [d, 1] kernel and no bias.
  """
  initial_weights = np.asarray(initial_weights, dtype=np.float32).reshape(-1)
  return tf.keras.Sequential([
      tf.keras.layers.Dense(
          1, use_bias=False, input_shape=(initial_weights.size,),
          kernel_initializer=_constant_initializer(initial_weights)),
  ])


class HalfSquaredErrorSum(tf.keras.losses.Loss):
  """sum over the batch of 1/2 (y - y_hat)^2: a full client batch gives f_i."""

  def __init__(self, name='half_squared_error_sum'):
    super().__init__(reduction=tf.keras.losses.Reduction.SUM, name=name)

  def call(self, y_true, y_pred):
    y_true = tf.cast(y_true, y_pred.dtype)
    return 0.5 * tf.reduce_sum(tf.square(y_pred - y_true), axis=-1)


class NoisyQuadraticLayer(tf.keras.layers.Layer):
  """x -> f(x, xi) = 1/2 ||x||^2 + <xi, x> for each input row xi.

  Yang et al., "Taming Fat-Tailed Noise in Federated Learning", Sec. 5.1: the
  layer's only weight is the optimization variable x.
  """

  def __init__(self, initial_weights, **kwargs):
    super().__init__(**kwargs)
    self._start = np.asarray(initial_weights,
                                       dtype=np.float32).reshape(-1)

  def build(self, input_shape):
    self.x = self.add_weight(
        name='x', shape=(self._start.size,),
        initializer=_constant_initializer(self._start),
        trainable=True)
    super().build(input_shape)

  def call(self, noise):
    value = (0.5 * tf.reduce_sum(tf.square(self.x)) +
             tf.linalg.matvec(noise, self.x))
    return value[:, tf.newaxis]


def create_noisy_quadratic_model(initial_weights) -> tf.keras.Model:
  """Outputs f(x, xi) per example; train it with the `MeanOfOutputs` loss."""
  dimension = np.asarray(initial_weights).size
  inputs = tf.keras.Input(shape=(dimension,))
  return tf.keras.Model(inputs, NoisyQuadraticLayer(initial_weights)(inputs))


class MeanOfOutputs(tf.keras.losses.Loss):
  """The model's output is the loss: mean over the batch, labels ignored."""

  def __init__(self, name='mean_of_outputs'):
    super().__init__(reduction=tf.keras.losses.Reduction.SUM_OVER_BATCH_SIZE,
                     name=name)

  def call(self, y_true, y_pred):
    del y_true
    return tf.reduce_sum(y_pred, axis=-1)
