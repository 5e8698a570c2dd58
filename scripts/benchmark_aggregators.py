r"""Benchmark: one aggregation round through each bounding factory vs TFF's.

Aggregation alone (no training): `--clients` client updates of about
`--params` float32 parameters split into `--leaves` leaves, through every
factory of `tff_clip.aggregation.aggregators`, `tff.aggregators.UnweightedMeanFactory` and
`tff.aggregators.clipping_factory`, in one process on TFF's C++ runtime.

Timing protocol (the same factory timed twice differs by up to 20% here
otherwise): the factories run interleaved, A B C ... then rotated (B C ... A),
for `--repetitions` rounds, and the table shows medians. The ratio column is
against `tff.aggregators.clipping_factory` at the same leaf count.

  .venv/bin/python -m scripts.benchmark_aggregators            # full table
  .venv/bin/python -m scripts.benchmark_aggregators --clients=10 \
      --params=100000 --repetitions=3                          # quick look
"""

import collections
import statistics
import time

from absl import flags
import numpy as np
import tensorflow_federated as tff

from scripts import cli
from tff_clip.aggregation import aggregators
from tff_clip.runtime import execution

_CLIENTS = flags.DEFINE_integer('clients', 100, 'Client updates per round.')
_PARAMS = flags.DEFINE_integer('params', 1_000_000, 'Parameters per update.')
_LEAVES = flags.DEFINE_list('leaves', ['10', '200'], 'Leaf counts to try.')
_REPS = flags.DEFINE_integer('repetitions', 5, 'Interleaved repetitions.')
_CLIP = flags.DEFINE_float('clip_norm', 1.0, 'Clip norm for every factory.')


def factories(clip_norm):
  return collections.OrderedDict([
      ('tff UnweightedMeanFactory', tff.aggregators.UnweightedMeanFactory()),
      ('tff clipping_factory', tff.aggregators.clipping_factory(
          clip_norm, tff.aggregators.UnweightedMeanFactory())),
      ('clip_factory', aggregators.clip_factory(clip_norm)),
      ('normalize_factory', aggregators.normalize_factory(clip_norm)),
      ('per_layer_clip_factory', aggregators.per_layer_clip_factory(
          clip_norm, 'dim')),
      ('per_layer_normalize_factory', aggregators.per_layer_normalize_factory(
          clip_norm, 'dim')),
  ])


def make_updates(num_clients, num_params, num_leaves, seed=0):
  sizes = [num_params // num_leaves] * num_leaves
  sizes[0] += num_params - sum(sizes)
  rng = np.random.default_rng(seed)
  return [[rng.standard_normal(size, dtype=np.float32) for size in sizes]
          for _ in range(num_clients)], sizes


def run(num_leaves):
  updates, sizes = make_updates(_CLIENTS.value, _PARAMS.value, num_leaves)
  value_type = tff.types.StructWithPythonType(
      [tff.types.TensorType(np.float32, [s]) for s in sizes], list)
  processes = collections.OrderedDict()
  for name, factory in factories(_CLIP.value).items():
    process = factory.create(value_type)
    state = process.initialize()
    process.next(state, updates[:2])  # Warm up (first call compiles).
    processes[name] = (process, state)
  names = list(processes)
  times = collections.defaultdict(list)
  for rep in range(_REPS.value):
    order = names[rep % len(names):] + names[:rep % len(names)]
    for name in order:
      process, state = processes[name]
      start = time.perf_counter()
      process.next(state, updates)
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def main(argv):
  del argv
  execution.set_local_cpp_context()
  print(f'{_CLIENTS.value} clients x {_PARAMS.value:,} float32 parameters, '
        f'median of {_REPS.value} interleaved repetitions')
  rows = []
  for leaves in [int(x) for x in _LEAVES.value]:
    medians = run(leaves)
    base = medians['tff clipping_factory']
    for name, seconds in medians.items():
      rows.append((leaves, name, seconds, seconds / base))
  print()
  print('| leaves | factory | median s | vs tff clipping_factory |')
  print('|---:|---|---:|---:|')
  for leaves, name, seconds, ratio in rows:
    print(f'| {leaves} | {name} | {seconds:.2f} | {ratio:.2f}x |')


if __name__ == '__main__':
  cli.run(main)
