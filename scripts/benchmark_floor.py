r"""A frontier training against its plain-TensorFlow floor, side by side.

  .venv/bin/python -m scripts.benchmark_floor
  .venv/bin/python -m scripts.benchmark_floor --quick    # 2 rounds, once

Runs, interleaved (one of each in turn, `--repeats` times, so that the load
of a shared machine hits all alike), and prints the median seconds of each
and its ratio to the floor:

  floor       plain TensorFlow doing a frontier training's arithmetic
              (`--setting=mnist1000`: 50 clients a round, one local SGD step
              of batch 8 on a 784x10 logistic regression, each update
              clipped to norm 1, summed, Gaussian noise added, a server
              SGD-momentum step), `--rounds` rounds, one `tf.function` call
              per round over the cohort's [50, 8, 784] examples; the
              population's examples (1,000 clients of 60) are random
              tensors built once, before the clock starts.
  batched     one training of `scripts.benchmark_frontier`'s timed cell
              (`scripts.benchmark_round.FRONTIER_CELL`) in this process,
              `--client_execution=batched` (everything of the run: session
              build, rounds, checkpoints, releases, final evaluation)
  batched, another cell
              the same at another server learning rate and target quantile
              (a tuning grid's next cell: the traced process with this
              run's own state, `hyperparameters.Rebased`)
  batched, every round
              the frontier cell checkpointed (and released) every round,
              as a DP run of `scripts.train` is by default; the frontier's
              trainings checkpoint every
              `scripts.benchmark_settings.GRID_CHECKPOINT_EVERY` rounds
  per_client  the same training, `--client_execution=per_client`

Every training is timed warm (one untimed training of each path first,
and one of a grid cell with a given quantile, as a frontier worker runs
its trainings after its first ones, and a
training at each repeat's seed: the rows of a repeat share it,
as a tuning grid's cells do), in
alternating order, with the graph cache in a fresh temporary directory
(empty at the start, as in a fresh clone; a frontier worker's later
trainings then take its loaded runner and the cohort call traced by the
first, `tff_clip.runtime.batched_clients`). Then (not with `--quick`) the README main command
(`scripts.train --flagfile=scripts/flags/digits_demo.cfg`, a fresh
process) against `python -c "import tensorflow, tensorflow_federated"`,
both warm (each run once first, untimed), median of `--repeats`.
"""

import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags

from scripts import cli

_ROUNDS = flags.DEFINE_integer('rounds', 100, 'Rounds of every training.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Runs of each, interleaved.')
_QUICK = flags.DEFINE_bool('quick', False,
                           'CI-sized: 2 rounds, once, no README command.')

CLIENTS, POPULATION, EXAMPLES, BATCH = 50, 1000, 60, 8
FEATURES, CLASSES = 784, 10


