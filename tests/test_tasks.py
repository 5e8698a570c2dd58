"""Specification of `tasks.get_task`: each task by name, its model, a round.

Every learning task builds its model and runs one round of weighted FedAvg
on its offline data (tiny: 2 clients, 2 batches of 2). ResNet-18 is only
built and measured here; its round is `slow`. The synthetic problems' rounds
are in test_tasks_synthetic.py, where they are checked against the exact
gradient.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from tasks import models
from tasks import task as task_lib

_LEARNING_TASKS = ('digits', 'emnist_cnn', 'emnist_mlp', 'emnist_logreg',
                   'cifar10_cnn', 'shakespeare', 'stackoverflow_next_word',
                   'stackoverflow_tag')
_RESNET_TASKS = ('cifar10_resnet18', 'cifar100_resnet18')
_SYNTHETIC_TASKS = ('heterogeneous_quadratic', 'fat_tailed_quadratic',
                    'claim21_quadratic', 'eq24_quadratic')
# Small task options where the defaults only make batches longer.
_TINY_OPTIONS = {'shakespeare': {'sequence_length': 8},
                 'stackoverflow_next_word': {'sequence_length': 8}}


@pytest.fixture(scope='module')
def built():
  """`built(name)` -> the task with tiny batches, built once per module.

  Only tasks are cached, not models: once TFF builds a Keras model inside a
  graph, Keras refuses to call models built eagerly before it.
  """
  cache = {}

  def get(name):
    if name not in cache:
      cache[name] = tasks.get_task(name, train_batch_size=2,
                                   max_elements_per_client=4,
                                   **_TINY_OPTIONS.get(name, {}))
    return cache[name]

  return get


@pytest.fixture(scope='module')
def resnet18():
  """The CIFAR-10 ResNet-18 Keras model, built once (static checks only)."""
  return models.create_resnet18((24, 24, 3), 10)


def _first_batch(task):
  client = task.datasets.train_data.client_ids[0]
  return next(iter(task.datasets.train_preprocess_fn(
      task.datasets.train_data.create_tf_dataset_for_client(client))))


def _one_round(task):
  process = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.01))
  data = [
      task.datasets.train_preprocess_fn(
          task.datasets.train_data.create_tf_dataset_for_client(cid))
      for cid in task.datasets.train_data.client_ids[:2]
  ]
  return process.next(process.initialize(), data).metrics


def test_task_names_cover_every_model_and_synthetic_problem():
  assert set(tasks.TASK_NAMES) == set(_LEARNING_TASKS + _RESNET_TASKS +
                                      _SYNTHETIC_TASKS)


def test_default_task_is_the_offline_digits_demo():
  assert tasks.DEFAULT_TASK == 'digits'
  task = tasks.get_task()
  assert task.name == 'digits' and task.data_source == 'offline'


@pytest.mark.parametrize('name', tasks.TASK_NAMES)
def test_get_task_returns_a_baseline_task_named_after_itself(built, name):
  task = built(name)  # BaselineTask checks model_fn() against the data.
  assert isinstance(task, tff.simulation.baselines.BaselineTask)
  assert task.name == name
  assert isinstance(task.datasets.train_data,
                    tff.simulation.datasets.ClientData)


# The recurrent tasks' round takes seconds: in the slow suite (their models
# and data are checked in the default suite by the tests below); so are the
# EMNIST models and the CIFAR CNN (their data and models are checked below;
# the EMNIST logistic regression trains in tests/test_tasks_mnist.py), and
# digits, the default task, whose federated rounds on offline data every
# in-process training run of the default suite runs (tests/test_training.py).
@pytest.mark.parametrize('name', [
    pytest.param(n, marks=pytest.mark.slow) if n in (
        'shakespeare', 'stackoverflow_next_word', 'emnist_mlp',
        'emnist_logreg', 'emnist_cnn', 'cifar10_cnn', 'digits') else n
    for n in _LEARNING_TASKS])
def test_one_federated_round_runs_on_offline_data(built, name):
  metrics = _one_round(built(name))['client_work']['train']
  assert metrics['num_examples'] > 0
  assert np.isfinite(metrics['loss'])


@pytest.mark.slow
@pytest.mark.parametrize('name', _RESNET_TASKS)
def test_one_federated_round_runs_with_resnet18(built, name):
  metrics = _one_round(built(name))['client_work']['train']
  assert np.isfinite(metrics['loss'])


@pytest.mark.parametrize('name,num_parameters', [
    ('digits', 2410),  # 64*32 + 32 + 32*10 + 10.
    ('emnist_cnn', 1206590),  # Reddi et al.'s CNN, 62 classes.
    ('emnist_mlp', 159010),  # Zhang et al. 2022's "159K" MLP: 784*200+200+200*10+10.
    ('emnist_logreg', 7850),  # 784*10 + 10.
    ('cifar10_cnn', 1068298),  # McMahan et al.'s "about 10^6".
    ('heterogeneous_quadratic', 200),
    ('eq24_quadratic', 1),
])
def test_model_has_the_papers_parameter_count(built, name, num_parameters):
  assert built(name).num_parameters() == num_parameters


def test_emnist_cnn_only_digits_option_has_ten_outputs():
  task = tasks.get_task('emnist_cnn', only_digits=True)
  assert task.num_parameters() == 1206590 - 52 * (128 + 1)  # 62 -> 10.


def test_emnist_cnn_without_dropout_is_the_original_fedavg_cnn():
  # McMahan et al. 2017's CNN (TFF's 'cnn'): 1,663,370 parameters on the
  # ten digits (the paper's count), no dropout layer; the mlp has no option.
  task = tasks.get_task('emnist_cnn', only_digits=True, dropout=False)
  assert task.num_parameters() == 1663370
  keras_model = task.model_fn()._keras_model  # pylint: disable=protected-access
  assert not any(isinstance(layer, tf.keras.layers.Dropout)
                 for layer in keras_model.layers)
  with pytest.raises(TypeError, match='dropout'):
    tasks.get_task('emnist_mlp', dropout=False)


def test_resnet18_has_the_papers_11m_parameters(resnet18):
  assert resnet18.count_params() == 11181642  # Cheng et al. 2022: "11.1M".


def test_resnet18_uses_group_norm_and_no_batch_norm(resnet18):
  kinds = {type(layer).__name__ for layer in resnet18.layers}
  assert 'GroupNormalization' in kinds
  assert not any('BatchNormalization' in kind for kind in kinds)


def test_resnet18_outputs_one_probability_per_class(resnet18):
  assert resnet18.output_shape == (None, 10)
  assert resnet18.layers[-1].activation.__name__ == 'softmax'


def test_shakespeare_lstm_has_the_papers_parameter_count():
  # Embedding 90x8, 2 x LSTM 256, dense 256 -> 90 (Reddi et al.).
  model = models.create_shakespeare_lstm(90, 80)
  assert model.count_params() == 820522


@pytest.mark.parametrize('name,input_shape,num_outputs', [
    ('digits', (2, 8, 8, 1), 10),
    ('emnist_cnn', (2, 28, 28, 1), 62),
    ('emnist_mlp', (2, 28, 28, 1), 10),
    ('emnist_logreg', (2, 28, 28, 1), 10),
    ('cifar10_cnn', (2, 24, 24, 3), 10),
])
def test_image_batches_and_outputs_have_the_expected_shapes(
    built, name, input_shape, num_outputs):
  task = built(name)
  images, labels = _first_batch(task)
  model = task.model_fn()  # Referenced: its tf.functions hold a weakref.
  assert images.shape == input_shape and labels.shape == (2,)
  assert model.predict_on_batch(images, training=False).shape == (
      2, num_outputs)


def test_shakespeare_predicts_one_of_90_characters_per_position(built):
  task = built('shakespeare')
  inputs, targets = _first_batch(task)
  model = task.model_fn()
  assert tasks.shakespeare.VOCAB_SIZE == 90  # TFF's 86 characters + 4.
  assert inputs.shape == targets.shape == (2, 8)
  assert int(tf.reduce_max(inputs)) < 90
  assert model.predict_on_batch(inputs, training=False).shape == (2, 8, 90)


def test_stackoverflow_next_word_predicts_over_vocabulary_and_specials(built):
  task = built('stackoverflow_next_word')
  inputs, _ = _first_batch(task)
  model = task.model_fn()
  # TFF's synthetic vocabulary: 60 words + 1 out-of-vocabulary + 3 specials.
  assert model.predict_on_batch(inputs, training=False).shape == (2, 8, 64)


def test_stackoverflow_tag_maps_bag_of_words_to_tags(built):
  words, tags = _first_batch(built('stackoverflow_tag'))
  assert words.shape == (2, 60) and tags.shape == (2, 20)


def test_centralized_test_data_is_batched_for_evaluation(built):
  images, labels = next(iter(
      built('digits').datasets.get_centralized_test_data()))
  assert images.shape[1:] == (8, 8, 1) and images.shape[0] == labels.shape[0]


def test_local_epochs_repeat_each_client_dataset():
  one = tasks.get_task('eq24_quadratic', local_epochs=1)
  three = tasks.get_task('eq24_quadratic', local_epochs=3)
  count = lambda task: len(list(_client_examples(task)))
  assert count(three) == 3 * count(one)


def _client_examples(task):
  dataset = task.datasets.train_preprocess_fn(
      task.datasets.train_data.create_tf_dataset_for_client('0'))
  return dataset.unbatch()


@pytest.mark.parametrize('name', ['digits', 'emnist_cnn', 'emnist_mlp',
                                  'cifar10_cnn'])
def test_client_batches_keep_the_client_data_order_on_every_pass(name):
  # With the client shuffle off, batch k holds example k (batch size 1), on
  # every pass: training the same client twice takes the same steps. Passes
  # run as the in-process executor runs them (no tf.data autotuning, so
  # parallel maps run at full parallelism from the first batch).
  task = tasks.get_task(name, train_batch_size=1, shuffle_buffer_size=1)
  data = task.datasets.train_data
  client = data.create_tf_dataset_for_client(data.client_ids[0])
  expected = [int(example['label']) for example in client]
  options = tf.data.Options()
  options.autotune.enabled = False
  dataset = task.datasets.train_preprocess_fn(client).with_options(options)
  labels = tf.function(lambda: dataset.reduce(
      tf.zeros([0], tf.int64),
      lambda order, batch: tf.concat([order, tf.cast(batch[1], tf.int64)],
                                     0)))
  for _ in range(20):
    np.testing.assert_array_equal(labels(), expected)


@pytest.mark.parametrize('epochs, max_elements', [(1, None), (3, 40)])
def test_emnist_preprocessing_gives_tffs_own_batches(epochs, max_elements):
  # Oracle: TFF's EMNIST preprocessing (maps each batch; tff_clip's tasks map
  # each example first, so clients are reshaped once per run).
  from tensorflow_federated.python.simulation.baselines.emnist import emnist_preprocessing  # pylint: disable=g-import-not-at-top
  spec = tff.simulation.baselines.ClientSpec(
      num_epochs=epochs, batch_size=7, max_elements=max_elements,
      shuffle_buffer_size=1)
  task = tasks.get_task('digits', train_batch_size=7, local_epochs=epochs,
                        max_elements_per_client=max_elements,
                        shuffle_buffer_size=1)
  client = task.datasets.train_data.create_tf_dataset_for_client('00')
  ours = list(task.datasets.train_preprocess_fn(client))
  tffs = list(emnist_preprocessing.create_preprocess_fn(
      spec, num_parallel_calls=1)(client))
  assert len(ours) == len(tffs) > 1
  for (x, y), (tx, ty) in zip(ours, tffs):
    assert x.shape == tx.shape and x.dtype == tx.dtype
    np.testing.assert_array_equal(x, tx)
    np.testing.assert_array_equal(y, ty)


def test_max_elements_per_client_caps_each_client():
  task = tasks.get_task('digits', max_elements_per_client=5,
                        train_batch_size=2)
  batches = list(task.datasets.train_preprocess_fn(
      task.datasets.train_data.create_tf_dataset_for_client('00')))
  assert [b[1].shape[0] for b in batches] == [2, 2, 1]


def test_partition_and_num_clients_reach_the_data():
  task = tasks.get_task('digits', num_clients=10, partition='dirichlet',
                        partition_alpha=0.1)
  assert task.num_clients == 10
  assert 'dirichlet(alpha=0.1)' in task.data_description


def test_partition_alpha_alone_tunes_a_default_dirichlet_partition():
  task = tasks.get_task('cifar10_cnn', partition_alpha=0.3)
  assert 'dirichlet(alpha=0.3)' in task.data_description


def _rows(dataset):
  return [(int(e['label']), e['pixels'].numpy().tobytes())
          for e in dataset]


@pytest.mark.parametrize('name, options', [
    ('digits', {}),
    pytest.param('emnist_logreg', {'offline_data': 'mnist'},
                 marks=pytest.mark.slow),
])
def test_validation_fraction_holds_out_training_examples_no_client_holds(
    name, options):
  whole = tasks.get_task(name, num_clients=10, **options)
  held = tasks.get_task(name, num_clients=10, validation_fraction=0.1,
                        **options)
  assert whole.datasets.validation_data is None
  train = _rows(whole.datasets.train_data.create_tf_dataset_from_all_clients())
  clients = _rows(held.datasets.train_data.create_tf_dataset_from_all_clients())
  validation = _rows(held.datasets.validation_data)
  # Together exactly the training examples; 10% of each class held out.
  assert sorted(clients + validation) == sorted(train)
  for label in range(10):
    in_class = sum(1 for l, _ in train if l == label)
    assert sum(1 for l, _ in validation if l == label) == round(0.1 * in_class)
  # The test set is untouched.
  assert _rows(held.datasets.test_data) == _rows(whole.datasets.test_data)


def test_validation_fraction_of_a_task_without_array_data_is_rejected():
  with pytest.raises(ValueError, match="`validation_fraction`: task "
                     "'shakespeare'"):
    tasks.get_task('shakespeare', validation_fraction=0.1)


@pytest.mark.parametrize('fraction', [0.0, 1.0, -0.1, True])
def test_validation_fraction_outside_zero_one_is_rejected(fraction):
  with pytest.raises(ValueError, match='`validation_fraction` must be in'):
    tasks.get_task('digits', validation_fraction=fraction)


def test_unknown_task_name_is_rejected_with_a_suggestion():
  with pytest.raises(ValueError,
                     match="Unknown task 'emnist_mlpp'. Did you mean "
                     "'emnist_mlp'"):
    tasks.get_task('emnist_mlpp')


def test_unknown_data_source_is_rejected():
  with pytest.raises(ValueError, match="Unknown `data_source` 'cloud'"):
    tasks.get_task('digits', data_source='cloud')


def test_data_source_a_task_lacks_is_rejected():
  with pytest.raises(ValueError, match="'digits' has no 'online' data"):
    tasks.get_task('digits', data_source='online')


def test_unknown_partition_is_rejected():
  with pytest.raises(ValueError, match="Unknown `partition` 'by_writer'"):
    tasks.get_task('digits', partition='by_writer')


def test_partition_of_a_task_with_natural_clients_is_rejected():
  with pytest.raises(ValueError, match="'shakespeare' cannot be re-partition"):
    tasks.get_task('shakespeare', partition='iid')


@pytest.mark.parametrize('alpha', [0.0, -0.5])
def test_non_positive_partition_alpha_is_rejected(alpha):
  with pytest.raises(ValueError, match='`partition_alpha`.*must be positive'):
    tasks.get_task('digits', partition='dirichlet', partition_alpha=alpha)


def test_more_clients_than_examples_is_rejected():
  with pytest.raises(ValueError, match=r'`num_clients` \(5000\) is larger'):
    tasks.get_task('digits', num_clients=5000)


@pytest.mark.parametrize('argument', ['num_clients', 'train_batch_size',
                                      'local_epochs'])
def test_non_positive_count_is_rejected_naming_the_argument(argument):
  with pytest.raises(ValueError, match=f'`{argument}` must be positive'):
    tasks.get_task('digits', **{argument: 0})


def test_unknown_task_option_is_rejected_listing_the_options():
  with pytest.raises(TypeError,
                     match=r"'shakespeare' has no option\(s\) \['vocab_size'\]"
                     r".*sequence_length"):
    tasks.get_task('shakespeare', vocab_size=10)


def test_describe_rows_say_model_parameters_source_and_clients():
  rows = tasks.describe(['digits', 'emnist_mlp'])
  assert [(r.name, r.data_source.split(':')[0]) for r in rows] == [
      ('digits', 'offline'), ('emnist_mlp', 'online'),
      ('emnist_mlp', 'offline'), ('emnist_mlp', 'synthetic')]
  online = rows[1]
  assert (online.num_parameters, online.num_clients) == (159010, 3383)
  assert rows[0].num_clients == 50 and rows[3].num_clients == 2


def test_describe_markdown_is_a_table_with_one_line_per_row():
  rows = tasks.describe(['eq24_quadratic'])
  table = tasks.describe_markdown(rows).splitlines()
  assert table[0] == '| task | model | parameters | data source | clients |'
  assert table[2].startswith('| `eq24_quadratic` | linear, w in R^1 | 1 |')


def test_describe_markdown_escapes_characters_that_break_the_table():
  row = tasks.TaskRow('x', '1/2||x||^2 + <xi, x>', 10, 'offline: y', 5)
  line = tasks.describe_markdown([row]).splitlines()[2]
  assert line == (r'| `x` | 1/2\|\|x\|\|^2 + &lt;xi, x&gt; | 10 | '
                  r'offline: y | 5 |')


@pytest.mark.slow
def test_describe_lists_every_task():
  rows = tasks.describe()
  assert {r.name for r in rows} == set(tasks.TASK_NAMES)
  assert all(r.num_parameters > 0 and r.num_clients > 0 for r in rows)


def _spec_task(model_fn, element_spec):
  """A `tasks.task.Task` of one client whose examples have `element_spec`."""
  arrays = collections.OrderedDict(
      (key, np.zeros([2, *s.shape[1:]], s.dtype.as_numpy_dtype))
      for key, s in element_spec.items())
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=task_lib.ArrayClientData({'a': arrays}),
      test_data=tf.data.Dataset.from_tensor_slices(arrays),
      train_preprocess_fn=lambda d: d.batch(2)
      .map(lambda e: (e['x'], e['y'])))
  return task_lib.Task(datasets, model_fn, name='t', data_source='offline',
                       model_description='', data_description='',
                       evaluates_on_clients_data=True)


def test_a_declared_input_spec_is_checked_as_tff_checks_it_without_a_model():
  built = []
  keras_model_fn = lambda: built.append(1) or tf.keras.Sequential(
      [tf.keras.layers.Dense(2, input_shape=(3,))])
  spec = (tf.TensorSpec([None, 3], tf.float32),
          tf.TensorSpec([None], tf.int32))
  model_fn = task_lib.classification_model_fn(keras_model_fn, spec)
  elements = collections.OrderedDict(x=tf.TensorSpec([None, 3], tf.float32),
                                     y=tf.TensorSpec([None], tf.int32))
  task = _spec_task(model_fn, elements)  # The batches' spec is `spec`.
  assert not built  # Checked from the declared spec: no model built.
  # A mismatch is refused as TFF's own check (which builds one) refuses it.
  other = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32),
                                  y=tf.TensorSpec([None], tf.int32))
  with pytest.raises(ValueError, match='do not match'):
    _spec_task(model_fn, other)
  undeclared = lambda: model_fn()  # No `input_spec`: TFF's check runs.
  with pytest.raises(ValueError, match='do not match'):
    _spec_task(undeclared, other)
  assert len(built) == 1
  _spec_task(undeclared, elements)
  assert task.datasets.element_type_structure == spec
