"""Specification of task data: real loaders run offline, caches, sources.

The online path is exercised without network: tiny SQLite files written with
`tff.simulation.datasets.save_to_sql_client_data` into a temporary cache
folder are read back by the same `tff.simulation.datasets.<name>.load_data`
that reads the real downloads; CIFAR-10 is prepared as a tiny
tensorflow-datasets folder and read by `tfds.load`.
"""

import collections
import importlib.resources
import json
import os
import sys
from unittest import mock
import urllib.error

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from tasks import emnist
from tasks import shakespeare
from tasks import sources
from tasks import task as task_lib


def _write_sql(path, clients_by_split):
  """`save_to_sql_client_data` of {split: {client_id: OrderedDict(arrays)}}."""
  datasets, splits = {}, {}
  for split, clients in clients_by_split.items():
    for client_id, arrays in clients.items():
      datasets[client_id] = arrays
      splits[client_id] = split
  tff.simulation.datasets.save_to_sql_client_data(
      list(datasets),
      lambda cid: tf.data.Dataset.from_tensor_slices(datasets[cid]),
      str(path), split_names_by_client_id=splits)


def _emnist_clients(prefix, sizes, offset):
  images, labels = sources.load_digits_arrays()
  pixels = emnist.digits_as_emnist(images[offset:offset + sum(sizes)])
  clients, start = {}, 0
  for k, size in enumerate(sizes):
    clients[f'{prefix}{k}'] = collections.OrderedDict(
        label=labels[offset + start:offset + start + size],
        pixels=pixels[start:start + size])
    start += size
  return clients


def _tiny_images(num, seed):
  rng = np.random.default_rng(seed)
  return collections.OrderedDict(
      coarse_label=rng.integers(0, 20, num).astype(np.int64),
      image=rng.integers(0, 256, (num, 32, 32, 3)).astype(np.uint8),
      label=rng.integers(0, 100, num).astype(np.int64))


@pytest.fixture(scope='module')
def tff_cache(tmp_path_factory):
  """A TFF cache folder holding tiny versions of the four SQLite files."""
  cache = tmp_path_factory.mktemp('tff_cache')
  _write_sql(cache / 'emnist_all.sqlite', {
      'digits_only_train': _emnist_clients('writer', [5, 4, 3], 0),
      'digits_only_test': _emnist_clients('reader', [2, 2], 100),
      'all_train': _emnist_clients('all-writer', [3, 3], 200),
      'all_test': _emnist_clients('all-reader', [2, 2], 300),
  })
  _write_sql(cache / 'cifar100.sqlite', {
      'train': {'0': _tiny_images(3, 0), '1': _tiny_images(2, 1)},
      'test': {'t0': _tiny_images(2, 2)},
  })
  snippets = lambda *s: collections.OrderedDict(snippets=np.array(s))
  _write_sql(cache / 'shakespeare.sqlite', {
      'train': {'ROMEO': snippets(b'But soft, what light', b'It is the east'),
                'JULIET': snippets(b'O Romeo, Romeo!')},
      'test': {'NURSE': snippets(b'Even or odd, of all days in the year')},
  })
  synthetic = tff.simulation.datasets.stackoverflow.get_synthetic()
  _write_sql(cache / 'stackoverflow.sqlite', {
      split: {
          f'{split}{cid}': collections.OrderedDict(
              (key, np.stack([e[key].numpy() for e in
                              synthetic.create_tf_dataset_for_client(cid)]))
              for key in synthetic.element_type_structure)
          for cid in synthetic.client_ids
      } for split in ('train', 'heldout', 'test')
  })
  counts = os.path.join(cache, 'datasets')
  os.makedirs(counts)
  words = tff.simulation.datasets.stackoverflow.get_synthetic_word_counts()
  with open(os.path.join(counts, 'stackoverflow.word_count'), 'w') as f:
    f.writelines(f'{w} {c}\n' for w, c in words.items())
  tags = tff.simulation.datasets.stackoverflow.get_synthetic_tag_counts()
  with open(os.path.join(counts, 'stackoverflow.tag_count'), 'w') as f:
    json.dump(dict(tags), f)
  return str(cache)


def _first_batch(task, client_index=0):
  client = task.datasets.train_data.client_ids[client_index]
  return next(iter(task.datasets.train_preprocess_fn(
      task.datasets.train_data.create_tf_dataset_for_client(client))))


