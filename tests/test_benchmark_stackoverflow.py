"""Specification of the Stack Overflow shape benchmark
(`scripts.benchmark_stackoverflow`) and its generated users
(`tasks.stackoverflow.GeneratedClientData`)."""

import os
import subprocess
import sys

from absl import flags
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from scripts import benchmark_stackoverflow as b
from tasks import models
from tasks import stackoverflow
from tasks import task as task_lib
from tff_clip.privacy import sampling

PUBLISHED_USERS = 342_477
PUBLISHED_PARAMETERS = 4_050_748  # TFF's LSTM over 10,000 words: "4.05M".


def _rss() -> int:
  with open('/proc/self/status') as f:
    return next(int(line.split()[1]) * 1024 for line in f
                if line.startswith('VmRSS:'))


@pytest.fixture
def parsed_flags():
  """Parses the script's flags for one test, then resets them."""

  def parse(*args):
    flags.FLAGS(['benchmark_stackoverflow', *args])

  yield parse
  flags.FLAGS.unparse_flags()


def test_lstm_parameters_are_those_of_tffs_model():
  # Oracles: the Keras model (`tasks.models`, TFF's baseline) and TFF's
  # count of special tokens.
  vocab_size = 10_000
  assert (stackoverflow.extended_vocab_size(vocab_size) ==
          vocab_size + b.SPECIAL_TOKENS)
  assert task_lib.count_parameters(lambda: models.create_stackoverflow_lstm(
      stackoverflow.extended_vocab_size(vocab_size))) == PUBLISHED_PARAMETERS
  assert b.lstm_parameters(vocab_size) == PUBLISHED_PARAMETERS


def test_published_population_is_generated_on_demand_not_held():
  before = _rss()
  users = stackoverflow.GeneratedClientData(PUBLISHED_USERS, vocab_size=100)
  # 135.8M sentences held would take GBs, the ids alone 24 MB.
  assert _rss() - before < 8 * 2**20
  assert len(users.client_ids) == PUBLISHED_USERS
  assert '342476' in users.client_ids and '342477' not in users.client_ids
  # The elements of TFF's Stack Overflow (its synthetic set as the oracle).
  assert users.element_type_structure == (
      tff.simulation.datasets.stackoverflow.get_synthetic()
      .element_type_structure)
  # A user's data is a function of (seed, id) alone: the same user in a
  # population of 1,000, with at least the published 100 sentences.
  read = lambda data, user: next(iter(  # pylint: disable=g-long-lambda
      data.create_tf_dataset_for_client(user).batch(100_000)))
  user = read(users, '000123')
  tf.nest.map_structure(np.testing.assert_array_equal, user, read(
      stackoverflow.GeneratedClientData(1_000, vocab_size=100), '123'))
  assert user['tokens'].shape[0] >= 100
  other_seed = read(stackoverflow.GeneratedClientData(
      1_000, vocab_size=100, seed=1), '123')
  assert not np.array_equal(user['tokens'][:100], other_seed['tokens'][:100])


def test_sampler_separates_the_published_population_into_equal_groups():
  # 342,477 = 342 x 1,001 + 135: groups of 1,001 or 1,002, so a round
  # trains a whole smallest group, 1,001 (the default), or the published
  # 1,000; the library's own sampler (the oracle) takes 1,001 and refuses
  # 1,002, naming the groups.
  cohort, smallest, largest = b.separated_cohort(b.Shape())
  assert (cohort, smallest, largest) == (1_001, 1_001, 1_002)
  assert b.separated_cohort(b.Shape(clients_per_round=1_000))[0] == 1_000
  ids = list(stackoverflow.GeneratedClientIds(PUBLISHED_USERS))
  before = _rss()
  sampler = sampling.ClientSampler(ids, 1_001, sampling.MIN_SEPARATION, 0,
                                   342)
  assert len(sampler.sample(7)) == 1_001
  assert _rss() - before < 64 * 2**20  # Groups of indices, no huge array.
  with pytest.raises(ValueError, match='groups of 1001 to 1002.*Use at most '
                     '1001 clients per round'):
    sampling.ClientSampler(ids, 1_002, sampling.MIN_SEPARATION, 0, 342)


