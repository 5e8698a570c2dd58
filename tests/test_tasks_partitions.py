"""Specification of `tasks.partitions`: the papers' client partitions."""

import numpy as np
import pytest

from tasks import partitions

# 10 classes of unequal sizes (95..140 examples), shuffled.
_LABELS = np.random.default_rng(7).permutation(
    np.repeat(np.arange(10), 95 + 5 * np.arange(10)))

_CASES = {
    'iid': {},
    'dirichlet': {'partition_alpha': 0.5},
    'classes_per_client': {'classes_per_client': 2},
    'shards': {'shards_per_client': 5},
    'small_large': {},
}


def _split(partition, seed=0, num_clients=20, labels=_LABELS):
  return partitions.partition_labels(labels, num_clients, partition,
                                     seed=seed, **_CASES[partition])


def _classes_of(client_indices, labels=_LABELS):
  return [set(labels[ix].tolist()) for ix in client_indices]


def test_every_partition_name_has_a_case():
  assert set(_CASES) == set(partitions.PARTITION_NAMES)


@pytest.mark.parametrize('partition', partitions.PARTITION_NAMES)
def test_partition_is_deterministic_given_the_seed(partition):
  first, second = _split(partition), _split(partition)
  assert all(np.array_equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize('partition', partitions.PARTITION_NAMES)
def test_partition_changes_with_the_seed(partition):
  first, second = _split(partition, seed=0), _split(partition, seed=1)
  assert not all(np.array_equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize('partition', partitions.PARTITION_NAMES)
def test_partition_is_disjoint_and_covers_every_example(partition):
  clients = _split(partition)
  everything = np.concatenate(clients)
  assert len(clients) == 20
  assert everything.size == _LABELS.size
  assert np.array_equal(np.sort(everything), np.arange(_LABELS.size))


@pytest.mark.parametrize('partition', partitions.PARTITION_NAMES)
def test_partition_leaves_no_client_empty(partition):
  assert min(ix.size for ix in _split(partition)) > 0


def test_iid_clients_have_near_equal_sizes():
  sizes = [ix.size for ix in _split('iid')]
  assert max(sizes) - min(sizes) <= 1


def test_dirichlet_small_alpha_is_more_label_skewed_than_large_alpha():
  def mean_top_class_share(alpha):
    clients = partitions.dirichlet_partition(_LABELS, 20, alpha, seed=3)
    return np.mean([np.bincount(_LABELS[ix]).max() / ix.size
                    for ix in clients])

  assert mean_top_class_share(0.1) > 0.6
  assert mean_top_class_share(100.0) < 0.25


def test_dirichlet_serves_a_population_larger_than_any_draw_can_fill():
  # 1,000 clients on 3,600 examples (MNIST's share at a 1,000-client
  # population): every Dirichlet(0.1) draw leaves hundreds of clients empty.
  # Each still gets an example, every example is dealt once, and the clients
  # stay label-skewed: their most common class holds a far larger share of
  # their examples than in an IID split.
  labels = np.random.default_rng(7).permutation(np.repeat(np.arange(10), 360))
  clients = partitions.dirichlet_partition(labels, 1000, 0.1, seed=0)
  assert min(ix.size for ix in clients) == 1
  assert np.array_equal(np.sort(np.concatenate(clients)),
                        np.arange(labels.size))
  again = partitions.dirichlet_partition(labels, 1000, 0.1, seed=0)
  assert all(np.array_equal(a, b) for a, b in zip(clients, again))
  iid = partitions.partition_labels(labels, 1000, 'iid', seed=0)

  def top_class_share(parts):
    return np.mean([np.bincount(labels[ix]).max() / ix.size
                    for ix in parts if ix.size >= 3])

  assert top_class_share(clients) > top_class_share(iid) + 0.2


def test_classes_per_client_gives_each_client_exactly_p_classes():
  clients = partitions.classes_per_client_partition(_LABELS, 20, 3, seed=0)
  assert [len(c) for c in _classes_of(clients)] == [3] * 20


def test_classes_per_client_with_all_classes_is_iid_like():
  clients = partitions.classes_per_client_partition(_LABELS, 10, 10, seed=0)
  assert all(len(c) == 10 for c in _classes_of(clients))


def test_shards_give_each_client_at_most_shards_per_client_classes():
  clients = partitions.shard_partition(_LABELS, 20, shards_per_client=5,
                                       seed=0)
  assert max(len(c) for c in _classes_of(clients)) <= 5


def test_shards_are_single_class_even_when_class_sizes_do_not_divide():
  # 2 shards per client x 7 clients = 14 shards over 10 unequal classes:
  # a client can then hold at most 2 classes only if every shard is pure.
  clients = partitions.shard_partition(_LABELS, 7, shards_per_client=2,
                                       seed=0)
  assert max(len(c) for c in _classes_of(clients)) <= 2


def test_small_large_puts_most_of_each_client_in_two_classes():
  # 5 clients of ~240 examples: about 2 per small class, as Zhang et al. 2022's 5.
  clients = partitions.small_large_partition(_LABELS, 5, seed=0)
  for ix in clients:
    counts = np.sort(np.bincount(_LABELS[ix], minlength=10))[::-1]
    assert counts[:2].sum() / ix.size > 0.85
    assert np.count_nonzero(counts) == 10  # the 8 small classes are there.


def test_unknown_partition_name_is_rejected():
  with pytest.raises(ValueError, match='Unknown partition .*expected one of'):
    partitions.partition_labels(_LABELS, 4, 'by_writer')


@pytest.mark.parametrize('alpha', [0.0, -1.0, float('inf')])
def test_non_positive_or_infinite_dirichlet_alpha_is_rejected(alpha):
  with pytest.raises(ValueError, match='partition_alpha'):
    partitions.partition_labels(_LABELS, 4, 'dirichlet',
                                partition_alpha=alpha)


def test_dirichlet_without_alpha_is_rejected():
  with pytest.raises(ValueError, match='needs `partition_alpha`'):
    partitions.partition_labels(_LABELS, 4, 'dirichlet')


def test_alpha_for_a_partition_without_alpha_is_rejected():
  with pytest.raises(ValueError, match='`partition_alpha` does not apply'):
    partitions.partition_labels(_LABELS, 4, 'iid', partition_alpha=1.0)


def test_more_clients_than_examples_is_rejected():
  with pytest.raises(ValueError, match=r'larger than the number of examples'):
    partitions.iid_partition(np.arange(5), 6)


def test_too_few_clients_to_cover_every_class_is_rejected():
  with pytest.raises(ValueError, match='cannot cover all 10 classes'):
    partitions.classes_per_client_partition(_LABELS, 4, 2)


def test_a_class_smaller_than_its_holders_is_rejected_not_dropped():
  # 10 clients x 2 classes over 4 classes: each class is held by 5 clients,
  # and class 3 has 4 examples, so one of its holders would hold 1 class.
  labels = np.repeat(np.arange(4), [50, 50, 50, 4])
  with pytest.raises(ValueError,
                     match=r'`classes_per_client`=2: class 3 has 4 exam'):
    partitions.classes_per_client_partition(labels, 10, 2)
  # With a fifth example there is one for every holder: exactly 2 each.
  labels = np.repeat(np.arange(4), [50, 50, 50, 5])
  clients = partitions.classes_per_client_partition(labels, 10, 2)
  assert [len(c) for c in _classes_of(clients, labels)] == [2] * 10


def test_non_integer_labels_are_rejected():
  with pytest.raises(TypeError, match='integer class ids'):
    partitions.iid_partition(np.array([0.5, 1.5]), 1)