def test_online_emnist_reads_the_cache_through_tffs_own_loader(tff_cache):
  real_loader = tff.simulation.datasets.emnist.load_data
  with mock.patch.object(tff.simulation.datasets.emnist, 'load_data',
                         wraps=real_loader) as loader:
    task = tasks.get_task('emnist_mlp', data_source='online',
                          cache_dir=tff_cache, download=False)
  loader.assert_called_once_with(cache_dir=tff_cache, only_digits=True)
  assert task.datasets.train_data.client_ids == ['writer0', 'writer1',
                                                 'writer2']


def test_online_sqlite_round_trips_the_written_examples(tff_cache):
  written = _emnist_clients('writer', [5, 4, 3], 0)['writer1']
  task = tasks.get_task('emnist_mlp', data_source='online',
                        cache_dir=tff_cache, download=False)
  read = list(task.datasets.train_data.create_tf_dataset_for_client(
      'writer1'))
  np.testing.assert_array_equal([e['label'] for e in read], written['label'])
  np.testing.assert_allclose([e['pixels'] for e in read], written['pixels'])


def test_online_emnist_batches_are_28x28_images_and_labels(tff_cache):
  task = tasks.get_task('emnist_cnn', data_source='online',
                        cache_dir=tff_cache, download=False,
                        train_batch_size=2)
  images, labels = _first_batch(task)
  assert images.shape == (2, 28, 28, 1) and labels.shape == (2,)
  assert sum(1 for _ in task.datasets.get_centralized_test_data().unbatch()
            ) == 4


def test_online_emnist_can_be_pooled_and_repartitioned(tff_cache):
  task = tasks.get_task('emnist_mlp', data_source='online',
                        cache_dir=tff_cache, download=False, partition='iid',
                        num_clients=4)
  sizes = [len(list(task.datasets.train_data.create_tf_dataset_for_client(c)))
           for c in task.datasets.train_data.client_ids]
  assert sorted(sizes) == [3, 3, 3, 3]  # The 12 written examples, re-split.


def test_online_emnist_repartitioned_under_one_seed_is_the_same_every_build(
    tff_cache):
  # The pooled writers' examples are split by index: pooled in a random
  # writer order, one seed gave other clients at each build (of 3 writers,
  # 6 orders: five equal builds by chance have odds 1 in 1,296).
  def clients():
    data = tasks.get_task('emnist_mlp', data_source='online',
                          cache_dir=tff_cache, download=False,
                          partition='iid', num_clients=4,
                          seed=3).datasets.train_data
    return [sorted(e['pixels'].numpy().tobytes() for e in
                   data.create_tf_dataset_for_client(c))
            for c in data.client_ids]
  first = clients()
  assert all(clients() == first for _ in range(4))


def test_online_natural_clients_subset_is_seeded(tff_cache):
  pick = lambda seed: tasks.get_task(
      'emnist_mlp', data_source='online', cache_dir=tff_cache,
      download=False, num_clients=2, seed=seed).datasets.train_data.client_ids
  assert len(pick(0)) == 2 and pick(0) == pick(0)


def test_online_cifar100_parses_images_and_labels_from_the_cache(tff_cache):
  # Through the loader only: the task around it (and its ResNet-18) is the
  # one the offline tests build.
  train, test = sources.load_tff_dataset('cifar100', tff_cache,
                                         download=False)
  written = _tiny_images(3, 0)
  read = list(train.create_tf_dataset_for_client('0'))
  assert train.client_ids == ['0', '1'] and test.client_ids == ['t0']
  np.testing.assert_array_equal([e['image'] for e in read], written['image'])
  np.testing.assert_array_equal([e['label'] for e in read], written['label'])


def test_online_shakespeare_clients_are_roles(tff_cache):
  task = tasks.get_task('shakespeare', data_source='online',
                        cache_dir=tff_cache, download=False,
                        sequence_length=5, train_batch_size=1)
  inputs, targets = _first_batch(task)
  assert task.datasets.train_data.client_ids == ['JULIET', 'ROMEO']
  assert inputs.shape == (1, 5) and targets.shape == (1, 5)


