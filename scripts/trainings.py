"""Trainings of a benchmark, one after another or side by side.

`run_all` runs a list of `TrainConfig`s through the training program: in
this process (one job: later trainings take the first one's traced graphs),
or `jobs` at a time, each in its own process, so that N jobs keep N cores
busy. The benchmarks that run grids of seeds share it
(`scripts.benchmark_frontier`, `scripts.benchmark_calibration`,
`scripts.benchmark_correlated`).
"""

import concurrent.futures
import ctypes
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


def run_all(configs, jobs: int, label: str) -> list:
  """Runs `configs` (`jobs` at a time); returns (accuracy, epsilon) each."""
  if jobs == 1 or len(configs) <= 1:
    results = []
    for i, config in enumerate(configs, 1):
      results.append(train(config))
      print(f'[{label} {i}/{len(configs)}] {config.experiment_name}: '
            f'{results[-1][0]:.4f}', flush=True)
    return results
  context = multiprocessing.get_context('spawn')
  # One process a training: N jobs keep N cores busy (no more processes
  # than trainings).
  workers = min(jobs, len(configs))
  with concurrent.futures.ProcessPoolExecutor(
      workers, mp_context=context, initializer=tie_to_parent) as pool:
    futures = [pool.submit(train, config) for config in configs]
    try:
      for i, (config, future) in enumerate(zip(configs, futures), 1):
        print(f'[{label} {i}/{len(configs)}] {config.experiment_name}: '
              f'{future.result()[0]:.4f}', flush=True)
    except KeyboardInterrupt:
      # Stop now, not after the queued runs: a rerun resumes every run.
      pool.shutdown(wait=False, cancel_futures=True)
      for process in multiprocessing.active_children():
        process.terminate()
      raise
    return [future.result() for future in futures]
