"""Client sampling, seeded per round so a resumed run draws the same cohorts.

Two schemes, named as in `tff_clip.privacy.accounting`, which accounts each:
  * 'fixed_size': `clients_per_round` distinct clients, uniformly without
    replacement (replace-one adjacency);
  * 'poisson': every client independently with probability
    q = clients_per_round / population (add/remove-one adjacency); the cohort
    size varies and may be zero;
  * 'min_separation': every client belongs to one of b groups of equal
    sizes (they differ by at most one: `separation_groups`, a seeded
    permutation of the sorted client ids dealt out to the b groups in
    turn), and round t takes part of group t mod b (at most
    `clients_per_round` of its members, a seeded sample): a client takes
    part at most k = ceil(T / b) times in T rounds, at least b rounds apart.
    Every group must hold at least `clients_per_round` clients: the mean
    divides by `clients_per_round`, and a smaller cohort would shrink every
    update without a word, so such a sampler is refused; the largest cohort
    is the smallest group, floor(population / b) (`group_sizes`).
    No amplification is claimed; the privacy comes from correlated noise
    (`tff_clip.aggregation.correlated_noise`) or from composing k participations.

    What a deployment must enforce for that guarantee: a client's group is
    fixed for the whole run (by its identity, not by when it checks in), a
    client never contributes in a round of another group, and never twice in
    one cycle of b rounds -- on devices that is a server-side rule keyed by
    a stable user identifier, with users holding several devices counted
    once. The separation b must be at least the number of bands of the noise.

The cohort of round r depends only on (seed, r) and the set of client ids
(not their order: they are sorted first), or, for a private run, on
(key, r): amplification by sampling holds only while no one knows who was
sampled, and --seed (0 by default, in config.json) is public, so a DP run
of Poisson or fixed-size sampling draws its cohorts from a secret
`sampling_key` (`new_sampling_key`: OS entropy), kept, like the noise key,
only in its checkpoints, so that resuming at round r reproduces the
uninterrupted run. (Minimum separation claims no amplification: its
groups and cohorts stay seeded.)
(Runs before `GROUP_SCHEME` grouped clients by a hash of (seed, id), in
groups of unequal sizes; a run records its scheme, and one recorded with
the other is not resumed: `tff_clip.program.run_directory`.)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
import hashlib
import json
import secrets
from typing import Optional

import numpy as np

from tff_clip import checks
from tff_clip.names import FIXED_SIZE, MIN_SEPARATION, POISSON, SAMPLINGS

__all__ = ['FIXED_SIZE', 'GROUP_SCHEME', 'MIN_SEPARATION', 'POISSON',
           'SAMPLINGS', 'ClientSampler', 'group_scheme', 'group_sizes',
           'id_set_fingerprint', 'new_sampling_key', 'separation_groups']

# The name a run records for how `separation_groups` assigns clients to
# groups (`run_directory.RESOLVED_KEY`): a resumed run must find its groups
# unchanged.
GROUP_SCHEME = 'equal_permuted'

# Domain separation of the group permutation's stream from the per-round
# streams (`np.random.default_rng([seed, round])`).
_GROUPS_STREAM = 0x67726f757073  # b'groups'
# And the secret cohorts' streams (`np.random.default_rng([_KEYED, key, r])`).
_KEYED_STREAM = 0x6b65796564  # b'keyed'


def new_sampling_key() -> str:
  """A fresh secret sampling key: 128 bits of OS entropy, as hex."""
  return secrets.token_hex(16)


def group_scheme(sampling: str):
  """How `sampling` groups the clients, as a run records it: `GROUP_SCHEME`
  under min_separation, else None (no groups)."""
  return GROUP_SCHEME if sampling == MIN_SEPARATION else None


def id_set_fingerprint(client_ids: Sequence[str]) -> str:
  """SHA-256 (hex) of the set of client ids, as `separation_groups` reads it
  (sorted, as strings): a run under minimum separation records it, and one
  resumed with another set (whose groups would be dealt anew, letting a
  client take part twice within b rounds) is refused."""
  ids = sorted(str(client_id) for client_id in client_ids)
  return hashlib.sha256(json.dumps(ids).encode('utf-8')).hexdigest()


def group_sizes(population_size: int, separation: int) -> tuple[int, int]:
  """(smallest, largest) group of `separation_groups` over
  `population_size` clients: floor(N / b) and ceil(N / b)."""
  population_size = checks.integer(population_size, 'population_size',
                                   minimum=1)
  separation = checks.integer(separation, 'separation', minimum=1)
  return population_size // separation, -(-population_size // separation)


def separation_groups(client_ids: Sequence[str], separation: int,
                      seed: int) -> np.ndarray:
  """The group (0..separation-1) of each client, aligned with `client_ids`.

  The sorted ids are ranked by a seeded permutation and dealt out to the
  groups in turn (rank r to group r mod b): the b groups' sizes differ by
  at most one. A pure function of (seed, set of ids): the order the ids
  are given in does not matter, and a resumed run finds the same groups.
  The permutation sorts 64-bit keys drawn from PCG64 seeded by
  `SeedSequence([_GROUPS_STREAM, seed])` -- a bit generator's raw stream,
  which numpy keeps stable across versions (NEP 19), unlike `Generator`
  methods -- ties broken by the sorted ids. Memory: the ids, their sort
  order and three integer arrays of the population's size (docs/correlated_noise.md
  measures 10^7 ids).
  """
  separation = checks.integer(separation, 'separation', minimum=1)
  ids = [str(client_id) for client_id in client_ids]
  order = sorted(range(len(ids)), key=ids.__getitem__)
  # Sorted by id (ids are distinct): the ranks below are independent of
  # the given order.
  order = np.asarray(order, np.int64)
  keys = np.random.PCG64(np.random.SeedSequence(
      [_GROUPS_STREAM, int(seed)])).random_raw(len(ids))
  ranks = np.empty(len(ids), np.int64)
  ranks[np.argsort(keys, kind='stable')] = np.arange(len(ids))
  groups = np.empty(len(ids), np.int64)
  groups[order] = ranks % separation
  return groups


class ClientSampler:
  """Draws each round's cohort from `client_ids`."""

  def __init__(self, client_ids: Sequence[str], clients_per_round: int,
               sampling: str = FIXED_SIZE, seed: int = 0,
               separation: int = 1, key: Optional[str] = None):
    """`key`: a secret sampling key (`new_sampling_key`) the Poisson and
    fixed-size cohorts are drawn from instead of `seed`."""
    # Sorted: the cohort must not depend on the order the task lists them.
    self._client_ids = sorted(client_ids)
    if not self._client_ids:
      raise ValueError('`client_ids` is empty: there is no client to sample.')
    repeated = next((a for a, b in zip(self._client_ids, self._client_ids[1:])
                     if a == b), None)
    if repeated is not None:  # It would take part twice, or too often.
      raise ValueError(f'`client_ids` holds {repeated!r} more than once: a '
                       'client counted twice is sampled beyond what the '
                       'accounting assumes.')
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
    self._key = None if key is None else int(key, 16)
    self._groups = None
    if sampling == MIN_SEPARATION and self.separation > len(self._client_ids):
      # Said before the groups are made (2^31 of them would take minutes).
      # The separation is at fault, not the cohort: named first.
      raise ValueError(
          f'`separation` ({self.separation}) exceeds the '
          f'{len(self._client_ids)} clients: some of its minimum-separation '
          'groups would be empty. Use a separation of at most '
          f'{len(self._client_ids) // self.clients_per_round} (groups of '
          f'at least `clients_per_round` = {self.clients_per_round}).')
    if sampling == MIN_SEPARATION:
      smallest, largest = group_sizes(len(self._client_ids), self.separation)
      if smallest < self.clients_per_round:
        raise ValueError(
            f'`clients_per_round` ({self.clients_per_round}) exceeds the '
            f'smallest minimum-separation group: the {len(self._client_ids)}'
            f' clients fall into {self.separation} groups of {smallest} to '
            f'{largest}, and a round samples one group, so its mean would '
            f'be divided by more clients than take part. Use at most '
            f'{smallest} clients per round (or a smaller separation).')
      # The ids are sorted: group g's members as indices into them.
      group_of = separation_groups(self._client_ids, self.separation,
                                   self.seed)
      members = np.argsort(group_of, kind='stable')
      bounds = np.cumsum(np.bincount(group_of, minlength=self.separation))
      self._groups = np.split(members, bounds[:-1])

  @property
  def population_size(self) -> int:
    return len(self._client_ids)

  @property
  def sampling_probability(self) -> float:
    return self.clients_per_round / self.population_size

  def keyed(self, key: Optional[str]) -> 'ClientSampler':
    """This sampler with its cohorts drawn from the secret `key` (None: from
    the seed), the groups of minimum separation unchanged."""
    keyed = copy.copy(self)
    keyed._key = None if key is None else int(key, 16)  # pylint: disable=protected-access
    return keyed

  def sample(self, round_num: int) -> list[str]:
    """The cohort of round `round_num`: a pure function of the seed (or,
    for Poisson and fixed-size sampling, the secret key) and the round."""
    secret = self._key is not None and self.sampling != MIN_SEPARATION
    rng = np.random.default_rng([_KEYED_STREAM, self._key, int(round_num)]
                                if secret else [self.seed, int(round_num)])
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