def test_published_banded_noise_is_refused_up_front_with_its_memory_need(
    parsed_flags, capsys, monkeypatch):
  monkeypatch.setattr(b, '_measure_in_child', lambda *args: pytest.fail(
      'a refused mechanism was measured'))
  parsed_flags('--mechanisms=banded', '--bands=342', '--memory_gib=23')
  assert b.main([]) == 0
  lines = capsys.readouterr().out.splitlines()
  state = 341 * PUBLISHED_PARAMETERS * 4  # 341 past noise vectors, float32.
  need = b.BASE_BYTES + b.state_copies_at_peak() * state
  refusals = [line for line in lines if 'refused before' in line]
  assert refusals == [
      'banded (b = 342): refused before anything is built: its state holds '
      '341 noise vectors of 4,050,748 parameters (5.1 GiB); a DP round holds'
      f' about {b.state_copies_at_peak()} copies of it besides '
      f'{b.BASE_BYTES / 2**30:.1f} GiB for TensorFlow and the model, so it '
      f'needs about {need / 2**30:.1f} GiB, and this machine has 23.0 GiB '
      'available.']
  assert need / 2**30 > 23
  assert lines[-3] == '| ' + ' | '.join(b.COLUMNS) + ' |'
  row = lines[-1].split(' | ')
  assert row[0] == '| banded (b = 342)'
  assert row[1] == f'{state / 1e9:.2f} GB (341.00x), computed'
  # Each DP round checkpoints the whole state: model, momentum, noise.
  assert row[b.COLUMNS.index('written/round')] == (
      f'{343 * PUBLISHED_PARAMETERS * 4 / 1e9:.2f} GB (343.00x), computed')


def test_blt_row_waits_for_the_library_and_is_measured_once_registered(
    monkeypatch):
  shape = b.Shape()
  monkeypatch.setattr(b, 'available_mechanisms',
                      lambda: ('independent', 'tree', 'banded'))
  (name, _, _, refusal, note), = b.plan(shape, ['blt'], [342], 24 * 2**30)
  assert (name, refusal) == ('blt', None)
  assert note.startswith('not yet available')
  monkeypatch.setattr(b, 'available_mechanisms',
                      lambda: ('independent', 'tree', 'banded', 'blt'))
  monkeypatch.setattr(b, 'noise_vectors', lambda mechanism, shape: 4)
  assert b.plan(shape, ['blt'], [342], 24 * 2**30) == [
      ('blt', shape, 4, None, None)]


def test_measured_row_fills_every_column_in_model_multiples():
  model = PUBLISHED_PARAMETERS * 4
  result = dict(model_bytes=model, aggregator_bytes=5 * model,
                state_bytes=7 * model, peak_rss_bytes=2**31, startup_s=61.0,
                sum_s=0.5, update_s=0.25, checkpoint_s=0.125,
                records_s=0.0625, written_bytes=7 * model, e2e_s=3.0)
  table = b.format_table([b.row_cells('blt', result)]).splitlines()
  assert table[0] == '| ' + ' | '.join(b.COLUMNS) + ' |'
  assert table[2] == ('| blt | 81.0 MB (5.00x) | 113.4 MB (7.00x) | 2.00 GiB '
                      '| 61.0 | 0.50 | 0.250 | 0.125 | 0.062 | 0.94 | '
                      '113.4 MB (7.00x) | 3.00 |')


@pytest.mark.slow
def test_tiny_shape_run_measures_a_mechanism_and_refuses_another(tmp_path):
  doc = tmp_path / 'shape.md'
  doc.write_text(f'# Shape\n\n{b.TABLE_MARK}\nold\n{b.TABLE_MARK}\n\nEnd.\n')
  # 2,140,048 parameters: banded b = 10 needs 1.8 GiB + 7 x 9 x 8.6 MB,
  # independent noise 1.8 GiB (`BASE_BYTES`).
  result = subprocess.run(
      [sys.executable, '-m', 'scripts.benchmark_stackoverflow',
       '--vocab_size=100', '--num_clients=3420', '--min_separation=10',
       '--clients_per_round=5', '--bands=10', '--e2e_clients_per_round=3',
       '--e2e_rounds=1', '--sentences_per_client=16', '--memory_gib=2',
       '--mechanisms=banded,independent', f'--doc={doc}'],
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
      capture_output=True, text=True, timeout=1800, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'banded (b = 10): refused before anything is built' in result.stdout
  rows = [line.split(' | ') for line in result.stdout.splitlines()
          if line.startswith('| independent')]
  assert len(rows[-1]) == len(b.COLUMNS)
  assert rows[-1][1].endswith('(0.00x)')  # A key and a round counter.
  assert float(rows[-1][b.COLUMNS.index('server s/round')]) > 0
  text = doc.read_text()
  assert text.startswith('# Shape\n') and text.endswith('\n\nEnd.\n')
  assert 'old' not in text and '| independent |' in text
