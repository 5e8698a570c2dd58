"""The privacy ledger of a run: the DpEvent of every round that actually ran.

dp_accounting describes a mechanism and its accountants compute epsilon; what
it lacks is the record of a training run that can be checkpointed and
resumed without counting a round twice. This module is that record and its
JSON format; epsilon is always `tff_clip.privacy.accounting.compute_epsilon` of the
composition of the recorded events. No TensorFlow import.
"""

from __future__ import annotations

import collections
import numbers
from collections.abc import Mapping
from typing import Any, Optional

import attr
import dp_accounting
from dp_accounting import dp_event as dp_event_lib

from tff_clip import checks
from tff_clip.names import RDP
from tff_clip.privacy import accounting
from tff_clip.privacy import accountants

__all__ = ['PrivacyLedger', 'event_from_dict', 'event_to_dict']

# The format's name predates this module; run directories keep loading.
_FORMAT, _VERSION = 'tff_clip.privacy.accounting.PrivacyLedger', 1
# (each distinct event's exact key with its count, delta) -> `report`: the
# trainings of a sweep or of the frontier's grid ask every round's figure
# of the same events again, and this key is a hundredth of the cost of
# interpreting the composed event for `accounting.report_epsilon`'s cache.
# The least recently used go first.
_REPORTS = collections.OrderedDict()
_REPORTS_KEPT = 4096
# Only these classes are ever built from a dict: never a module it names, as
# `DpEvent.from_named_tuple` would import (a checkpoint is data, not code).
_EVENT_CLASSES = {
    name: cls for name, cls in vars(dp_event_lib).items()
    if isinstance(cls, type) and issubclass(cls, dp_accounting.DpEvent)}


def _to_plain(value):
  if isinstance(value, dp_accounting.DpEvent):
    return event_to_dict(value)
  if isinstance(value, (list, tuple)):
    return [_to_plain(v) for v in value]
  if isinstance(value, (bool, str)) or value is None:
    return value
  if isinstance(value, numbers.Real):
    return int(value) if isinstance(value, numbers.Integral) else float(value)
  raise TypeError(f'Cannot serialise DpEvent field value {value!r}.')


def event_to_dict(event: dp_accounting.DpEvent) -> dict[str, Any]:
  """{'type': class name, **fields}; NumPy scalars become Python numbers."""
  if type(event).__name__ not in _EVENT_CLASSES:
    raise TypeError(f'Cannot serialise {type(event)}: only the event classes '
                    'of dp_accounting.dp_event are supported.')
  return {'type': type(event).__name__,
          **{field.name: _to_plain(getattr(event, field.name))
             for field in attr.fields(type(event))}}


def _from_plain(value):
  if isinstance(value, Mapping):
    return event_from_dict(value)
  return [_from_plain(v) for v in value] if isinstance(value, list) else value


def event_from_dict(data: Mapping[str, Any]) -> dp_accounting.DpEvent:
  """The inverse of `event_to_dict`."""
  if not isinstance(data, Mapping) or data.get('type') not in _EVENT_CLASSES:
    raise ValueError(f'Not a serialised dp_accounting event: {data!r}.')
  cls = _EVENT_CLASSES[data['type']]
  fields = {f.name for f in attr.fields(cls)}
  if set(data) - {'type'} != fields:
    raise ValueError(f'Fields of serialised {data["type"]} must be '
                     f'{sorted(fields)}; got {sorted(set(data) - {"type"})}.')
  return cls(**{name: _from_plain(data[name]) for name in fields})


