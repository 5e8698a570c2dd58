"""Client sampling, seeded per round so a resumed run draws the same cohorts.

Two schemes, named as in `tff_clip.accounting`, which accounts each:
  * 'fixed_size': `clients_per_round` distinct clients, uniformly without
    replacement (replace-one adjacency);
  * 'poisson': every client independently with probability
    q = clients_per_round / population (add/remove-one adjacency); the cohort
    size varies and may be zero.

The cohort of round r depends only on (seed, r): no sampler state needs a
checkpoint, and resuming at round r reproduces the uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tff_clip.names import FIXED_SIZE, POISSON, SAMPLINGS

__all__ = ['FIXED_SIZE', 'POISSON', 'SAMPLINGS', 'ClientSampler']


class ClientSampler:
  """Draws each round's cohort from `client_ids`."""

  def __init__(self, client_ids: Sequence[str], clients_per_round: int,
               sampling: str = FIXED_SIZE, seed: int = 0):
    self._client_ids = list(client_ids)
    if not self._client_ids:
      raise ValueError('`client_ids` is empty: there is no client to sample.')
    if sampling not in SAMPLINGS:
      raise ValueError(f'`sampling` must be one of {SAMPLINGS}; got '
                       f'{sampling!r}.')
    if (isinstance(clients_per_round, bool) or
        not isinstance(clients_per_round, (int, np.integer)) or
        clients_per_round <= 0):
      raise ValueError('`clients_per_round` must be a positive int; got '
                       f'{clients_per_round!r}.')
    if clients_per_round > len(self._client_ids):
      raise ValueError(
          f'`clients_per_round` ({clients_per_round}) exceeds the number of '
          f'clients ({len(self._client_ids)}).')
    self.clients_per_round = int(clients_per_round)
    self.sampling = sampling
    self.seed = int(seed)

  @property
  def population_size(self) -> int:
    return len(self._client_ids)

  @property
  def sampling_probability(self) -> float:
    return self.clients_per_round / self.population_size

  def sample(self, round_num: int) -> list[str]:
    """The cohort of round `round_num` (a pure function of seed and round)."""
    rng = np.random.default_rng([self.seed, int(round_num)])
    if self.sampling == FIXED_SIZE:
      chosen = rng.choice(self.population_size, self.clients_per_round,
                          replace=False)
      chosen.sort()
    else:
      chosen = np.flatnonzero(
          rng.random(self.population_size) < self.sampling_probability)
    return [self._client_ids[i] for i in chosen]
