"""Specification of one private run of the training program, end to end.

One small audited DP run of `training.run` (digits, adaptive normalization,
Poisson sampling, noise key from OS entropy) and what it leaves:

* no released file holds a secret of its state (the noise keys, the audit
  seed, the keys of its rounds) in any encoding (`key_search`); released is
  everything in the run directory but `checkpoints/` and the lock
  (docs/run_directory.md, docs/privacy.md);
* its epsilon is dp_accounting's for the Poisson-sampled Gaussian of the
  requested z, composed here: adaptive clipping's value and count noise
  together are exactly that Gaussian (Andrew et al. 2021);
* its audit reports both empirical epsilons, below the accounted one;
* it is not labelled "NOT private".
"""

import json
import math
import zlib

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

from scripts import program
from tff_clip.program import training
import key_search  # pylint: disable=g-bad-import-order

ROUNDS, CLIENTS, POPULATION = 3, 6, 50  # digits: 50 clients.
Z = 0.5
# The audit's lower bounds hold with this probability each (two threats):
# the run's keys come from OS entropy, so a bound above the accounted epsilon
# is a chance of at most 2 x 1e-4 here, not a flake at 95%'s 1 in 10.
AUDIT_CONFIDENCE = 0.9999
CONFIG = dict(rounds=ROUNDS, clients_per_round=CLIENTS, noise_multiplier=Z,
              eval_every=ROUNDS, seed=3, audit_canaries=6, progress=False,
              experiment_name='private', audit_confidence=AUDIT_CONFIDENCE)


@pytest.fixture(scope='module')
def private_run(tmp_path_factory):
  root = tmp_path_factory.mktemp('private')
  config = training.TrainConfig(root_output_dir=str(root), **CONFIG)
  assert config.noise_seed is None and config.sampling == 'poisson'
  assert config.clip_norm == 'adaptive'
  summary = program.run(config)
  return summary, root / 'private'


def _checkpoint_secrets(run_dir):
  """Every [2] int64 leaf of every checkpoint: the keys and the audit seed."""
  secrets = []
  for path in sorted((run_dir / 'checkpoints').iterdir()):
    with np.load(path) as data:
      for name in data.files:
        leaf = data[name]
        if leaf.dtype == np.int64 and leaf.shape == (2,):
          if not any(np.array_equal(leaf, s) for s in secrets):
            secrets.append(leaf)
  return secrets


def _derived_secrets(secret, rounds):
  """The secret halves of the keys derived from `secret`.

  TensorFlow's `stateless_fold_in(key, data)` is [g(key), data]: a round's
  key is [g(key), round] and its leaf i's [g(round key), i], so the secrets
  are g(key) and g([g(key), round]) (one int64 each; rounds and leaf
  indices are public).
  """
  def fold(key, data):
    return tf.random.experimental.stateless_fold_in(
        tf.constant(key, tf.int64), tf.constant(data, tf.int64)).numpy()
  first = fold(secret, 0)
  assert first[1] == 0 and fold(secret, 1)[0] == first[0]  # [g(key), data]
  return [first[:1]] + [fold(fold(secret, r), 0)[:1]
                        for r in range(rounds + 1)]


def _released_files(run_dir):
  return sorted(p for p in run_dir.rglob('*') if p.is_file() and
                p.relative_to(run_dir).parts[0] not in ('checkpoints', '.lock'))


def test_released_files_hold_no_secret_in_any_encoding(private_run):
  """No secret of the state (the value and count noise keys, the audit
  seed) nor the secret of any key derived from them is in a released
  file's bytes, name or numbers; the chance that the search raises a false
  alarm on an honest run is < 1e-9 (computed from what was searched)."""
  _, run_dir = private_run
  roots = _checkpoint_secrets(run_dir)
  # Value noise key, count noise key, audit seed: three distinct draws.
  assert len(roots) == 3 and all(s.all() for s in roots), roots
  secrets = roots + [k for s in roots for k in _derived_secrets(s, ROUNDS)]
  files = _released_files(run_dir)
  names = {str(p.relative_to(run_dir)) for p in files}
  assert {'config.json', 'releases.jsonl', 'metrics.csv', 'ledger.json',
          'summary.json', 'plot.png'} <= names
  assert any(n.startswith('tensorboard/') for n in names)

  chance, found = 0.0, []
  for path in files:
    name = str(path.relative_to(run_dir))
    for secret in secrets:
      found_here, file_chance = key_search.search_file(path, secret,
                                                       name.encode())
      found += [f'{name}: {f}' for f in found_here]
      chance += file_chance
  assert not found
  assert chance < 1e-9


def test_the_search_finds_a_key_leaked_in_any_form(tmp_path):
  """The search above is not blind: a key entry written as a TensorBoard
  float32 scalar or int32 tensor, a JSON number, a CSV float32, raw float64
  bytes or a decimal in a log line is found."""
  key = np.array([-7_046_029_254_386_353_131, 3_141_592_653_589_793_238],
                 np.int64)
  writer = tf.summary.create_file_writer(str(tmp_path))
  with writer.as_default():
    tf.summary.scalar('leak', tf.cast(key[1], tf.float32), step=1)
    tf.summary.write('leak32', tf.cast(key[0], tf.int32), step=1)
  writer.close()
  events = next(tmp_path.glob('*tfevents*'))
  found = key_search.found_numbers(key_search.released_numbers(events), key)
  assert any('float32' in f for f in found) and any('int32' in f
                                                      for f in found)
  (tmp_path / 'a.json').write_text(json.dumps({'x': float(key[0])}))
  assert key_search.found_numbers(
      key_search.released_numbers(tmp_path / 'a.json'), key)
  (tmp_path / 'a.csv').write_text(
      f'round,x\n1,{float(np.float32(key[1]))!r}\n')
  assert key_search.found_numbers(
      key_search.released_numbers(tmp_path / 'a.csv'), key)
  assert key_search.found_bytes(b'..' + key.astype('>f8').tobytes(), key)
  assert key_search.found_bytes(key.astype('<f4').tobytes(), key)
  assert key_search.found_bytes(f'seed={int(key[1])}'.encode(), key)
  leak = tmp_path / 'leak.png'
  leak.write_bytes(_png_with_text(f'key {key[0]}'))
  assert key_search.search_file(leak, key)[0]


