"""Label-based partitions of a centralized data set into federated clients.

Every partition here is a pure function of `(labels, num_clients, seed, ...)`
returning one sorted index array per client. All of them are

  * deterministic: the same arguments give the same clients;
  * disjoint: no example is given to two clients;
  * covering: every example is given to some client;
  * non-empty: every client gets at least one example (else `ValueError`).

The partitions are the ones the seed papers train on:

  * `iid`: a uniformly random split into near-equal clients.
  * `dirichlet`: label skew with client-class proportions drawn from a
    symmetric Dirichlet(alpha) per class (Hsu et al. 2019, "Measuring the
    effects of non-identical data distribution"), as Cheng et al. 2022 (Sec.
    6: "Dir(alpha), a smaller alpha indicates higher data
    heterogeneity") uses for CIFAR-10.
  * `classes_per_client`: each client holds exactly `p` labels (Yang
    et al., Sec. 5: "a parameter p to represent the number of labeled classes
    in each client, with p = 10 corresponding to the i.i.d. case").
  * `shards`: the data is cut into `shards_per_client * num_clients`
    single-class shards and each client draws `shards_per_client` of them
    uniformly without replacement (Das et al., App. G: 5 shards per
    client, "at most 5 distinct classes").
  * `small_large`: each client has a few large classes and many small ones
    (Zhang et al., Sec. 2: "8 classes (each has around 5 samples)
    and 2 classes (each has 230 samples) on each client").

References:
* Zhang et al. 2022: "Understanding Clipping for Federated Learning:
  Convergence and Client-Level Differential Privacy", ICML 2022.
* Yang, Qiu, Liu 2022: "Taming Fat-Tailed Noise in Federated Learning",
  NeurIPS 2022.
* Das et al. 2022: "On the Convergence of DP FL on Non-Lipschitz
  Objectives, and with Normalized Client Updates".
* Cheng et al. 2022: "Differentially Private Federated Learning with
  Local Regularization and Sparsification", CVPR 2022.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np

__all__ = [
    'PARTITION_NAMES',
    'check_partition_alpha',
    'classes_per_client_partition',
    'dirichlet_partition',
    'iid_partition',
    'partition_labels',
    'shard_partition',
    'small_large_partition',
]

from tasks.names import PARTITION_NAMES  # pylint: disable=g-bad-import-order,wrong-import-position

# Zhang et al. 2022 (Sec. 2): 8 x 5 + 2 x 230 = 500 examples per client,
# so the two large classes hold 460 / 500 = 92% of a client's data.
_SMALL_LARGE_LARGE_FRACTION = 0.92
_DIRICHLET_MAX_ATTEMPTS = 10


def _check_labels(labels) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(
        f'`labels` must be a 1-D array of class ids; got shape {labels.shape}.')
  if labels.size == 0:
    raise ValueError('`labels` is empty: there is nothing to partition.')
  if not np.issubdtype(labels.dtype, np.integer):
    raise TypeError(
        f'`labels` must hold integer class ids; got dtype {labels.dtype}.')
  return labels


def _check_num_clients(num_clients, num_examples: int) -> int:
  if isinstance(num_clients, bool) or not isinstance(
      num_clients, (int, np.integer)):
    raise TypeError(
        f'`num_clients` must be an int; got {type(num_clients).__name__}.')
  if num_clients <= 0:
    raise ValueError(f'`num_clients` must be positive; got {num_clients}.')
  if num_clients > num_examples:
    raise ValueError(
        f'`num_clients` ({num_clients}) is larger than the number of examples '
        f'({num_examples}): some client would be empty. Use at most '
        f'{num_examples} clients.')
  return int(num_clients)


def _check_positive_int(value, name: str) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(f'`{name}` must be an int; got {type(value).__name__}.')
  if value <= 0:
    raise ValueError(f'`{name}` must be positive; got {value}.')
  return int(value)


def _finish(client_indices: Sequence[np.ndarray], partition: str):
  """Sorts each client's indices and checks that none is empty."""
  result = [np.sort(np.asarray(ix, dtype=np.int64)) for ix in client_indices]
  empty = [k for k, ix in enumerate(result) if ix.size == 0]
  if empty:
    raise ValueError(
        f'The {partition!r} partition left {len(empty)} client(s) without '
        f'examples (first: client {empty[0]}); use fewer clients or a less '
        'skewed partition.')
  return result


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
  """Integer counts summing to `total`, proportional to `weights`."""
  weights = np.asarray(weights, dtype=np.float64)
  exact = weights / weights.sum() * total
  counts = np.floor(exact).astype(np.int64)
  remainder = total - counts.sum()
  # Stable order: ties go to the lower index, so the result is deterministic.
  order = np.argsort(-(exact - counts), kind='stable')
  counts[order[:remainder]] += 1
  return counts


