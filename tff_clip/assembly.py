"""Assembling a run's parts from its configuration (`TrainConfig`).

Everything a `TrainConfig` decides about what runs is read here, once: the
noise multiplier (given, or calibrated from `target_epsilon` by
`tff_clip.accounting`).

Importing this module imports no TensorFlow.
"""

from __future__ import annotations

import functools

from tff_clip import accounting
from tff_clip.config import ConfigError, TrainConfig
from tff_clip.names import MIN_SEPARATION

__all__ = ['resolve_noise_multiplier']


def resolve_noise_multiplier(config: TrainConfig, population: int):
  """z from the flags: given, calibrated from `target_epsilon`, or None."""
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
      return accounting.calibrate_correlated_noise_multiplier(
          config.target_epsilon, config.noise_mechanism, config.bands,
          config.rounds, config.separation, config.delta)
    return accounting.calibrate_noise_multiplier(
        config.target_epsilon, clients_per_round=config.clients_per_round,
        population_size=population, rounds=config.rounds, delta=config.delta,
        sampling=config.sampling)
  except ValueError as e:
    raise ConfigError(f'--target_epsilon: {e}') from e