def test_online_stackoverflow_vocabulary_comes_from_the_cached_counts(
    tff_cache):
  task = tasks.get_task('stackoverflow_next_word', data_source='online',
                        cache_dir=tff_cache, download=False, vocab_size=10)
  inputs, targets = _first_batch(task)
  assert task.num_clients == 3
  assert inputs.shape[1] == targets.shape[1] == 20
  # 10 words + 1 out-of-vocabulary bucket + pad, begin, end of sentence.
  assert int(tf.reduce_max(inputs)) <= 10 + 4 - 1


def test_online_stackoverflow_tags_use_the_cached_tag_counts(tff_cache):
  task = tasks.get_task('stackoverflow_tag', data_source='online',
                        cache_dir=tff_cache, download=False,
                        word_vocab_size=7, tag_vocab_size=3)
  words, tags = _first_batch(task)
  assert words.shape[1] == 7 and tags.shape[1] == 3


@pytest.mark.parametrize('name,file_name', [
    ('emnist_cnn', 'emnist_all.sqlite'),
    ('cifar100_resnet18', 'cifar100.sqlite'),
    ('shakespeare', 'shakespeare.sqlite'),
    ('stackoverflow_tag', 'stackoverflow.sqlite'),
])
def test_missing_cache_without_download_names_the_cache_path(
    tmp_path, name, file_name):
  with pytest.raises(tasks.DataNotAvailableError) as error:
    tasks.get_task(name, data_source='online', cache_dir=str(tmp_path),
                   download=False)
  message = str(error.value)
  assert str(tmp_path / file_name) in message
  assert 'download=True' in message and f'{file_name}.lzma' in message


def test_failed_download_is_one_clear_error_and_leaves_no_partial_file(
    tmp_path):
  download = tff.simulation.datasets.download

  def fetch_half_then_fail(origin, filename):
    del origin
    with open(filename, 'wb') as f:
      f.write(b'SQLite format 3\x00 truncated')
    raise urllib.error.URLError('no network')

  with mock.patch.object(download, '_fetch_lzma_file', fetch_half_then_fail):
    with pytest.raises(tasks.DataNotAvailableError,
                       match='downloading it failed .*URLError'):
      tasks.get_task('emnist_mlp', data_source='online',
                     cache_dir=str(tmp_path), download=True)
  assert not (tmp_path / 'emnist_all.sqlite').exists()


def test_missing_stackoverflow_counts_name_their_path(tff_cache, tmp_path):
  os.symlink(os.path.join(tff_cache, 'stackoverflow.sqlite'),
             tmp_path / 'stackoverflow.sqlite')
  with pytest.raises(tasks.DataNotAvailableError) as error:
    tasks.get_task('stackoverflow_tag', data_source='online',
                   cache_dir=str(tmp_path), download=False)
  assert str(tmp_path / 'datasets' / 'stackoverflow.word_count') in str(
      error.value)


def _write_cifar10_binaries(folder, rng):
  batches = folder / 'cifar-10-batches-bin'
  batches.mkdir(parents=True)
  for name, num in [(f'data_batch_{i}.bin', 4) for i in range(1, 6)] + [
      ('test_batch.bin', 5)]:
    records = np.concatenate([
        (np.arange(num) % 10).astype(np.uint8)[:, None],
        rng.integers(0, 256, (num, 3072)).astype(np.uint8)], axis=1)
    records.tofile(batches / name)
  (batches / 'batches.meta.txt').write_text('\n'.join(
      'airplane automobile bird cat deer dog frog horse ship truck'.split()))


