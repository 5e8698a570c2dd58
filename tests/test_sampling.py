"""The client groups of minimum separation (`tff_clip.privacy.sampling`):
equal sizes, a pure function of (seed, set of ids), the same in a new
process. The cohorts they give are specified in test_correlated_noise.py."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tff_clip.privacy import sampling

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Seed 0's groups (b = 20) of the ids '0', '1', ..., '9' of 1,000: a
# resumed run must find the groups it started with, whatever numpy it runs.
PINNED_GROUPS = [17, 1, 16, 6, 14, 8, 19, 8, 8, 17]


def _group_of(ids, separation, seed):
  return dict(zip(ids, sampling.separation_groups(ids, separation, seed)))


@pytest.mark.parametrize('population, separation, sizes', [
    (1_000, 20, {50}),
    # Stack Overflow's published shape: 342,477 = 342 x 1,001 + 135.
    (342_477, 342, {1_001, 1_002}),
    (100, 20, {5}),
    (7, 3, {2, 3}),
])
def test_separation_groups_differ_in_size_by_at_most_one(population,
                                                         separation, sizes):
  ids = [str(i) for i in range(population)]
  counts = np.bincount(sampling.separation_groups(ids, separation, seed=0),
                       minlength=separation)
  assert set(counts.tolist()) == sizes
  assert counts.sum() == population
  # The closed form the sampler refuses and defaults with.
  assert sampling.group_sizes(population, separation) == (min(sizes),
                                                          max(sizes))


def test_separation_groups_do_not_depend_on_the_order_of_the_ids():
  ids = [f'user_{i}' for i in range(500)]
  shuffled = list(np.random.default_rng(5).permutation(ids))
  assert _group_of(ids, 7, 11) == _group_of(shuffled, 7, 11)


def test_separation_groups_are_a_seeded_permutation():
  ids = [str(i) for i in range(1_000)]
  groups = sampling.separation_groups(ids, 20, seed=0)
  # Not the ids cut in runs, nor dealt in their order: group 0 is not
  # every 20th id, and another seed deals them otherwise.
  assert not np.array_equal(groups, np.arange(1_000) % 20)
  assert not np.array_equal(groups, np.arange(1_000) // 50)
  other = sampling.separation_groups(ids, 20, seed=1)
  assert np.mean(groups == other) < 0.2  # About 1/20 by chance.


def test_separation_groups_are_the_same_in_a_new_process():
  # A resumed run rebuilds its sampler in a new process (another string
  # hash seed, perhaps another numpy): its groups must be the ones it
  # started with. Pinned: seed 0's groups of the first ids.
  ids = [str(i) for i in range(1_000)]
  code = ('import sys, json; from tff_clip.privacy import sampling; '
          'print(json.dumps(sampling.separation_groups('
          '[str(i) for i in range(1000)], 20, 0).tolist()))')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, check=True, cwd=REPO,
                       env={**os.environ, 'PYTHONHASHSEED': '123'}).stdout
  groups = sampling.separation_groups(ids, 20, 0).tolist()
  assert json.loads(out) == groups
  assert groups[:10] == PINNED_GROUPS
  # And a resumed sampler draws the same cohorts.
  make = lambda: sampling.ClientSampler(ids, 50, 'min_separation', seed=0,
                                        separation=20)
  assert [make().sample(t) for t in range(25)] == [
      make().sample(t) for t in range(25)]




@pytest.mark.parametrize('scheme', ['poisson', 'fixed_size',
                                    'min_separation'])
def test_a_client_id_given_twice_is_refused(scheme):
  """Counted twice, a client would be drawn twice into a cohort (its update
  summed twice: sensitivity 2C) or more often than q; under minimum
  separation it would sit in two groups, taking part twice a cycle."""
  ids = ['a', 'b', 'c', 'd', 'a', 'e', 'f']
  with pytest.raises(ValueError, match="`client_ids` holds 'a' more than "
                     'once'):
    sampling.ClientSampler(ids, 2, scheme, 0, 3)
  sampling.ClientSampler(sorted(set(ids)), 2, scheme, 0, 3)
