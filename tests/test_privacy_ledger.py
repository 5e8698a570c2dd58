"""Specification of a run's privacy ledger (`tff_clip.privacy.privacy_ledger`).

The oracles are dp_accounting's accountants composing the same rounds
directly, and `tff_clip.privacy.accounting` for events it was checked against there.
"""

import collections
import json
import threading

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np
import pytest

from tff_clip.privacy import accounting
from tff_clip.privacy import privacy_ledger

DELTA = 1e-6
Z, N, K, ROUNDS = 1.0, 100, 10_000, 300


def _poisson_rounds(noise_multiplier, q, rounds):
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
          q, dp_accounting.GaussianDpEvent(noise_multiplier)), rounds)


def _record(ledger, round_num, noise_multiplier, sampling='poisson'):
  ledger.record(round_num, accounting.gaussian_round_event(
      noise_multiplier, N, K, sampling))


def _poisson_ledger(rounds):
  ledger = privacy_ledger.PrivacyLedger()
  for round_num in range(1, rounds + 1):
    _record(ledger, round_num, Z)
  return ledger


def test_ledger_epsilon_is_the_composition_of_its_recorded_events():
  ledger = privacy_ledger.PrivacyLedger()
  for round_num in range(1, 201):
    # The noise multiplier changes half-way (e.g. a schedule).
    noise_multiplier = 1.0 if round_num <= 100 else 1.5
    _record(ledger, round_num, noise_multiplier)
  # The same rounds, composed directly with dp_accounting.
  rounds = dp_accounting.ComposedDpEvent(
      [_poisson_rounds(1.0, N / K, 100),
       _poisson_rounds(1.5, N / K, 100)])
  direct_rdp = rdp.RdpAccountant().compose(rounds)
  direct_pld = pld.PLDAccountant(value_discretization_interval=1e-3).compose(
      rounds)

  assert ledger.guarantee(DELTA).epsilon == pytest.approx(
      direct_rdp.get_epsilon(DELTA), rel=1e-12)
  assert ledger.guarantee(DELTA, 'pld', 1e-3).epsilon == pytest.approx(
      direct_pld.get_epsilon(DELTA), rel=1e-12)
  assert ledger.composed_event() == rounds


def test_ledger_of_identical_rounds_matches_compute_training_epsilon():
  ledger = _poisson_ledger(ROUNDS)

  assert ledger.guarantee(DELTA) == accounting.compute_training_epsilon(
      Z, N, K, ROUNDS, DELTA)
  assert ledger.composed_event() == dp_accounting.ComposedDpEvent(
      [_poisson_rounds(Z, N / K, ROUNDS)])


def test_ledger_refuses_a_round_recorded_twice():
  ledger = _poisson_ledger(3)

  with pytest.raises(ValueError, match='`round_num` 2 is already recorded'):
    _record(ledger, 2, Z)
  assert len(ledger) == 3


def test_ledger_refuses_mixing_poisson_and_fixed_size_rounds():
  ledger = _poisson_ledger(2)

  with pytest.raises(ValueError, match='replace-one'):
    _record(ledger, 3, Z, sampling='fixed_size')
  assert len(ledger) == 2


def test_ledger_refuses_what_is_not_a_dp_event():
  with pytest.raises(TypeError):
    privacy_ledger.PrivacyLedger().record(1, {'noise_multiplier': 1.0})


def test_ledger_serialisation_round_trips_through_json():
  ledger = privacy_ledger.PrivacyLedger()
  for round_num in range(5):
    _record(ledger, round_num, 1.0 + (round_num % 2))
  ledger.record(
      7,
      accounting.round_event(
          dp_accounting.ComposedDpEvent([
              dp_accounting.GaussianDpEvent(1.0),
              dp_accounting.GaussianDpEvent(4.0)
          ]), N, K))

  restored = privacy_ledger.PrivacyLedger.from_dict(
      json.loads(json.dumps(ledger.to_dict())))

  assert restored.rounds == ledger.rounds == (0, 1, 2, 3, 4, 7)
  assert restored.events == ledger.events
  assert restored.guarantee(DELTA) == ledger.guarantee(DELTA)


def test_restored_ledger_still_refuses_recorded_rounds():
  restored = privacy_ledger.PrivacyLedger.from_dict(
      _poisson_ledger(3).to_dict())

  with pytest.raises(ValueError, match='already recorded'):
    _record(restored, 3, Z)
  _record(restored, 4, Z)
  assert restored.rounds == (1, 2, 3, 4)