@pytest.fixture(scope='module')
def tfds_cache(tmp_path_factory):
  """A tensorflow-datasets folder with a prepared 25-image 'cifar10'."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('tfds')
  _write_cifar10_binaries(root / 'extracted', np.random.default_rng(0))
  builder = tfds.builder('cifar10', data_dir=str(root / 'data'))
  # Preparing (not reading) needs the `importlib_resources` backport, which
  # this environment lacks; Python 3.11's `importlib.resources` has its API.
  # Only that name is set and taken back: restoring all of `sys.modules`
  # would also drop what other threads imported meanwhile.
  with pytest.MonkeyPatch.context() as patch, \
       mock.patch.object(tfds.download.DownloadManager,
                         'download_and_extract',
                         lambda self, url: str(root / 'extracted')):
    patch.setitem(sys.modules, 'importlib_resources', importlib.resources)
    builder.download_and_prepare(download_dir=str(root / 'downloads'))
  return str(root / 'data')


def test_online_cifar10_reads_a_prepared_tfds_folder(tfds_cache):
  task = tasks.get_task('cifar10_cnn', data_source='online',
                        cache_dir=tfds_cache, download=False, num_clients=4,
                        partition='iid', train_batch_size=2)
  images, labels = _first_batch(task)
  assert task.num_clients == 4
  assert images.shape == (2, 24, 24, 3) and labels.dtype == tf.int64
  assert sum(1 for _ in task.datasets.get_centralized_test_data().unbatch()
            ) == 5


def test_missing_cifar10_without_download_names_the_data_dir(tmp_path):
  with pytest.raises(tasks.DataNotAvailableError,
                     match=f'not prepared in {tmp_path}.*download=True'):
    tasks.get_task('cifar10_cnn', data_source='online',
                   cache_dir=str(tmp_path), download=False)


def test_shared_data_dir_follows_the_environment_variable(tmp_path,
                                                         monkeypatch):
  monkeypatch.setenv(sources.SHARED_DATA_ENV, str(tmp_path))
  assert sources.shared_data_dir() == tmp_path


def test_missing_shared_data_dir_names_the_path_and_the_variable(
    tmp_path, monkeypatch):
  monkeypatch.setenv(sources.SHARED_DATA_ENV, str(tmp_path / 'nowhere'))
  with pytest.raises(tasks.DataNotAvailableError,
                     match=f'{tmp_path}/nowhere does not exist.*'
                     f'{sources.SHARED_DATA_ENV}'):
    sources.shared_data_dir()


def test_speeches_are_grouped_by_role_and_empty_speeches_skipped():
  text = ('First Citizen:\nSpeak.\nNow.\n\nAll:\nResolved.\n\nTITUS:\n\n'
          'First Citizen:\nFirst, you know.\n')
  speeches = shakespeare.parse_speeches(text)
  assert speeches == {'First Citizen': ['Speak.\nNow.', 'First, you know.'],
                      'All': ['Resolved.']}


def test_text_without_role_lines_is_rejected_naming_the_file(tmp_path):
  path = tmp_path / 'sonnets.txt'
  path.write_text('Shall I compare thee to a summer\'s day?\n\n'
                  'Thou art more lovely and more temperate.\n')
  with pytest.raises(ValueError, match=f'{path} has no speeches'):
    tasks.get_task('shakespeare', text_path=str(path))


def test_offline_shakespeare_has_one_client_per_role_with_two_speeches():
  train, test = shakespeare.load_offline()
  assert len(train.client_ids) == 247  # Of 299 roles in tinyshakespeare.
  assert 'ROMEO' in train.client_ids
  assert train.client_ids == test.client_ids
  romeo = [len(list(d.create_tf_dataset_for_client('ROMEO')))
           for d in (train, test)]
  assert romeo == [128, 32]  # 160 speeches, 20% held out.


def test_digits_as_emnist_is_28x28_with_white_background():
  images, _ = sources.load_digits_arrays()
  pixels = emnist.digits_as_emnist(images[:3])
  assert pixels.shape == (3, 28, 28) and pixels.dtype == np.float32
  assert np.all(pixels[:, :4, :] == 1.0)  # The 4-pixel frame is background.
  assert pixels.min() < 0.2  # Ink is dark, as in federated EMNIST.


def test_digits_hold_out_a_fifth_of_each_class_for_testing():
  task = tasks.get_task('digits')
  num_test = sum(1 for _ in task.datasets.get_centralized_test_data().unbatch())
  num_train = sum(
      len(list(task.datasets.train_data.create_tf_dataset_for_client(c)))
      for c in task.datasets.train_data.client_ids)
  assert task.num_clients == 50
  assert num_train + num_test == 1797
  assert num_test == pytest.approx(0.2 * 1797, abs=10)


def _made_up_client_data():
  arrays = collections.OrderedDict(
      pixels=np.arange(12, dtype=np.float32).reshape(6, 2),
      label=np.array([5, 4, 3, 2, 1, 0], np.int64),
      name=np.array([b'a', b'b', b'c', b'd', b'e', b'f'], dtype=object))
  return task_lib.client_data_from_arrays(arrays, [[4, 0, 2], [1], [5, 3]])


def test_client_arrays_are_what_the_clients_dataset_slices():
  client_data = _made_up_client_data()
  for client_id in client_data.client_ids:
    arrays = client_data.client_arrays(client_id)
    # Oracle: TFF's own dataset of the client, batched whole.
    dataset = client_data.create_tf_dataset_for_client(client_id)
    expected = next(iter(dataset.batch(100)))
    assert list(arrays) == list(expected)
    for key, value in expected.items():
      assert tf.convert_to_tensor(arrays[key]).dtype == value.dtype
      np.testing.assert_array_equal(arrays[key], value.numpy())
    assert not arrays['pixels'].flags.writeable


def _elements(dataset):
  return [tf.nest.map_structure(lambda t: t.numpy(), e) for e in dataset]


def test_client_data_from_arrays_equals_tffs_own_and_owns_its_arrays():
  arrays = collections.OrderedDict(
      pixels=np.arange(12, dtype=np.float32).reshape(6, 2),
      label=np.array([5, 4, 3, 2, 1, 0], np.int64))
  made = task_lib.client_data_from_arrays(arrays, [[4, 0, 2], [1], [5, 3]])
  made_by_slices = task_lib.client_data_from_arrays(arrays,
                                                    [slice(0, 3), slice(3, 6)])
  # Oracle: TFF's TestClientData of the same clients' arrays (checked and
  # deep-copied by TFF).
  tffs = tff.simulation.datasets.TestClientData({
      '0': collections.OrderedDict((k, v[[4, 0, 2]]) for k, v in
                                   arrays.items()),
      '1': collections.OrderedDict((k, v[[1]]) for k, v in arrays.items()),
      '2': collections.OrderedDict((k, v[[5, 3]]) for k, v in
                                   arrays.items())})
  assert made.client_ids == tffs.client_ids
  assert made.element_type_structure == tffs.element_type_structure
  arrays['pixels'][:] = -1.0  # The source changes: the clients' data do not.
  for client_id in tffs.client_ids:
    tf.nest.map_structure(
        np.testing.assert_array_equal,
        _elements(made.create_tf_dataset_for_client(client_id)),
        _elements(tffs.create_tf_dataset_for_client(client_id)))
  assert made_by_slices.client_arrays('0')['pixels'].min() == 0.0  # Copied.
  with pytest.raises(ValueError, match='read-only'):
    made._tensor_slices_dict['0']['pixels'][0] = 7.0  # pylint: disable=protected-access


def test_selecting_in_memory_clients_keeps_their_arrays():
  client_data = _made_up_client_data()
  selected = task_lib.select_clients(client_data, 2, seed=3)
  # Oracle: TFF's generic selection of the same clients.
  plain = tff.simulation.datasets.TestClientData(
      {cid: client_data.client_arrays(cid) for cid in client_data.client_ids})
  generic = task_lib.select_clients(plain, 2, seed=3)
  assert selected.client_ids == generic.client_ids
  for client_id in generic.client_ids:
    expected = next(iter(
        generic.create_tf_dataset_for_client(client_id).batch(100)))
    tf.nest.map_structure(np.testing.assert_array_equal,
                          selected.client_arrays(client_id),
                          tf.nest.map_structure(lambda t: t.numpy(), expected))


@pytest.mark.parametrize('option', ['offline_train_examples',
                                    'offline_test_examples'])
@pytest.mark.parametrize('value', [0, -5])
def test_offline_cifar10_example_counts_below_one_are_refused_by_name(
    option, value):
  # Accepted, -5 training examples were 990 and 5 test examples (numpy
  # splits from the end), and 0 test examples an empty test set.
  with pytest.raises(ValueError, match=(
      f'`{option}` must be a positive integer; got {value}.')):
    tasks.get_task('cifar10_cnn', num_clients=2, **{option: value})


def test_offline_cifar10_has_the_example_counts_asked_for():
  task = tasks.get_task('cifar10_cnn', num_clients=2,
                        offline_train_examples=30, offline_test_examples=12)
  train = task.datasets.train_data
  assert sum(train.client_arrays(c)['label'].size
             for c in train.client_ids) == 30
  assert task.datasets.test_data.cardinality().numpy() == 12