def iid_partition(labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
  """Splits the examples uniformly at random into near-equal clients."""
  labels = _check_labels(labels)
  num_clients = _check_num_clients(num_clients, labels.size)
  rng = np.random.default_rng(seed)
  return _finish(np.array_split(rng.permutation(labels.size), num_clients),
                 'iid')


def dirichlet_partition(labels,
                        num_clients: int,
                        alpha: float,
                        seed: int = 0,
                        min_examples_per_client: int = 1) -> list[np.ndarray]:
  """Dirichlet(alpha) label skew (Hsu et al. 2019; Cheng et al. 2022, Sec. 6).

  For every class c, a vector q_c ~ Dir(alpha * 1_num_clients) is drawn and the
  examples of class c are dealt to the clients in proportions q_c. A small
  alpha gives each client few classes; alpha -> infinity approaches IID. The
  draw is repeated (deterministically, from the same seeded generator) until
  every client has at least `min_examples_per_client` examples, at most
  `_DIRICHLET_MAX_ATTEMPTS` times. Where no draw gets there (many small
  clients: 1,000 clients on MNIST's 4,000 examples leave a third of them
  empty in every draw), the last draw is topped up: each short client, in
  order, takes one example at a time from the currently largest client, of
  that client's most common class, so every client is served and the skew
  of the draw is kept.

  Args:
    labels: 1-D integer class ids, one per example.
    num_clients: number of clients.
    alpha: positive Dirichlet concentration.
    seed: seed of the generator.
    min_examples_per_client: smallest acceptable client.

  Returns:
    One sorted index array per client.
  """
  labels = _check_labels(labels)
  num_clients = _check_num_clients(num_clients, labels.size)
  alpha = check_partition_alpha(alpha)
  min_examples_per_client = _check_positive_int(min_examples_per_client,
                                                'min_examples_per_client')
  if min_examples_per_client * num_clients > labels.size:
    raise ValueError(
        f'{num_clients} clients x `min_examples_per_client`='
        f'{min_examples_per_client} exceeds the {labels.size} examples.')
  rng = np.random.default_rng(seed)
  classes = np.unique(labels)
  for _ in range(_DIRICHLET_MAX_ATTEMPTS):
    # Class by class, the members dealt in order: client k takes the run
    # between cuts k - 1 and k; a client's examples are its runs in class
    # order (one stable sort by client of all classes' dealt members).
    members, owner = [], []
    for c in classes:
      members.append(rng.permutation(np.flatnonzero(labels == c)))
      proportions = rng.dirichlet(np.full(num_clients, alpha))
      cuts = (np.cumsum(proportions)[:-1] * members[-1].size).astype(np.int64)
      owner.append(np.searchsorted(cuts, np.arange(members[-1].size),
                                   side='right'))
    members, owner = np.concatenate(members), np.concatenate(owner)
    order = np.argsort(owner, kind='stable')
    clients = np.split(members[order], np.cumsum(
        np.bincount(owner, minlength=num_clients))[:-1])
    if min(ix.size for ix in clients) >= min_examples_per_client:
      return _finish(clients, 'dirichlet')
  return _finish(_top_up(clients, labels, min_examples_per_client),
                 'dirichlet')


def _top_up(clients, labels, minimum):
  """Moves examples from the largest clients to those short of `minimum`."""
  clients = [list(ix) for ix in clients]
  sizes = np.array([len(ix) for ix in clients])
  for k in np.flatnonzero(sizes < minimum):
    while sizes[k] < minimum:
      donor = int(np.argmax(sizes))
      donor_labels = labels[clients[donor]]
      common = np.bincount(donor_labels).argmax()
      position = int(np.flatnonzero(donor_labels == common)[-1])
      clients[k].append(clients[donor].pop(position))
      sizes[donor] -= 1
      sizes[k] += 1
  return [np.asarray(ix, dtype=np.int64) for ix in clients]


def classes_per_client_partition(labels,
                                 num_clients: int,
                                 classes_per_client: int,
                                 seed: int = 0) -> list[np.ndarray]:
  """Each client holds exactly `classes_per_client` labels (Yang et al. 2022, Sec. 5).

  The classes are put in a seeded random order and client k takes the
  `classes_per_client` classes that follow position k * classes_per_client
  (cyclically), so every class is held by (almost) equally many clients. The
  examples of a class are then split evenly among the clients that hold it.
  `classes_per_client` equal to the number of classes is the IID case.

  Args:
    labels: 1-D integer class ids, one per example.
    num_clients: number of clients; num_clients * classes_per_client must be
      at least the number of classes, or some class would be dropped, and
      each class needs an example for every client that holds it.
    classes_per_client: the p of Yang et al. 2022.
    seed: seed of the generator.

  Returns:
    One sorted index array per client.
  """
  labels = _check_labels(labels)
  num_clients = _check_num_clients(num_clients, labels.size)
  classes_per_client = _check_positive_int(classes_per_client,
                                           'classes_per_client')
  classes = np.unique(labels)
  if classes_per_client > classes.size:
    raise ValueError(
        f'`classes_per_client` ({classes_per_client}) exceeds the number of '
        f'classes present ({classes.size}).')
  if num_clients * classes_per_client < classes.size:
    raise ValueError(
        f'{num_clients} clients x {classes_per_client} classes each cannot '
        f'cover all {classes.size} classes; use more clients or more classes '
        'per client.')
  rng = np.random.default_rng(seed)
  order = rng.permutation(classes)
  holders = {c: [] for c in classes}
  for k in range(num_clients):
    for j in range(classes_per_client):
      holders[order[(k * classes_per_client + j) % classes.size]].append(k)
  short = [c for c in classes if np.sum(labels == c) < len(holders[c])]
  if short:
    c = short[0]
    raise ValueError(
        f'`classes_per_client`={classes_per_client}: class {c} has '
        f'{np.sum(labels == c)} example(s) for the {len(holders[c])} clients '
        'that hold it, so some would hold fewer classes; use fewer clients '
        'or fewer classes per client.')
  clients = [[] for _ in range(num_clients)]
  for c in classes:
    members = rng.permutation(np.flatnonzero(labels == c))
    for k, part in zip(holders[c], np.array_split(members, len(holders[c]))):
      clients[k].append(part)
  return _finish([np.concatenate(parts) for parts in clients],
                 'classes_per_client')


def shard_partition(labels,
                    num_clients: int,
                    shards_per_client: int = 5,
                    seed: int = 0) -> list[np.ndarray]:
  """Single-class shards, `shards_per_client` per client (Das et al. 2022, App. G).

  Das et al. sort the data by label, cut it into 5n equal shards and give
  each of the n clients 5 shards drawn uniformly without replacement. Cutting
  the sorted data in equal pieces only gives single-class shards when class
  sizes divide evenly, so here each class is cut separately, into a number of
  shards proportional to its size (at least one), which keeps every shard
  single-class and the shard sizes near-equal.

  Args:
    labels: 1-D integer class ids, one per example.
    num_clients: number of clients.
    shards_per_client: shards dealt to each client (5 in the paper).
    seed: seed of the generator.

  Returns:
    One sorted index array per client.
  """
  labels = _check_labels(labels)
  num_clients = _check_num_clients(num_clients, labels.size)
  shards_per_client = _check_positive_int(shards_per_client,
                                          'shards_per_client')
  num_shards = num_clients * shards_per_client
  classes, class_sizes = np.unique(labels, return_counts=True)
  if num_shards < classes.size:
    raise ValueError(
        f'{num_shards} shards ({num_clients} clients x {shards_per_client}) '
        f'cannot give each of the {classes.size} classes its own shard; use '
        'more clients or more shards per client.')
  if num_shards > labels.size:
    raise ValueError(
        f'{num_shards} shards ({num_clients} clients x {shards_per_client}) '
        f'is more than the {labels.size} examples.')
  # One shard per class first, the rest in proportion to class size, never
  # more shards than a class has examples.
  shard_counts = np.ones(classes.size, dtype=np.int64)
  extra = _largest_remainder(class_sizes, num_shards - classes.size)
  shard_counts += np.minimum(extra, class_sizes - 1)
  while shard_counts.sum() < num_shards:  # Caps freed shards: re-deal them.
    room = class_sizes - shard_counts
    shard_counts[np.argmax(room)] += 1
  rng = np.random.default_rng(seed)
  shards = []
  for c, count in zip(classes, shard_counts):
    members = rng.permutation(np.flatnonzero(labels == c))
    shards.extend(np.array_split(members, count))
  dealt = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
  return _finish([np.concatenate([shards[s] for s in row]) for row in dealt],
                 'shards')


def small_large_partition(labels,
                          num_clients: int,
                          num_large_classes: int = 2,
                          large_fraction: float = _SMALL_LARGE_LARGE_FRACTION,
                          seed: int = 0) -> list[np.ndarray]:
  """A few large classes and many small ones per client (Zhang et al. 2022, Sec. 2).

  Zhang et al.'s non-IID EMNIST clients hold 2 classes of about 230 examples
  and 8 classes of about 5. Here client k's large classes are
  `num_large_classes` consecutive entries of a seeded random class order
  (cyclically), so each class is large for equally many clients; the large
  classes get weight `large_fraction / num_large_classes` and the others share
  the rest. Every class is dealt to the clients in proportion to these
  weights (largest-remainder rounding), so the partition stays disjoint and
  covering while each client's histogram is close to 2 large + 8 small.

  Args:
    labels: 1-D integer class ids, one per example.
    num_clients: number of clients.
    num_large_classes: large classes per client (2 in the paper).
    large_fraction: share of a client's data in its large classes (0.92 in
      the paper: 460 of 500).
    seed: seed of the generator.

  Returns:
    One sorted index array per client.
  """
  labels = _check_labels(labels)
  num_clients = _check_num_clients(num_clients, labels.size)
  num_large_classes = _check_positive_int(num_large_classes,
                                          'num_large_classes')
  if not 0.0 < large_fraction <= 1.0:
    raise ValueError(
        f'`large_fraction` must be in (0, 1]; got {large_fraction}.')
  classes = np.unique(labels)
  if num_large_classes >= classes.size:
    raise ValueError(
        f'`num_large_classes` ({num_large_classes}) must be smaller than the '
        f'number of classes ({classes.size}), or no class is small.')
  rng = np.random.default_rng(seed)
  order = rng.permutation(classes.size)
  num_small = classes.size - num_large_classes
  weights = np.full((num_clients, classes.size),
                    (1.0 - large_fraction) / num_small)
  for k in range(num_clients):
    for j in range(num_large_classes):
      weights[k, order[(k * num_large_classes + j) % classes.size]] = (
          large_fraction / num_large_classes)
  clients = [[] for _ in range(num_clients)]
  for column, c in enumerate(classes):
    members = rng.permutation(np.flatnonzero(labels == c))
    counts = _largest_remainder(weights[:, column], members.size)
    for k, part in enumerate(np.split(members, np.cumsum(counts)[:-1])):
      clients[k].append(part)
  return _finish([np.concatenate(parts) for parts in clients], 'small_large')


def check_partition_alpha(alpha) -> float:
  """`alpha` as a float, or a clear error when it is not a positive number."""
  if isinstance(alpha, bool) or not isinstance(
      alpha, (int, float, np.integer, np.floating)):
    raise TypeError(
        f'`partition_alpha` must be a number; got {type(alpha).__name__}.')
  if not np.isfinite(alpha) or alpha <= 0:
    raise ValueError(
        f'`partition_alpha` (the Dirichlet concentration) must be positive '
        f'and finite; got {alpha}.')
  return float(alpha)


def partition_labels(labels,
                     num_clients: int,
                     partition: str,
                     *,
                     seed: int = 0,
                     partition_alpha: Optional[float] = None,
                     classes_per_client: Optional[int] = None,
                     shards_per_client: Optional[int] = None
                    ) -> list[np.ndarray]:
  """Dispatches to the partition named `partition`; see the module docstring.

  Args:
    labels: 1-D integer class ids, one per example.
    num_clients: number of clients.
    partition: one of `PARTITION_NAMES`.
    seed: seed of the generator.
    partition_alpha: Dirichlet concentration; required by, and only allowed
      with, `partition='dirichlet'`.
    classes_per_client: p of `classes_per_client` (default 2); only allowed
      with that partition.
    shards_per_client: shards per client of `shards` (default 5); only
      allowed with that partition.

  Returns:
    One sorted index array per client.
  """
  if partition not in PARTITION_NAMES:
    raise ValueError(
        f'Unknown partition {partition!r}; expected one of {PARTITION_NAMES}.')
  misplaced = [
      name for name, value, owner in (
          ('partition_alpha', partition_alpha, 'dirichlet'),
          ('classes_per_client', classes_per_client, 'classes_per_client'),
          ('shards_per_client', shards_per_client, 'shards'))
      if value is not None and partition != owner
  ]
  if misplaced:
    raise ValueError(
        f'{", ".join("`" + m + "`" for m in misplaced)} does not apply to '
        f'partition {partition!r}.')
  if partition == 'iid':
    return iid_partition(labels, num_clients, seed)
  if partition == 'dirichlet':
    if partition_alpha is None:
      raise ValueError(
          "partition='dirichlet' needs `partition_alpha` (e.g. 0.1, 1.0).")
    return dirichlet_partition(labels, num_clients, partition_alpha, seed)
  if partition == 'classes_per_client':
    return classes_per_client_partition(
        labels, num_clients,
        2 if classes_per_client is None else classes_per_client, seed)
  if partition == 'shards':
    return shard_partition(
        labels, num_clients,
        5 if shards_per_client is None else shards_per_client, seed)
  return small_large_partition(labels, num_clients, seed=seed)
