"""What a run is checked for before anything of it is built.

`resolve_noise_multiplier`: the noise multiplier a configuration runs with,
given or calibrated from its target epsilon (calibration is cached: the
program's early check and the session share one); `check_noise_memory`: a
noise mechanism whose state cannot fit in this machine's memory refused in
one line, before anything allocates it. No TensorFlow is imported.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from tff_clip.names import MIN_SEPARATION
from tff_clip.privacy import accounting
from tff_clip.program.config import ConfigError, TrainConfig

__all__ = [
    'STATE_COPIES_AT_PEAK', 'available_memory', 'check_noise_memory',
    'resolve_noise_multiplier',
]

# Peak memory of a DP round in bytes per byte of the noise mechanism's state:
# the state (numpy), its copy fed to the server update, the update's
# temporaries, the new state and its numpy copy, the checkpoint's writes
# (measured 5.5-6.6 on the Stack Overflow LSTM with banded noise:
# `scripts.benchmark_stackoverflow`).
STATE_COPIES_AT_PEAK = 7


# What calibration never reads: where and how often a run writes, which data
# and initial weights it trains from (the population is an argument). Runs
# that differ only in these (a sweep's or the frontier's seeds) share one.
_NOT_CALIBRATED_FROM = (
    'seed', 'experiment_name', 'root_output_dir', 'eval_every', 'eval_split',
    'progress', 'checkpoint_every', 'checkpoint_interval_s',
    'release_uncovered_metrics', 'partition', 'partition_alpha',
    'validation_fraction', 'cache_dir', 'max_concurrent_clients')


def resolve_noise_multiplier(config: TrainConfig, population: int):
  """z from the flags: given, calibrated from `target_epsilon`, or None."""
  config = dataclasses.replace(config, **{
      field.name: field.default for field in dataclasses.fields(TrainConfig)
      if field.name in _NOT_CALIBRATED_FROM})
  try:
    hash(config)
  except TypeError:  # An unhashable field value: calibrate afresh.
    return _resolve_noise_multiplier.__wrapped__(config, population)
  return _resolve_noise_multiplier(config, population)


# Calibration takes seconds: the program's early check and the session
# share one (a pure function of the configuration and the population).
@functools.lru_cache(maxsize=16)
def _resolve_noise_multiplier(config: TrainConfig, population: int):
  if config.clients_per_round > population:
    raise ConfigError(
        f'--clients_per_round ({config.clients_per_round}) exceeds the '
        f'number of training clients ({population}).')
  if config.target_epsilon is None:
    return config.noise_multiplier
  try:
    if config.sampling == MIN_SEPARATION:
      # The total z; with adaptive clipping the ledger's event (value noise
      # / its sensitivity, plus the count noise) is then at most as large.
      return accounting.calibrate_mechanism_noise_multiplier(
          config.target_epsilon, config.noise, config.delta)
    return accounting.calibrate_noise_multiplier(
        config.target_epsilon, clients_per_round=config.clients_per_round,
        population_size=population, rounds=config.rounds, delta=config.delta,
        sampling=config.sampling)
  except ValueError as e:
    raise ConfigError(f'--target_epsilon: {e}') from e


def available_memory() -> Optional[int]:
  """Bytes this machine can give a process now (MemAvailable of
  /proc/meminfo), or None where that is not known."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def check_noise_memory(config: TrainConfig, parameters: int,
                       available=None) -> None:
  """Refuses (`ConfigError`, one line) a noise mechanism whose state of
  model-sized vectors cannot fit in memory, before anything allocates it.

  `parameters`: the model's trainable parameters (one noise vector);
  `available`: bytes free, `available_memory()` when None (not checked
  where that is not known).
  """
  vectors = config.noise.state_vectors
  if not vectors:
    return
  available = available_memory() if available is None else available
  state = vectors * parameters * 4  # float32 noise.
  need = STATE_COPIES_AT_PEAK * state
  if available is None or need <= available:
    return
  gib = lambda value: f'{value / 2**30:.1f} GiB'
  fewer = config.noise.smaller_state_flags
  raise ConfigError(
      f'--noise_mechanism={config.noise_mechanism}: its state holds '
      f'{vectors} noise vectors of {parameters:,} parameters '
      f'({gib(state)}); a DP round holds about {STATE_COPIES_AT_PEAK} '
      f'copies of it, so it needs about {gib(need)}, and this machine has '
      f'{gib(available)} available. Use fewer {fewer} or a smaller model.')
