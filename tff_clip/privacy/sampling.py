"""Client sampling, seeded per round so a resumed run draws the same cohorts.

Two schemes, named as in `tff_clip.privacy.accounting`, which accounts each:
  * 'fixed_size': `clients_per_round` distinct clients, uniformly without
    replacement (replace-one adjacency);
  * 'poisson': every client independently with probability
    q = clients_per_round / population (add/remove-one adjacency); the cohort
    size varies and may be zero;
  * 'min_separation': every client belongs to one of b groups, a seeded hash
    of (seed, client id), and round t takes part of group t mod b (at most
    `clients_per_round` of its members, a seeded sample): a client takes
    part at most k = ceil(T / b) times in T rounds, at least b rounds apart.
    Every group must hold at least `clients_per_round` clients: the mean
    divides by `clients_per_round`, and a smaller cohort would shrink every
    update without a word, so such a sampler is refused.
    No amplification is claimed; the privacy comes from correlated noise
    (`tff_clip.aggregation.correlated_noise`) or from composing k participations.

    What a deployment must enforce for that guarantee: a client's group is
    fixed for the whole run (by its identity, not by when it checks in), a
    client never contributes in a round of another group, and never twice in
    one cycle of b rounds -- on devices that is a server-side rule keyed by
    a stable user identifier, with users holding several devices counted
    once. The separation b must be at least the number of bands of the noise.

The cohort of round r depends only on (seed, r) and the set of client ids
(not their order: they are sorted first): no sampler state needs a
checkpoint, and resuming at round r reproduces the uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import hashlib

from tff_clip import checks
from tff_clip.names import FIXED_SIZE, MIN_SEPARATION, POISSON, SAMPLINGS

__all__ = ['FIXED_SIZE', 'MIN_SEPARATION', 'POISSON', 'SAMPLINGS',
           'ClientSampler', 'separation_group']


def separation_group(client_id: str, separation: int, seed: int) -> int:
  """The group (0..separation-1) of a client: a hash of (seed, id), so a
  client's group does not depend on who else is in the population."""
  digest = hashlib.blake2b(f'{int(seed)}:{client_id}'.encode(),
                           digest_size=8).digest()
  return int.from_bytes(digest, 'little') % int(separation)


class ClientSampler:
  """Draws each round's cohort from `client_ids`."""

  def __init__(self, client_ids: Sequence[str], clients_per_round: int,
               sampling: str = FIXED_SIZE, seed: int = 0,
               separation: int = 1):
    # Sorted: the cohort must not depend on the order the task lists them.
    self._client_ids = sorted(client_ids)
    if not self._client_ids:
      raise ValueError('`client_ids` is empty: there is no client to sample.')
    checks.one_of(sampling, 'sampling', SAMPLINGS)
    checks.integer(clients_per_round, 'clients_per_round', minimum=1)
    if clients_per_round > len(self._client_ids):
      raise ValueError(
          f'`clients_per_round` ({clients_per_round}) exceeds the number of '
          f'clients ({len(self._client_ids)}).')
    checks.integer(separation, 'separation', minimum=1)
    self.clients_per_round = int(clients_per_round)
    self.sampling = sampling
    self.seed = int(seed)
    self.separation = int(separation)
    self._groups = None
    if sampling == MIN_SEPARATION and self.separation > len(self._client_ids):
      # Said before the groups are made (2^31 of them would take minutes).
      raise ValueError(
          f'`clients_per_round` ({self.clients_per_round}) exceeds the '
          'smallest minimum-separation group: the separation '
          f'({self.separation}) exceeds the {len(self._client_ids)} clients, '
          'so some of its groups are empty. Use a separation of at most '
          f'{len(self._client_ids) // self.clients_per_round}.')
    if sampling == MIN_SEPARATION:
      self._groups = [[] for _ in range(self.separation)]
      for i, client_id in enumerate(self._client_ids):
        self._groups[separation_group(client_id, self.separation,
                                      self.seed)].append(i)
      sizes = [len(group) for group in self._groups]
      if min(sizes) < self.clients_per_round:
        raise ValueError(
            f'`clients_per_round` ({self.clients_per_round}) exceeds the '
            f'smallest minimum-separation group: the {len(self._client_ids)}'
            f' clients fall into {self.separation} groups of {min(sizes)} to '
            f'{max(sizes)}, and a round samples one group, so its mean would '
            f'be divided by more clients than take part. Use at most '
            f'{min(sizes)} clients per round (or a smaller separation).')

  @property
  def population_size(self) -> int:
    return len(self._client_ids)

  @property
  def sampling_probability(self) -> float:
    return self.clients_per_round / self.population_size

  def sample(self, round_num: int) -> list[str]:
    """The cohort of round `round_num` (a pure function of seed and round)."""
    rng = np.random.default_rng([self.seed, int(round_num)])
    if self.sampling == MIN_SEPARATION:
      group = self._groups[int(round_num) % self.separation]
      chosen = np.asarray(group, np.int64)
      if len(group) > self.clients_per_round:
        chosen = np.sort(rng.choice(chosen, self.clients_per_round,
                                    replace=False))
    elif self.sampling == FIXED_SIZE:
      chosen = rng.choice(self.population_size, self.clients_per_round,
                          replace=False)
      chosen.sort()
    else:
      chosen = np.flatnonzero(
          rng.random(self.population_size) < self.sampling_probability)
    return [self._client_ids[i] for i in chosen]
