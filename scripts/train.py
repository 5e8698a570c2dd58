r"""Federated training with bounded (and optionally private) client updates.

With no flags: federated scikit-learn digits (real handwritten digits, offline),
DP-FedAvg with adaptive clipping, 30 rounds, about a minute on 2 cores:

  .venv/bin/python -m scripts.train

Kill it at any moment and run the same command again: it resumes from its last
checkpoint. See README.md for EMNIST, CIFAR-10, Shakespeare and Stack Overflow
command lines, and `--helpfull` for every flag.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top,unused-import
# TensorFlow is imported here, before absl's app.run: imported for the first
# time inside app.run's main, Keras (2.14) then builds functional models from
# graph tensors and `Flatten` fails with "Attempt to convert a value (None)".
import tensorflow as tf
from tff_clip import training
# pylint: enable=g-import-not-at-top,unused-import

_D = training.TrainConfig()


def _optional_float(name, help_text):
  return flags.DEFINE_string(name, None, help_text)


FLAGS = flags.FLAGS
flags.DEFINE_string('task', _D.task, 'Task name (see `tasks.TASK_NAMES`).')
flags.DEFINE_enum('data_source', _D.data_source,
                  ['offline', 'online', 'synthetic'],
                  'offline: no network (digits, tinyshakespeare, generated); '
                  'online: the real data set, downloaded once into '
                  '--cache_dir; synthetic: TFF\'s get_synthetic().')
flags.DEFINE_multi_string(
    'task_option', [],
    'A task option as key=value (repeat the flag for several), e.g. '
    '--task_option=noise=student_t --task_option=tail_index=1.5 for '
    'fat_tailed_quadratic, --task_option=offline_data=mnist for the EMNIST '
    'tasks. Values: numbers, none, true/false, comma lists, else strings. '
    'The options of a task: `tasks.task_options(name)`.')
flags.DEFINE_integer('num_clients', None, 'Training clients (task default).')
flags.DEFINE_string('partition', None, 'Partition for image tasks: iid, '
                    'dirichlet, classes_per_client, shards, small_large.')
flags.DEFINE_float('partition_alpha', None, 'Dirichlet alpha (> 0).')
flags.DEFINE_enum('bounding', _D.bounding, list(training.BOUNDINGS),
                  'How each client update is bounded before aggregation.')
flags.DEFINE_string('clip_norm', str(_D.clip_norm),
                    "Clip norm C (a number) or 'adaptive' (quantile "
                    'tracking from --initial_clip_norm).')
flags.DEFINE_float('initial_clip_norm', _D.initial_clip_norm,
                   'Starting C for adaptive clipping.')
flags.DEFINE_enum('split', _D.split, ['uniform', 'dim'],
                  'Per-layer budget split: C/sqrt(H) or C sqrt(d_h/sum d).')
flags.DEFINE_float('target_quantile', _D.target_quantile,
                   'Adaptive clipping: fraction of clients left unclipped.')
flags.DEFINE_float('clip_learning_rate', _D.clip_learning_rate,
                   'Adaptive clipping: geometric learning rate eta_C.')
_optional_float('noise_multiplier',
                f'Gaussian noise multiplier z (default {_D.noise_multiplier}; '
                "'none' for no DP). Excludes --target_epsilon.")
flags.DEFINE_float('target_epsilon', None,
                   'Calibrate z to reach this epsilon at --delta after '
                   '--rounds. Excludes --noise_multiplier.')
flags.DEFINE_float('delta', _D.delta, 'DP delta.')
flags.DEFINE_integer('clients_per_round', _D.clients_per_round,
                     'Clients per round (expected, for Poisson sampling).')
flags.DEFINE_enum('sampling', _D.sampling, ['uniform', 'poisson'],
                  'Client sampling; the ledger accounts the one used.')
flags.DEFINE_integer('rounds', _D.rounds, 'Training rounds.')
flags.DEFINE_enum('client_optimizer', _D.client_optimizer,
                  list(training.CLIENT_OPTIMIZERS), 'Client optimizer.')
flags.DEFINE_float('client_learning_rate', _D.client_learning_rate,
                   'Client learning rate eta_L.')
flags.DEFINE_enum('server_optimizer', _D.server_optimizer,
                  list(training.SERVER_OPTIMIZERS), 'Server optimizer.')
flags.DEFINE_float('server_learning_rate', _D.server_learning_rate,
                   'Server learning rate eta.')
flags.DEFINE_float('server_momentum', _D.server_momentum,
                   'Momentum of --server_optimizer=sgdm.')
flags.DEFINE_integer('local_epochs', _D.local_epochs,
                     'Passes over the client data per round.')
flags.DEFINE_integer('local_steps', None,
                     'If set, exactly this many local steps (batches).')
flags.DEFINE_integer('batch_size', _D.batch_size, 'Client batch size.')
flags.DEFINE_float('local_clip', None, 'Per-step gradient clip (FAT-Clipping '
                   'PI / local clipping C_loc).')
flags.DEFINE_float('blur_lambda', None, 'BLUR regularisation strength.')
flags.DEFINE_float('blur_clip_norm', None, 'BLUR radius S (default: '
                   '--clip_norm when numeric).')
flags.DEFINE_list('lus_sparsity', None, 'LUS sparsity c in [0, 1): one value '
                  'for every layer, or one per trainable layer (comma list).')
flags.DEFINE_integer('eval_every', _D.eval_every,
                     'Centralized evaluation every this many rounds.')
flags.DEFINE_string('root_output_dir', _D.root_output_dir, 'Output root.')
flags.DEFINE_string('experiment_name', None,
                    'Run name (default: derived from task and bounding).')
flags.DEFINE_integer('seed', _D.seed, 'Seed of sampling, data order, noise.')
flags.DEFINE_enum('executor', _D.executor, list(training.EXECUTORS),
                  'local: TFF C++ runtime; gpu: the same, refusing to run '
                  'without a visible GPU; remote: TFF workers (--workers).')
flags.DEFINE_integer('max_concurrent_clients', None,
                     'Local executor: at most this many clients at once.')
flags.DEFINE_list('workers', [], 'Remote executor: host:port of each TFF '
                  'worker_binary.')
flags.DEFINE_float('worker_timeout_s', _D.worker_timeout_s,
                   'Seconds to wait for each remote worker to answer.')
flags.DEFINE_integer('checkpoint_every', _D.checkpoint_every,
                     'Checkpoint every this many rounds.')
flags.DEFINE_string('cache_dir', None, 'Online data cache directory.')
flags.DEFINE_bool('progress', True, 'Show a progress bar.')


def _parse_optional_float(value, name):
  if value is None:
    return None
  if value.lower() in ('none', ''):
    return None
  try:
    return float(value)
  except ValueError:
    raise app.UsageError(f'--{name} must be a number or none; got '
                         f'{value!r}.') from None


def _parse_option_value(text: str):
  """'1.5' -> 1.5, '3' -> 3, 'none' -> None, 'true' -> True, 'a,b' -> tuple."""
  if ',' in text:
    return tuple(_parse_option_value(part) for part in text.split(','))
  lowered = text.strip().lower()
  if lowered == 'none':
    return None
  if lowered in ('true', 'false'):
    return lowered == 'true'
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text.strip()


def parse_task_options(values) -> tuple:
  """`--task_option` values ['key=value', ...] -> ((key, value), ...)."""
  options = []
  for item in values:
    key, sep, value = item.partition('=')
    if not sep or not key.strip():
      raise app.UsageError(f'--task_option must be key=value; got {item!r}.')
    options.append((key.strip(), _parse_option_value(value)))
  return tuple(options)


def _parse_lus_sparsity(values):
  if values is None:
    return None
  try:
    parsed = tuple(float(v) for v in values)
  except ValueError:
    raise app.UsageError('--lus_sparsity must be numbers in [0, 1) (one, or '
                         f'one per layer); got {",".join(values)!r}.') from None
  if not parsed:
    raise app.UsageError('--lus_sparsity is empty.')
  return parsed[0] if len(parsed) == 1 else parsed


def config_from_flags() -> training.TrainConfig:
  clip_norm = FLAGS.clip_norm
  if clip_norm != 'adaptive':
    try:
      clip_norm = float(clip_norm)
    except ValueError:
      raise app.UsageError("--clip_norm must be a number or 'adaptive'; got "
                           f'{clip_norm!r}.') from None
  if FLAGS['noise_multiplier'].present:
    noise_multiplier = _parse_optional_float(FLAGS.noise_multiplier,
                                             'noise_multiplier')
  else:
    # The default is DP, unless the user asked for calibration or no bounding.
    noise_multiplier = (None if FLAGS.target_epsilon is not None or
                        FLAGS.bounding == 'none' else _D.noise_multiplier)
  name = FLAGS.experiment_name or (
      f'{FLAGS.task}_{FLAGS.bounding}'
      f'{"_dp" if noise_multiplier is not None or FLAGS.target_epsilon else ""}'
      f'_seed{FLAGS.seed}')
  return training.TrainConfig(
      task=FLAGS.task, data_source=FLAGS.data_source,
      task_options=parse_task_options(FLAGS.task_option),
      num_clients=FLAGS.num_clients, partition=FLAGS.partition,
      partition_alpha=FLAGS.partition_alpha, bounding=FLAGS.bounding,
      clip_norm=clip_norm, initial_clip_norm=FLAGS.initial_clip_norm,
      split=FLAGS.split, target_quantile=FLAGS.target_quantile,
      clip_learning_rate=FLAGS.clip_learning_rate,
      noise_multiplier=noise_multiplier, target_epsilon=FLAGS.target_epsilon,
      delta=FLAGS.delta, clients_per_round=FLAGS.clients_per_round,
      sampling=FLAGS.sampling, rounds=FLAGS.rounds,
      client_optimizer=FLAGS.client_optimizer,
      client_learning_rate=FLAGS.client_learning_rate,
      server_optimizer=FLAGS.server_optimizer,
      server_learning_rate=FLAGS.server_learning_rate,
      server_momentum=FLAGS.server_momentum, local_epochs=FLAGS.local_epochs,
      local_steps=FLAGS.local_steps, batch_size=FLAGS.batch_size,
      local_clip=FLAGS.local_clip, blur_lambda=FLAGS.blur_lambda,
      blur_clip_norm=FLAGS.blur_clip_norm, lus_sparsity=_parse_lus_sparsity(FLAGS.lus_sparsity),
      eval_every=FLAGS.eval_every, root_output_dir=FLAGS.root_output_dir,
      experiment_name=name, seed=FLAGS.seed, executor=FLAGS.executor,
      max_concurrent_clients=FLAGS.max_concurrent_clients,
      workers=tuple(FLAGS.workers), worker_timeout_s=FLAGS.worker_timeout_s,
      checkpoint_every=FLAGS.checkpoint_every, cache_dir=FLAGS.cache_dir,
      progress=FLAGS.progress)


def _format_summary(summary) -> str:
  lines = ['', f'== {summary["experiment"]} ==']
  if 'final_objective' in summary:  # Synthetic problems have no accuracy.
    lines.append(f'final objective ({summary["objective_name"]}): '
                 f'{summary["final_objective"]:.6g}')
  else:
    lines.append(
        f'final eval accuracy: {summary["final_eval_accuracy"]:.4f}')
  epsilon = summary['epsilon']
  if summary['noise_multiplier'] is None:
    lines.append('privacy: none (no noise; epsilon = inf)')
  else:
    lines.append(
        f'privacy: epsilon = {epsilon:.4g} at delta = {summary["delta"]:g} '
        f'(z = {summary["noise_multiplier"]:.4g}, '
        f'{summary["clients_per_round"]} of {summary["population_size"]} '
        f'clients per round, {summary["sampling"]} sampling, '
        f'{summary["rounds"]} rounds)')
    ext = summary.get('extrapolated')
    if ext:
      lines.append(
          f'  A population of {summary["population_size"]} is far too small '
          'for a meaningful guarantee. The same noise on the average '
          f'(z/n fixed) with {ext["clients_per_round"]:,} of '
          f'{ext["population_size"]:,} clients per round would give epsilon '
          f'= {ext["epsilon"]:.4g} (z = {ext["noise_multiplier"]:.4g}).')
  return '\n'.join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # TF/TFF info logs hide the bar.
  config = config_from_flags()
  try:
    training.validate(config)
  except training.ConfigError as e:
    raise app.UsageError(str(e)) from None
  try:
    summary = training.run(config)
  except training.ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(_format_summary(summary))
  print(f'outputs: {config.output_dir}/ (metrics.csv, ledger.json, plot.png, '
        'tensorboard/, checkpoints/)')
  return 0


if __name__ == '__main__':
  app.run(main)
