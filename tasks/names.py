"""Task, partition and data-source names, readable without TensorFlow.

The command line checks its flags against these before importing anything
heavy; `tasks.registry` asserts at import that its tasks match them.
"""

# task -> the data sources it accepts.
DATA_SOURCES = {
    'digits': ('offline',),
    'emnist_cnn': ('online', 'offline', 'synthetic'),
    'emnist_mlp': ('online', 'offline', 'synthetic'),
    'emnist_logreg': ('online', 'offline', 'synthetic'),
    'cifar10_cnn': ('online', 'offline'),
    'cifar10_resnet18': ('online', 'offline'),
    'cifar100_resnet18': ('online', 'offline'),
    'shakespeare': ('online', 'offline', 'synthetic'),
    'stackoverflow_next_word': ('online', 'offline'),
    'stackoverflow_tag': ('online', 'offline'),
    'heterogeneous_quadratic': ('offline',),
    'fat_tailed_quadratic': ('offline',),
    'claim21_quadratic': ('offline',),
    'eq24_quadratic': ('offline',),
}
TASK_NAMES = tuple(DATA_SOURCES)
# Image tasks with labels, which accept `partition`.
PARTITIONABLE = ('digits', 'emnist_cnn', 'emnist_mlp', 'emnist_logreg',
                 'cifar10_cnn', 'cifar10_resnet18', 'cifar100_resnet18')
PARTITION_NAMES = ('iid', 'dirichlet', 'classes_per_client', 'shards',
                   'small_large')

# task -> the options `get_task(task, **options)` accepts (`--task_option`).
TASK_OPTIONS = {
    'digits': ('hidden_units',),
    'emnist_cnn': ('only_digits', 'offline_data', 'dropout'),
    'emnist_mlp': ('only_digits', 'offline_data'),
    'emnist_logreg': ('only_digits', 'offline_data'),
    'cifar10_cnn': ('crop_size', 'distort_train_images',
                    'offline_train_examples', 'offline_test_examples'),
    'cifar10_resnet18': ('crop_size', 'distort_train_images',
                         'offline_train_examples', 'offline_test_examples'),
    'cifar100_resnet18': ('crop_size', 'distort_train_images'),
    'shakespeare': ('sequence_length', 'min_speeches', 'text_path'),
    'stackoverflow_next_word': ('vocab_size', 'sequence_length',
                                'num_out_of_vocab_buckets'),
    'stackoverflow_tag': ('word_vocab_size', 'tag_vocab_size'),
    'heterogeneous_quadratic': ('dimension', 'rank', 'initial_offset_scale'),
    'fat_tailed_quadratic': ('dimension', 'noise', 'tail_index', 'noise_scale',
                             'examples_per_client', 'initial_weights'),
    'claim21_quadratic': ('clip_threshold', 'target_multiple',
                          'initial_weights'),
    'eq24_quadratic': ('initial_weights',),
}

# (task, option) -> (least, largest) of an integer option sizing the model,
# checked before TensorFlow loads. `digits`' MLP has 75 h + 10 weights
# (64-h-10), which must fit TensorFlow's int32 sizes.
INTEGER_OPTIONS = {
    ('digits', 'hidden_units'): (1, (2**31 - 1 - 10) // 75),
}

# (task, data source) -> its training clients when `num_clients` is not
# given, where the task fixes that number without reading data: centralized
# arrays split into that many clients (ids '00'..'49', `ARRAY_CLIENTS`) and
# the generated problems. Natural clients (writers, roles, users) are counted
# only once their data is read.
DEFAULT_NUM_CLIENTS = {
    ('digits', 'offline'): 50,
    ('emnist_cnn', 'offline'): 50,
    ('emnist_mlp', 'offline'): 50,
    ('emnist_logreg', 'offline'): 50,
    ('cifar10_cnn', 'online'): 100,
    ('cifar10_cnn', 'offline'): 100,
    ('cifar10_resnet18', 'online'): 100,
    ('cifar10_resnet18', 'offline'): 100,
    ('heterogeneous_quadratic', 'offline'): 100,
    ('fat_tailed_quadratic', 'offline'): 5,
    ('claim21_quadratic', 'offline'): 3,
    ('eq24_quadratic', 'offline'): 3,
}
# Tasks whose clients are parts of centralized arrays, named by zero-padded
# numbers (`tasks.task.client_data_from_arrays`).
ARRAY_CLIENTS = tuple(key for key in DEFAULT_NUM_CLIENTS
                      if key[0] in PARTITIONABLE)


def population(task: str, data_source: str, num_clients=None):
  """The number of training clients, where known without data (else None).

  Every task builds exactly `num_clients` clients when given (or refuses).
  """
  if num_clients is not None:
    return num_clients
  return DEFAULT_NUM_CLIENTS.get((task, data_source))


def client_ids(task: str, data_source: str, num_clients=None):
  """The training client ids, where known without data (else None)."""
  if (task, data_source) not in ARRAY_CLIENTS:
    return None  # Natural clients, unless re-partitioned: not counted here.
  count = population(task, data_source, num_clients)
  width = len(str(max(count - 1, 0)))
  return [str(k).zfill(width) for k in range(count)]