def floor_seconds(rounds: int, seed: int = 0) -> float:
  """Seconds of `rounds` floor rounds (module docstring)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  x_all = rng.random((POPULATION * EXAMPLES, FEATURES), np.float32)
  y_all = rng.integers(0, CLASSES, POPULATION * EXAMPLES).astype(np.int32)
  x_all, y_all = tf.constant(x_all), tf.constant(y_all)
  weights = [tf.Variable(tf.zeros([FEATURES, CLASSES])),
             tf.Variable(tf.zeros([CLASSES]))]
  momentum = [tf.Variable(tf.zeros_like(w)) for w in weights]
  noise = tf.random.Generator.from_seed(seed)

  @tf.function
  def one_round(rows):  # rows: [C, B] example indices.
    x, y = tf.gather(x_all, rows), tf.gather(y_all, rows)
    kernel = tf.tile(weights[0][tf.newaxis], [CLIENTS, 1, 1])
    bias = tf.tile(weights[1][tf.newaxis], [CLIENTS, 1])
    with tf.GradientTape() as tape:
      tape.watch([kernel, bias])
      logits = tf.einsum('cbi,cio->cbo', x, kernel) + bias[:, tf.newaxis]
      loss = tf.reduce_sum(tf.reduce_mean(
          tf.keras.losses.sparse_categorical_crossentropy(
              y, logits, from_logits=True), axis=1))
    grads = tape.gradient(loss, [kernel, bias])
    deltas = [0.1 * g for g in grads]  # One local step: w - (w - lr g).
    norms = tf.sqrt(tf.reduce_sum(tf.square(deltas[0]), [1, 2]) +
                    tf.reduce_sum(tf.square(deltas[1]), 1))
    scale = tf.minimum(1.0, 1.0 / tf.maximum(norms, 1e-12))
    total = [tf.reduce_sum(deltas[0] * scale[:, None, None], 0),
             tf.reduce_sum(deltas[1] * scale[:, None], 0)]
    for w, m, t in zip(weights, momentum, total):
      update = (t + noise.normal(t.shape)) / CLIENTS
      m.assign(0.9 * m + update)
      w.assign_sub(m)

  def cohort_rows():
    clients = rng.choice(POPULATION, CLIENTS, replace=False)
    starts = clients * EXAMPLES
    return tf.constant(starts[:, None] + np.stack(
        [rng.permutation(EXAMPLES)[:BATCH] for _ in clients]))

  one_round(cohort_rows())  # Traced before the clock, as a floor.
  start = time.perf_counter()
  for _ in range(rounds):
    one_round(cohort_rows())
  weights[0].numpy()
  return time.perf_counter() - start


def training_seconds(path: str, rounds: int, seed: int, **cell) -> float:
  """Seconds of one frontier training on `path` (module docstring). (Its
  DP records are bounded as tensor ops over the cohort in a run of any
  length: `client_execution.VECTORIZED_RECORDS_FROM` concerns TFF's
  queries only.)"""
  # `scripts.benchmark_frontier.make_config` of its timed cell
  # (`scripts.benchmark_round.FRONTIER_CELL`: mnist1000, the default method
  # at epsilon 4), built here: those modules define flags of this one's names.
  from scripts import benchmark_settings  # pylint: disable=g-import-not-at-top
  from scripts import program  # pylint: disable=g-import-not-at-top
  from tff_clip.program import config as config_lib  # pylint: disable=g-import-not-at-top
  root = tempfile.mkdtemp(prefix='benchmark_floor_')
  fields = dict(benchmark_settings.FRONTIER['mnist1000'], eval_every=10**6,
                progress=False, plot=False, seed=seed, root_output_dir=root,
                checkpoint_every=benchmark_settings.GRID_CHECKPOINT_EVERY,
                eval_split='test', target_epsilon=4.0, noise_multiplier=None,
                client_execution=path, rounds=rounds)
  fields.update(cell)
  config = config_lib.TrainConfig(experiment_name=f'default_eps4_seed{seed}',
                                  **fields)
  program.validate(config)
  start = time.perf_counter()
  program.run(config, quiet=True)
  return time.perf_counter() - start


def _command_seconds(args) -> float:
  start = time.perf_counter()
  subprocess.run(args, check=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
  return time.perf_counter() - start


def readme_seconds(repeats: int) -> dict:
  """Median seconds of the README main command and of importing TF + TFF."""
  root = tempfile.mkdtemp(prefix='benchmark_floor_readme_')
  imports = [sys.executable, '-c', 'import tensorflow, tensorflow_federated']
  times = {'import TF + TFF': [], 'README main command': []}
  for i in range(repeats + 1):  # The first of each warms the caches.
    a = _command_seconds(imports)
    b = _command_seconds([
        sys.executable, '-m', 'scripts.train',
        '--flagfile=scripts/flags/digits_demo.cfg',
        f'--root_output_dir={root}/{i}', '--progress=false'])
    if i:
      times['import TF + TFF'].append(a)
      times['README main command'].append(b)
  return {k: statistics.median(v) for k, v in times.items()}


def main(argv):
  if len(argv) > 1:
    return cli.fail(f'unexpected arguments: {argv[1:]}')
  if _ROUNDS.value < 1:
    return cli.fail(f'--rounds must be positive; got {_ROUNDS.value}.')
  if _REPEATS.value < 1:
    return cli.fail(f'--repeats must be positive; got {_REPEATS.value}.')
  rounds, repeats = _ROUNDS.value, _REPEATS.value
  if _QUICK.value:
    rounds, repeats = 2, 1
  os.environ['TFF_CLIP_GRAPH_CACHE'] = tempfile.mkdtemp(
      prefix='benchmark_floor_graphs_')
  # Warm, as a frontier worker's trainings after its first: one training of
  # each path first, untimed (imports, Keras, first traces, and the noise
  # calibrated for these rounds, which a worker's later trainings find in
  # the calibration cache).
  for path in ('batched', 'per_client'):
    training_seconds(path, rounds, 99)
  # And a grid cell of a given quantile (its own graphs' shape,
  # `hyperparameters.shape`): the timed other cell is then a grid's next.
  training_seconds('batched', rounds, 99, server_learning_rate=0.25,
                   target_quantile=0.7)
  trainings = {
      'batched': lambda seed: training_seconds('batched', rounds, seed),
      'batched, another cell': lambda seed: training_seconds(
          'batched', rounds, seed, server_learning_rate=0.5,
          target_quantile=0.3),
      'batched, every round': lambda seed: training_seconds(
          'batched', rounds, seed, checkpoint_every=1),
      'per_client': lambda seed: training_seconds('per_client', rounds, seed),
  }
  runs = {'floor': [], **{name: [] for name in trainings}}
  for repeat in range(repeats):
    # The repeat's seed once, untimed: its task, partition and population
    # are built for the first training at a seed (~0.6 s, measured), and its
    # initial weights drawn (which clears TensorFlow's kernel caches, so the
    # next call of each traced function instantiates it again, ~0.3 s),
    # both of which would otherwise fall on whichever row runs first. A
    # whole training, as a tuning grid's previous cell at the seed was.
    training_seconds('batched', rounds, repeat)
    runs['floor'].append(floor_seconds(rounds, repeat))
    names = list(trainings)
    for name in names if repeat % 2 == 0 else names[::-1]:
      runs[name].append(trainings[name](repeat))
      if name == 'per_client':
        # The per-client training's process and data displace the batched
        # ones this process keeps (a frontier worker never alternates):
        # taken back untimed before the next row.
        training_seconds('batched', 1, repeat)
    print(f'[{repeat + 1}/{repeats}] ' + ', '.join(
        f'{k} {v[-1]:.2f} s' for k, v in runs.items()), flush=True)
  floor = statistics.median(runs['floor'])
  print(f'\n{rounds} rounds of the mnist1000 frontier training '
        f'(median of {repeats}):')
  print(f'{"":<24} {"seconds":>8} {"x floor":>8}')
  for name, values in runs.items():
    median = statistics.median(values)
    print(f'{name:<24} {median:8.2f} {median / floor:8.1f}')
  if not _QUICK.value:
    times = readme_seconds(repeats)
    base = times['import TF + TFF']
    print('\nWarm, median of', repeats)
    for name, seconds in times.items():
      print(f'{name:<20} {seconds:6.2f} s {seconds / base:5.2f}x')
  return 0


if __name__ == '__main__':
  cli.run(main)
