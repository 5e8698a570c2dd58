"""Trainings of a benchmark, one after another or side by side.

`run_all` runs a list of `TrainConfig`s through the training program: in
this process (one job: later trainings take the first one's traced graphs),
or `jobs` at a time, each in its own process, so that N jobs keep N cores
busy. Trainings of one group (one method at one epsilon: the same DP
events) run one after another in one worker, which computes their rounds'
epsilons once. The benchmarks that run grids of seeds share it
(`scripts.benchmark_frontier`, `scripts.benchmark_calibration`,
`scripts.benchmark_correlated`).
"""

import concurrent.futures
import ctypes
import itertools
import multiprocessing
import os
import signal

from scripts import program


def cores() -> int:
  """The cores this process may run on (the benchmarks' default --jobs)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return os.cpu_count() or 1


def train(config):
  """One run in a worker process: (final accuracy, epsilon)."""
  summary = program.run(config, quiet=True)
  return summary['final_eval_accuracy'], summary['epsilon']


def train_group(configs, train_fn=train):
  """A group's runs in one worker process, one after another."""
  return [train_fn(config) for config in configs]


def _groups(configs, groups):
  """[(first index, configs), ...]: consecutive configs of one key."""
  runs = itertools.groupby(enumerate(zip(configs, groups)),
                           key=lambda item: item[1][1])
  return [(members[0][0], [config for _, (config, _) in members])
          for members in (list(run) for _, run in runs)]


def tie_to_parent():
  """Pool workers stop when this process dies (PR_SET_PDEATHSIG), and leave
  a Ctrl-C to it (`run_all` stops them).

  Without the first a killed benchmark leaves its workers training on, and a
  rerun starts the same runs beside them (which the run lock then refuses);
  without the second, the terminal's Ctrl-C, sent to them too, prints a
  traceback from every idle worker.
  """
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)
  except OSError:
    pass


def run_all(configs, jobs: int, label: str, groups=None,
            train_fn=train) -> list:
  """Runs `configs` (`jobs` at a time); returns (accuracy, epsilon) each.

  `groups`: a key per config (None: each its own); consecutive configs of
  one key run one after another in one worker process. `train_fn(config)`:
  one run's result (a module-level function: workers import it).
  """
  def report(i, config, result):
    accuracy = 'withheld' if result[0] is None else f'{result[0]:.4f}'
    print(f'[{label} {i}/{len(configs)}] {config.experiment_name}: '
          f'{accuracy}', flush=True)

  if jobs == 1 or len(configs) <= 1:
    results = []
    for i, config in enumerate(configs, 1):
      results.append(train_fn(config))
      report(i, config, results[-1])
    return results
  chunks = _groups(configs, range(len(configs)) if groups is None
                   else groups)
  context = multiprocessing.get_context('spawn')
  # N jobs keep N cores busy (no more processes than groups).
  workers = min(jobs, len(chunks))
  with concurrent.futures.ProcessPoolExecutor(
      workers, mp_context=context, initializer=tie_to_parent) as pool:
    futures = [pool.submit(train_group, members, train_fn)
               for _, members in chunks]
    results = []
    try:
      for (first, members), future in zip(chunks, futures):
        for i, (config, result) in enumerate(
            zip(members, future.result()), first + 1):
          report(i, config, result)
          results.append(result)
    except KeyboardInterrupt:
      # Stop now, not after the queued runs: a rerun resumes every run.
      pool.shutdown(wait=False, cancel_futures=True)
      for process in multiprocessing.active_children():
        process.terminate()
      raise
    return results
