"""A private run's cohorts are secret: amplification by sampling needs them.

Poisson and fixed-size accounting credit each round with the chance that a
client was not sampled; that holds only while no one knows who was. The
run's --seed (0 by default, and in config.json) is public, so a private
run draws its cohorts from a secret key of OS entropy, kept only in its
checkpoints (as the noise key is), and a resumed run draws the cohorts the
uninterrupted one would have. Oracle: the cohorts the sampler records, and
`ClientSampler` with the seed alone (what anyone can compute).
"""

import numpy as np
import pytest

from scripts import program
from tff_clip.privacy import sampling
from tff_clip.program import checkpoints
from tff_clip.program import training

ROUNDS = 3


@pytest.fixture
def cohorts(monkeypatch):
  """Every cohort drawn, as (key or None, round, ids)."""
  drawn = []
  sample = sampling.ClientSampler.sample

  def spy(self, round_num):
    cohort = sample(self, round_num)
    drawn.append((self._key, round_num, cohort))  # pylint: disable=protected-access
    return cohort
  monkeypatch.setattr(sampling.ClientSampler, 'sample', spy)
  return drawn


def _config(root, name, **fields):
  return training.TrainConfig(
      root_output_dir=str(root), experiment_name=name, rounds=ROUNDS,
      clients_per_round=5, sampling='fixed_size', noise_multiplier=1.0,
      eval_every=ROUNDS, progress=False, plot=False, **fields)


def _public(config, round_num):
  session_ids = program.build_task(config).datasets.train_data.client_ids
  return sampling.ClientSampler(session_ids, config.clients_per_round,
                                config.sampling, config.seed).sample(round_num)


def test_private_runs_of_one_seed_draw_secret_cohorts(tmp_path, cohorts):
  first, second = _config(tmp_path, 'a'), _config(tmp_path, 'b')
  program.run(first)
  program.run(second)
  keys = {key for key, _, _ in cohorts}
  assert None not in keys and len(keys) == 2
  by_run = [[c for k, _, c in cohorts if k == key] for key in keys]
  assert by_run[0] != by_run[1]
  # Not what --seed gives anyone who reads config.json.
  for key, round_num, cohort in list(cohorts):
    assert cohort != _public(first, round_num)
  # The key is in the checkpoints (owner-only), nowhere released.
  version, _, header = checkpoints.Checkpoints(
      str(tmp_path / 'a' / 'checkpoints')).load_latest()
  assert version == ROUNDS and int(header['sampling_key'], 16) in keys
  for path in (tmp_path / 'a').rglob('*'):
    if path.is_file() and 'checkpoints' not in path.parts:
      assert header['sampling_key'].encode() not in path.read_bytes(), path


def test_a_resumed_run_draws_the_cohorts_its_key_gives(tmp_path, cohorts,
                                                       monkeypatch):
  config = _config(tmp_path, 'killed', checkpoint_every=1)
  sample = sampling.ClientSampler.sample

  def killed_at_last_round(self, round_num):
    if round_num == ROUNDS:
      raise KeyboardInterrupt  # As kill, after round 2's release.
    return sample(self, round_num)
  monkeypatch.setattr(sampling.ClientSampler, 'sample', killed_at_last_round)
  with pytest.raises(KeyboardInterrupt):
    program.run(config)
  _, _, header = checkpoints.Checkpoints(
      str(tmp_path / 'killed' / 'checkpoints')).load_latest()
  key = header['sampling_key']
  monkeypatch.undo()
  drawn = []
  monkeypatch.setattr(sampling.ClientSampler, 'sample',
                      lambda self, r: drawn.append((self._key, r)) or sample(  # pylint: disable=protected-access
                          self, r))
  program.run(config)
  assert drawn == [(int(key, 16), ROUNDS)]


def test_a_checkpoint_without_a_key_resumes_with_secret_cohorts(
    tmp_path, monkeypatch, capsys):
  """A checkpoint saved by a tff_clip that drew a private run's cohorts from
  --seed holds no key: the rounds after it draw theirs in secret (a fresh
  key, kept from then on), and the run says which rounds did not."""
  config = _config(tmp_path, 'old', checkpoint_every=1)
  sample = sampling.ClientSampler.sample

  def killed_at_last_round(self, round_num):
    if round_num == ROUNDS:
      raise KeyboardInterrupt
    return sample(self, round_num)
  monkeypatch.setattr(sampling.ClientSampler, 'sample', killed_at_last_round)
  with pytest.raises(KeyboardInterrupt):
    program.run(config)
  monkeypatch.setattr(sampling.ClientSampler, 'sample', sample)
  saved = checkpoints.Checkpoints(str(tmp_path / 'old' / 'checkpoints'))
  version, leaves, header = saved.load_latest()
  del header['sampling_key'], header['round']  # As an older version saved.
  saved.save(version, leaves, header)
  cohorts = []
  monkeypatch.setattr(sampling.ClientSampler, 'sample',
                      lambda self, r: cohorts.append((self._key, r)) or sample(  # pylint: disable=protected-access
                          self, r))
  program.run(config)
  assert len(cohorts) == 1 and cohorts[0][0] is not None
  assert (f'rounds 1-{version} drew their cohorts from --seed' in
          capsys.readouterr().err)
  _, _, header = saved.load_latest()
  assert int(header['sampling_key'], 16) == cohorts[0][0]


def test_seeded_noise_and_minimum_separation_keep_seeded_cohorts(tmp_path,
                                                                 cohorts):
  # --noise_seed: reproducible, NOT private; minimum separation: no
  # amplification is claimed, its groups are public.
  program.run(_config(tmp_path, 'seeded', noise_seed=7))
  assert {key for key, _, _ in cohorts} == {None}
  keyed = sampling.ClientSampler([str(i) for i in range(12)], 3,
                                 'min_separation', 0, separation=4)
  assert keyed.keyed(sampling.new_sampling_key()).sample(5) == keyed.sample(5)
  assert len(set(sampling.new_sampling_key() for _ in range(8))) == 8
  assert all(len(sampling.new_sampling_key()) == 32 for _ in range(3))
  assert np.all([int(sampling.new_sampling_key(), 16) >= 0])
