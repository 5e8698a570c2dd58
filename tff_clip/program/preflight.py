"""What a run is checked for before anything of it is built.

`resolve_noise_multiplier`: the noise multiplier a configuration runs with,
given or calibrated from its target epsilon (calibration is cached: the
program's early check and the session share one, later processes read it
from disk once the accountant has checked it); `check_noise_memory`: a
noise mechanism whose state cannot fit in this machine's memory refused in
one line, before anything allocates it. No TensorFlow is imported.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

from tff_clip.names import MIN_SEPARATION
from tff_clip.privacy import accounting
from tff_clip.privacy import sampling
from tff_clip.program import calibration_cache
from tff_clip.program.config import ConfigError, TrainConfig

__all__ = [
    'FLOAT32_MARGIN', 'STATE_COPIES_AT_PEAK', 'available_memory',
    'calibrate_with', 'check_noise_memory', 'resolve_noise_multiplier',
    'with_population',
]

# Peak memory of a DP round in bytes per byte of the noise mechanism's state:
# the state (numpy), its copy fed to the server update, the update's
# temporaries, the new state and its numpy copy, the checkpoint's writes
# (measured 5.5-6.6 on the Stack Overflow LSTM with banded noise:
# `scripts.benchmark_stackoverflow`).
STATE_COPIES_AT_PEAK = 7


def with_population(config: TrainConfig, population: int) -> TrainConfig:
  """`config` with --clients_per_round resolved for `population` training
  clients: under --sampling=min_separation without it, the smallest of the
  b equal groups (`sampling.group_sizes`), so that every client of a
  round's group trains; else as given. At least 1: a population smaller
  than b is then refused by the sampler, naming its empty groups."""
  if config.clients_per_round is not None:
    return config
  smallest, _ = sampling.group_sizes(population, config.separation)
  return dataclasses.replace(config, clients_per_round=max(smallest, 1))


def resolve_noise_multiplier(config: TrainConfig, population: int):
  """z from the flags: given, calibrated from `target_epsilon`, or None.

  Calibration is a function of its accounting call's arguments only (not of
  the seed, the learning rates or where the run writes), so the runs of a
  sweep or of the frontier's grid that share them share one calibration:
  in this process, and across processes through
  `tff_clip.program.calibration_cache` (checked by the accountant on use).
  """
  if config.clients_per_round > population:
    raise ConfigError(
        f'--clients_per_round ({config.clients_per_round}) exceeds the '
        f'number of training clients ({population}).')
  if config.target_epsilon is None:
    return config.noise_multiplier
  name, arguments = _calibration(config, population)
  key = name, json.dumps(arguments, sort_keys=True, default=repr)
  if key not in _CALIBRATED:
    try:
      _CALIBRATED[key] = _calibrate(name, arguments, config)
    except ValueError as e:
      raise ConfigError(f'--target_epsilon: {e}') from e
  return _CALIBRATED[key]


def calibrate_with(config: TrainConfig, population: int,
                   accountant: str) -> float:
  """z for `config.target_epsilon` by `accountant` ('rdp' or 'pld') instead
  of the one the run reports: what another accountant's calibration would
  have spent (`scripts.benchmark_calibration` runs both). Cached and
  checked on use as a run's own calibration."""
  name, arguments = _calibration(config, population)
  arguments = dict(arguments, accountant=accountant)
  try:
    return _calibrate(name, arguments, config)
  except ValueError as e:
    raise ConfigError(f'--target_epsilon: {e}') from e


# Calibration takes seconds: the program's early check and the session
# share one. (accounting function, JSON of its arguments) -> z.
_CALIBRATED = {}


_MECHANISM = 'calibrate_mechanism_noise_multiplier'
_INDEPENDENT = 'calibrate_noise_multiplier'


def _calibration(config: TrainConfig, population: int):
  """(the accounting function, its arguments but the mechanism's object)."""
  # The accountant the run reports (PLD wherever it applies) calibrates, and
  # is part of the entry's key: an entry of another is never read for it.
  if config.sampling == MIN_SEPARATION:
    # The total z; with adaptive clipping the ledger's event (value noise
    # / its sensitivity, plus the count noise) is then at most as large.
    # The mechanism is a function of the DP parameters and the separation.
    return _MECHANISM, dict(
        target_epsilon=config.target_epsilon, delta=config.delta,
        dp_parameters=config._dp_parameters(),  # pylint: disable=protected-access
        rounds=config.rounds, separation=config.participation_separation,
        accountant=accounting.reporting_accountant(
            config.noise.training_event(1.0)))
  return _INDEPENDENT, dict(
      target_epsilon=config.target_epsilon,
      clients_per_round=config.clients_per_round, population_size=population,
      rounds=config.rounds, delta=config.delta, sampling=config.sampling,
      accountant=accounting.reporting_accountant(accounting.training_event(
          1.0, config.clients_per_round, population, config.rounds,
          config.sampling)))


# The aggregators hold z in float32, and TFF's adaptive one splits it in
# float32 arithmetic: the z a run's events carry can be a few float32 ulps
# (6e-8 each) below the z calibrated, and its epsilon above a target met to
# the last digit (2.00000006 for a target of 2, TFF's adaptive factory).
# Calibrated for a target this much lower, a run's epsilon stays at most the
# target with room for about a hundred ulps, and within 0.002% of it.
FLOAT32_MARGIN = 2.0**-16


def _calibrate(name: str, kwargs, config: TrainConfig) -> float:
  """z calibrated by the accountant the run reports (PLD wherever it applies,
  `accounting.reporting_accountant`): the epsilon the run shows is at most
  the target (`FLOAT32_MARGIN`) and within the calibration's tolerance of
  it."""
  target = kwargs['target_epsilon'] * (1 - FLOAT32_MARGIN)
  delta, accountant = kwargs['delta'], kwargs['accountant']
  if name == _MECHANISM:
    mechanism = config.noise
    calibrate = lambda: accounting.calibrate_mechanism_noise_multiplier(
        target, mechanism, delta, accountant=accountant)
    epsilon_at = lambda z: accounting.compute_epsilon(
        mechanism.training_event(z), delta, accountant).epsilon
  else:
    calibrate = lambda: accounting.calibrate_noise_multiplier(
        **dict(kwargs, target_epsilon=target))
    epsilon_at = lambda z: accounting.compute_training_epsilon(
        z, kwargs['clients_per_round'], kwargs['population_size'],
        kwargs['rounds'], delta, kwargs['sampling'], accountant).epsilon
  return calibration_cache.calibrated(
      name, kwargs, calibrate, epsilon_at, target,
      accounting.MIN_NOISE_MULTIPLIER)


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