class PrivacyLedger:
  """The DpEvents a training run actually ran, one per round.

  Record each round's event after it ran, e.g. with TFF:

    noise_event = (tff.aggregators.differential_privacy
                   .extract_dp_event_from_state(aggregator_state))
    ledger.record(round_num, accounting.round_event(
        noise_event, clients_per_round, population_size, sampling='poisson'))

  A round number recorded twice raises, so a run resumed from a checkpoint
  (`to_dict` / `from_dict`) never counts a round twice.
  """

  def __init__(self):
    self._index: dict[int, int] = {}  # round_num -> index in _distinct
    self._distinct: list[dp_accounting.DpEvent] = []
    self._counts = collections.Counter()  # index in _distinct -> rounds
    self._keys: list[tuple] = []  # `accountants.event_key` of _distinct

  def __len__(self) -> int:
    return len(self._index)

  def __repr__(self) -> str:
    return (f'PrivacyLedger({len(self)} rounds, {len(self._distinct)} '
            'distinct events)')

  @property
  def rounds(self) -> tuple[int, ...]:
    """The recorded round numbers, ascending."""
    return tuple(sorted(self._index))

  @property
  def events(self) -> tuple[dp_accounting.DpEvent, ...]:
    """The recorded events, in ascending round order."""
    return tuple(self._distinct[self._index[r]] for r in self.rounds)

  def record(self, round_num: int, event: dp_accounting.DpEvent) -> None:
    """Records that round `round_num` ran `event` (its sampling included).

    Raises:
      ValueError: A bad or already recorded `round_num`; an `event` that
        cannot be accounted together with the recorded ones (e.g. Poisson
        and fixed-size rounds mixed): a ledger never holds a release it
        cannot account.
      TypeError: If `event` is not a `dp_accounting.DpEvent`.
    """
    if (isinstance(round_num, bool) or
        not isinstance(round_num, numbers.Integral) or round_num < 0):
      raise ValueError('`round_num` must be a non-negative integer; got '
                       f'{round_num!r}.')
    if not isinstance(event, dp_accounting.DpEvent):
      raise TypeError(
          f'`event` must be a dp_accounting.DpEvent; got {type(event)}.')
    if round_num in self._index:
      raise ValueError(f'`round_num` {round_num} is already recorded; a round '
                       'must never be counted twice.')
    # Python numbers and lists: equal events compare equal (TFF gives NumPy
    # scalars and tuples) and survive serialisation unchanged.
    event = event_from_dict(event_to_dict(event))
    if event not in self._distinct:
      try:  # Accounted before it is recorded (RDP of each event is cached).
        accounting.compute_epsilon(
            dp_accounting.ComposedDpEvent(self._distinct + [event]),
            checks.MAX_DELTA)
      except dp_accounting.UnsupportedEventError as error:
        raise ValueError(f'`event` cannot be accounted: {error}') from error
      self._distinct.append(event)
      self._keys.append(accountants.event_key(event))
    self._index[int(round_num)] = self._distinct.index(event)
    self._counts[self._index[int(round_num)]] += 1

  def _composed(self, counts) -> dp_accounting.DpEvent:
    if not counts:
      return dp_accounting.NoOpDpEvent()
    return dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(self._distinct[i], counts[i])
        for i in sorted(counts)])

  def composed_event(self) -> dp_accounting.DpEvent:
    """`ComposedDpEvent([SelfComposedDpEvent(e, count of e), ...])`.

    Over the distinct round events (composition ignores order), so an
    accountant composes each once; `NoOpDpEvent()` for an empty ledger.
    """
    return self._composed(self._counts)

  def guarantee(
      self,
      delta: float,
      accountant: str = RDP,
      value_discretization_interval: Optional[float] = None
  ) -> accounting.PrivacyGuarantee:
    """`accounting.compute_epsilon(self.composed_event(), delta, ...)`."""
    return accounting.compute_epsilon(self.composed_event(), delta, accountant,
                                      value_discretization_interval)

  def reporting_accountant(self) -> str:
    """The accountant the run reports with: PLD wherever it can account for
    the recorded events, RDP otherwise (`accounting.reporting_accountant`)."""
    return accounting.reporting_accountant(self.composed_event())

  def _report_key(self, counts, delta) -> tuple:
    return (tuple((self._keys[i], counts[i]) for i in sorted(counts)),
            type(delta), delta)

  def report(self, delta: float) -> accounting.PrivacyGuarantee:
    """The run's one epsilon: `guarantee` by `reporting_accountant()`, as
    every round's row, the summary and the end-of-run line show it
    (`accounting.report_epsilon`: RDP's where PLD's grid is refused)."""
    key = self._report_key(self._counts, delta)
    found = _REPORTS.pop(key, None)
    if found is None:
      found = accounting.report_epsilon(self.composed_event(), delta)
    _REPORTS[key] = found
    while len(_REPORTS) > _REPORTS_KEPT:
      _REPORTS.popitem(last=False)
    return found

  def report_ahead(self, delta: float):
    """`report(delta)` as it will be once the next round repeats the last
    recorded round's event, computed on another thread (`accountants.ahead`):
    the next round's report is then a cache hit, its PLD built while the
    round trains. The event is composed here, before the thread starts."""
    if not self._index:
      return None
    counts = collections.Counter(self._counts)
    counts[self._index[max(self._index)]] += 1
    if self._report_key(counts, delta) in _REPORTS:
      return None  # Reported before: the next report is known already.
    event = self._composed(counts)
    if accounting.report_known(event, delta):
      return None  # Asked before: the next report is a cache hit already.
    return accountants.ahead(lambda: accounting.report_epsilon(event, delta))

  def epsilon_history(self, delta: float) -> list[tuple[int, float]]:
    """(round_num, RDP epsilon of the rounds up to it), ascending."""
    self.guarantee(delta)  # Checks `delta`, also when nothing is recorded.
    counts, history = collections.Counter(), []
    for round_num in self.rounds:
      counts[self._index[round_num]] += 1
      history.append((round_num, accounting.compute_epsilon(
          self._composed(counts), delta).epsilon))
    return history

  def to_dict(self) -> dict[str, Any]:
    """A JSON-able dict (for checkpoints): distinct events with their rounds."""
    groups = [{'event': event_to_dict(event), 'round_nums': []}
              for event in self._distinct]
    for round_num in self.rounds:
      groups[self._index[round_num]]['round_nums'].append(round_num)
    return {'format': _FORMAT, 'version': _VERSION, 'groups': groups}

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> 'PrivacyLedger':
    """The inverse of `to_dict`; raises ValueError on a malformed dict."""
    if (not isinstance(data, Mapping) or data.get('format') != _FORMAT or
        data.get('version') != _VERSION):
      raise ValueError(f'`data` is not a version {_VERSION} {_FORMAT} dict.')
    entries = sorted(
        ((round_num, event_from_dict(group['event']))
         for group in data['groups'] for round_num in group['round_nums']),
        key=lambda entry: entry[0])
    ledger = cls()
    for round_num, event in entries:
      ledger.record(round_num, event)
    return ledger