def _png_with_text(text):
  """A 1x1 PNG with a tEXt chunk."""
  def chunk(kind, body):
    return (len(body).to_bytes(4, 'big') + kind + body +
            zlib.crc32(kind + body).to_bytes(4, 'big'))
  return (b'\x89PNG\r\n\x1a\n' +
          chunk(b'IHDR', bytes([0, 0, 0, 1, 0, 0, 0, 1, 8, 0, 0, 0, 0])) +
          chunk(b'tEXt', b'Comment\0' + text.encode()) +
          chunk(b'IDAT', zlib.compress(b'\0\0')) + chunk(b'IEND', b''))


def test_adaptive_epsilon_under_poisson_is_the_sampled_gaussian_of_z(
    private_run):
  """Each round ran Poisson(q, [Gaussian(z_v), Gaussian(2 sigma_b)]) with
  z_v^-2 + (2 sigma_b)^-2 = z^-2 (value noise on S = C, count noise of std
  sigma_b on a count of sensitivity 1/2), and epsilon after every round is
  dp_accounting's RDP of PoissonSampledDpEvent(n/K, GaussianDpEvent(z))
  composed that many times."""
  summary, run_dir = private_run
  ledger = json.loads((run_dir / 'ledger.json').read_text())
  [group] = ledger['ledger']['groups']
  assert group['round_nums'] == list(range(1, ROUNDS + 1))
  event = group['event']
  assert event['type'] == 'PoissonSampledDpEvent'
  assert event['sampling_probability'] == CLIENTS / POPULATION
  value, count = event['event']['events']
  assert value['noise_multiplier'] >= Z  # Raised for the count's share.
  assert (value['noise_multiplier']**-2 + count['noise_multiplier']**-2
          )**-0.5 == pytest.approx(Z, rel=1e-6)
  # Every round's epsilon by the run's one accountant, PLD: dp_accounting's
  # own on a grid 5x finer than the run's (whose figure overstates by at
  # most ~0.1%): its round's PLD, self-composed that many times.
  assert ledger['epsilon_per_round_accountant'] == 'pld'
  pld = dp_accounting.pld.privacy_loss_distribution
  one_round = pld.from_gaussian_mechanism(
      standard_deviation=Z, sampling_prob=CLIENTS / POPULATION,
      value_discretization_interval=1e-4)
  for rounds, epsilon in ledger['epsilon_per_round']:
    assert epsilon == pytest.approx(
        one_round.self_compose(rounds).get_epsilon_for_delta(1e-5), rel=2e-3)
  assert summary['epsilon'] == ledger['epsilon_per_round'][-1][1]


def test_audited_run_reports_both_empirical_epsilons_below_the_accounted(
    private_run):
  summary, _ = private_run
  empirical = summary['empirical_epsilon']
  assert empirical['rounds'] == ROUNDS and empirical['confidence'] == AUDIT_CONFIDENCE
  # The estimate compares the inserted candidates' statistics with the
  # others': it needs two of each, which the secret fair coins leave in all
  # but 26 of 2^12 draws of 12 candidates; else it is undefined (None).
  inserted = empirical['inserted']
  two_of_each = 2 <= inserted <= empirical['candidates'] - 2
  for threat in ('final_model', 'all_iterates'):
    assert 0.0 <= empirical[threat]['lower_bound'] < summary['epsilon']
    if two_of_each:
      assert math.isfinite(empirical[threat]['estimate'])
    else:
      assert empirical[threat]['estimate'] is None


def test_private_run_is_labelled_secret_not_not_private(private_run):
  summary, run_dir = private_run
  ledger = json.loads((run_dir / 'ledger.json').read_text())
  for noise in (summary['noise'], ledger['noise']):
    assert 'secret' in noise and 'NOT private' not in noise


def test_the_run_reports_the_quantile_its_norm_tracked(private_run):
  """No --target_quantile: the noise-following default, from public numbers
  only. digits' MLP (64-32-10: d = 2,410), z = 0.5, n = 6: the noise on the
  mean update is z sqrt(d) / n = 4.1 C, past the rule's switch to the 0.1
  quantile (1.15), to normalization (1.6) and to the 0.03 quantile (2)."""
  summary, run_dir = private_run
  assert json.loads((run_dir / 'config.json').read_text())[
      'target_quantile'] is None
  assert Z * math.sqrt(64 * 32 + 32 + 32 * 10 + 10) / CLIENTS > 1.6
  assert summary['target_quantile'] == 0.03
  assert summary['bounding'] == 'normalize'


def test_the_runs_tensorboard_holds_no_time(private_run):
  """Every event's wall_time is its round (a constant per round, no clock),
  and no file name holds a time or the host."""
  _, run_dir = private_run
  files = sorted((run_dir / 'tensorboard').iterdir())
  assert files and all(
      f.name.startswith('events.out.tfevents.0000000001.') for f in files)
  events = [e for f in files
            for e in tf.compat.v1.train.summary_iterator(str(f))]
  assert sorted({e.step for e in events}) == list(range(1, ROUNDS + 1))
  assert all(e.wall_time == e.step for e in events)
