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