def test_ledger_dict_with_a_round_twice_is_refused():
  data = _poisson_ledger(2).to_dict()
  data['groups'].append(dict(data['groups'][0]))

  with pytest.raises(ValueError, match='already recorded'):
    privacy_ledger.PrivacyLedger.from_dict(data)


def test_event_dicts_never_name_modules_to_import():
  with pytest.raises(ValueError):
    privacy_ledger.event_from_dict({'type': 'os.system', 'command': 'true'})


def test_events_from_tff_state_are_stored_as_plain_python():
  # TFF returns NumPy scalars, and tuples for lists, in extracted events.
  from_tff = dp_accounting.ComposedDpEvent(
      events=(dp_accounting.GaussianDpEvent(np.float32(1.5)),
              dp_accounting.GaussianDpEvent(np.float32(3.0))))
  plain = dp_accounting.ComposedDpEvent(events=[
      dp_accounting.GaussianDpEvent(1.5),
      dp_accounting.GaussianDpEvent(3.0)
  ])
  ledger = privacy_ledger.PrivacyLedger()
  ledger.record(1, accounting.round_event(from_tff, N, K))
  ledger.record(2, accounting.round_event(plain, N, K))

  assert ledger.events[0] == ledger.events[1]
  assert ledger.composed_event().events[0].count == 2
  json.dumps(ledger.to_dict())


def test_epsilon_history_is_the_epsilon_of_each_prefix():
  ledger = privacy_ledger.PrivacyLedger()
  for round_num in range(1, 51):
    _record(ledger, round_num, 1.0 if round_num % 2 else 2.0)

  history = ledger.epsilon_history(DELTA)

  assert [r for r, _ in history] == list(range(1, 51))
  epsilons = [e for _, e in history]
  assert epsilons == sorted(epsilons)
  for round_num in (1, 2, 25, 50):
    odd, even = (round_num + 1) // 2, round_num // 2
    prefix = dp_accounting.ComposedDpEvent(
        [_poisson_rounds(1.0, N / K, odd)] +
        ([_poisson_rounds(2.0, N / K, even)] if even else []))
    assert epsilons[round_num - 1] == pytest.approx(
        accounting.compute_epsilon(prefix, DELTA).epsilon, rel=1e-12)
  assert epsilons[-1] == pytest.approx(ledger.guarantee(DELTA).epsilon,
                                       rel=1e-12)


def test_empty_ledger_has_zero_epsilon():
  assert privacy_ledger.PrivacyLedger().guarantee(DELTA).epsilon == 0
  assert privacy_ledger.PrivacyLedger().epsilon_history(DELTA) == []


def test_ledger_records_the_event_of_a_tff_dp_aggregator():
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  factory = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=1.3, clients_per_round=3, clip=1.0)
  process = factory.create(tff.TensorType(np.float32, [2]))
  state = process.initialize()
  ledger = privacy_ledger.PrivacyLedger()
  for round_num in (1, 2):
    output = process.next(state, [np.ones(2, np.float32)] * 3)
    state = output.state
    noise_event = (
        tff.aggregators.differential_privacy.extract_dp_event_from_state(
            state))
    ledger.record(round_num, accounting.round_event(noise_event, 3, 100))

  assert ledger.guarantee(DELTA).epsilon == pytest.approx(
      accounting.compute_training_epsilon(1.3, 3, 100, 2, DELTA).epsilon,
      rel=1e-6)




def test_ledger_refuses_an_event_it_cannot_account_when_recorded():
  ledger = privacy_ledger.PrivacyLedger()
  ledger.record(1, accounting.gaussian_round_event(1.0, N, K))
  with pytest.raises(ValueError, match='`event` cannot be accounted'):
    ledger.record(2, dp_accounting.PoissonSampledDpEvent(
        0.1, dp_accounting.UnsupportedDpEvent()))
  assert ledger.rounds == (1,)
  assert ledger.guarantee(DELTA).epsilon == pytest.approx(
      accounting.compute_training_epsilon(1.0, N, K, 1, DELTA).epsilon)


def _pld_oracle(rounds, guarantee):
  """dp_accounting's own PLD epsilon of `rounds`, at the report's grid (the
  tests that ask it take `dp_accounting_builds_each_round_once`)."""
  return pld.PLDAccountant(
      value_discretization_interval=guarantee.value_discretization_interval
  ).compose(rounds).get_epsilon(DELTA)


@pytest.fixture
def fresh_guarantees(monkeypatch):
  """No figure asked before in this process (each test computes its own)."""
  from tff_clip.privacy import accountants
  monkeypatch.setattr(accountants, '_GUARANTEE_CACHE',
                      collections.OrderedDict())
  monkeypatch.setattr(privacy_ledger, '_REPORTS', collections.OrderedDict())


def test_the_next_rounds_figure_is_computed_ahead(
    monkeypatch, fresh_guarantees, dp_accounting_builds_each_round_once):
  # While round 6 trains, its figure is computed on another thread, as if
  # it repeats round 5; round 6's report is then read from the cache.
  from tff_clip.privacy import accountants
  ledger = _poisson_ledger(5)
  ledger.report_ahead(DELTA).join()
  _record(ledger, 6, Z)
  monkeypatch.setattr(accountants, '_guarantee', lambda *args: pytest.fail(
      'computed again'))
  report = ledger.report(DELTA)
  assert report.accountant == 'pld'
  assert report.epsilon == pytest.approx(
      _pld_oracle(_poisson_rounds(Z, N / K, 6), report), rel=1e-12)


def test_a_figure_asked_before_starts_no_thread_ahead(
    fresh_guarantees, dp_accounting_builds_each_round_once):
  # A sweep's later trainings ask their rounds' figures again: the cache
  # holds them, and nothing is computed on another thread.
  _poisson_ledger(5).report_ahead(DELTA).join()
  again = _poisson_ledger(5)
  assert again.report_ahead(DELTA) is None
  _record(again, 6, Z)
  assert again.report(DELTA).epsilon == pytest.approx(_pld_oracle(
      _poisson_rounds(Z, N / K, 6), again.report(DELTA)), rel=1e-12)
  thread = _poisson_ledger(4).report_ahead(DELTA)  # Another question.
  assert thread is not None
  thread.join()


def test_a_report_of_the_same_rounds_is_read_and_any_other_is_computed(
    monkeypatch, fresh_guarantees, dp_accounting_builds_each_round_once):
  first = _poisson_ledger(3).report(DELTA)
  computed = []
  report_epsilon = accounting.report_epsilon
  monkeypatch.setattr(accounting, 'report_epsilon',
                      lambda *args: computed.append(1) or report_epsilon(*args))
  assert _poisson_ledger(3).report(DELTA) is first  # Another run's ledger.
  assert not computed
  ledger = _poisson_ledger(3)
  _record(ledger, 4, Z)
  other_z = _poisson_ledger(3)
  _record(other_z, 4, 1.5 * Z)
  for got, rounds, delta in (
      (ledger.report(DELTA), _poisson_rounds(Z, N / K, 4), DELTA),
      (_poisson_ledger(3).report(2 * DELTA), _poisson_rounds(Z, N / K, 3),
       2 * DELTA),
      (other_z.report(DELTA), dp_accounting.ComposedDpEvent(
          [_poisson_rounds(Z, N / K, 3), _poisson_rounds(1.5 * Z, N / K, 1)]),
       DELTA)):
    assert got.epsilon == pytest.approx(pld.PLDAccountant(
        value_discretization_interval=got.value_discretization_interval
    ).compose(rounds).get_epsilon(delta), rel=1e-12)
  assert len(computed) == 3


def test_a_next_round_unlike_the_last_is_reported_as_it_ran(
    fresh_guarantees, dp_accounting_builds_each_round_once):
  ledger = _poisson_ledger(5)
  ledger.report_ahead(DELTA).join()  # Computed for a sixth round at Z.
  _record(ledger, 6, 1.5 * Z)
  report = ledger.report(DELTA)
  rounds = dp_accounting.ComposedDpEvent(
      [_poisson_rounds(Z, N / K, 5), _poisson_rounds(1.5 * Z, N / K, 1)])
  assert report.epsilon == pytest.approx(_pld_oracle(rounds, report),
                                         rel=1e-12)
  assert privacy_ledger.PrivacyLedger().report_ahead(DELTA) is None


def test_computations_ahead_run_in_turn_on_one_thread_past_errors():
  from tff_clip.privacy import accountants
  ran = []

  def compute(i):
    ran.append((i, threading.current_thread().name))
    if i == 1:
      raise ValueError('dropped, as a cache warmer\'s errors are')

  jobs = [accountants.ahead(lambda i=i: compute(i)) for i in range(4)]
  assert all(job.join(timeout=60) for job in jobs)
  assert [i for i, _ in ran] == [0, 1, 2, 3]
  assert {name for _, name in ran} == {'epsilon ahead'}
  assert threading.current_thread().name != 'epsilon ahead'
