"""dp_accounting's accountants as tff_clip uses them: events to epsilon.

`tff_clip.privacy.accounting` describes what a run did as DpEvents; this module
computes their (epsilon, delta) guarantee (`guarantee`, `PrivacyGuarantee`):
it finds the adjacency the sampling implies (`neighboring_relation`:
add-or-remove-one under Poisson sampling, replace-one under fixed-size,
never both), rewrites the event in the conventions dp_accounting 0.4.3
computes with (`accounting_view`: Gaussians on one cohort as their
equivalent Gaussian, z = 0 as non-private, z / 2 under replace-one,
google/differential-privacy#378), and runs RDP (each distinct round's RDP
computed once per process) or PLD on a grid relative to epsilon
(`pld_grid`: a power of two, so a run's rounds share a few grids, and the
PLD of each distinct sampled round is built once per grid and process).
A run reports one accountant (`reporting_accountant`): PLD wherever it can
account for the events, RDP otherwise. No TensorFlow import.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import queue
import threading
from typing import Optional

import attr
import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np

from tff_clip.names import PLD, RDP
from tff_clip.privacy import pld_numpy
from tff_clip.privacy import rdp_floor

__all__ = ['ADD_OR_REMOVE', 'Ahead', 'PrivacyGuarantee', 'RDP_ORDERS',
           'REPLACE_ONE', 'accounting_view', 'check_pld_supports', 'compose',
           'guarantee', 'neighboring_relation', 'new_accountant', 'pld_grid',
           'epsilon_label', 'format_epsilon', 'merge_float_neighbours',
           'reporting_accountant', 'sub_events']

# dp_accounting's default Renyi orders (1.1 ... 10.9, 11 ... 63, 128 ... 1024),
# from `rdp_floor`, which gives the least epsilon they can prove.
RDP_ORDERS = rdp_floor.RDP_ORDERS
ADD_OR_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE
_ADJACENCY_NAMES = {ADD_OR_REMOVE: 'add-or-remove-one client',
                    REPLACE_ONE: 'replace-one client'}
_SAMPLED = (dp_accounting.PoissonSampledDpEvent,
            dp_accounting.SampledWithoutReplacementDpEvent,
            dp_accounting.SampledWithReplacementDpEvent)
_SILENT = (dp_accounting.NoOpDpEvent, dp_accounting.NonPrivateDpEvent)
# PLD grid = factor x epsilon, clamped; above ~700 dp_accounting's
# connect-the-dots construction overflows (epsilon is in the millions then).
_PLD_RELATIVE_GRID, _PLD_MIN_GRID, _PLD_MAX_GRID = 1e-4, 1e-6, 100.0
# PLD's cost is the privacy loss's range over the grid. Beyond this RDP
# epsilon the relative grid would pass its largest (the loss's range then
# grows as 1/z: z = 1e-10 asks for exabytes), and the guarantee is void
# anyway: PLD is not computed (`UnsupportedEventError`), RDP's figure stands.
PLD_MAX_EPSILON = _PLD_MAX_GRID / _PLD_RELATIVE_GRID
# Where PLD's epsilon is far below RDP's, the grid is refined, by at most
# this factor (a PLD epsilon of 0 asked for a grid 10^5 times finer: a
# run's last step at delta = 0.5 never ended).
_PLD_MAX_REFINEMENT = 30.0
# The grid where RDP proves epsilon = 0 (PLD cannot prove less):
# dp_accounting's default.
_PLD_GRID_AT_ZERO = 1e-4
_RDP_CACHE: dict[tuple[dp_accounting.DpEvent,
                       dp_accounting.NeighboringRelation], np.ndarray] = {}
# (z, q, grid) -> the PLD of one Poisson-sampled Gaussian round: building it
# is most of a PLD epsilon's cost (~0.5 s at grid 5e-4 on 2 cores), its
# self-composition a tenth of that. The least recently used go first, past
# _PLD_CACHE_SIZE rounds or _PLD_CACHE_BYTES of their PMFs: a sweep's
# trainings at a few epsilons each cross a few grids, and take turns.
_PLD_CACHE: collections.OrderedDict[tuple[float, float, float],
                                    pld_numpy.SampledRound] = (
                                        collections.OrderedDict())
_PLD_CACHE_SIZE = 64
_PLD_CACHE_BYTES = 256 * 2**20
# (the interpreted event, adjacency, delta, accountant, grid) -> its
# guarantee: a run's last round's figure is asked again by its summary, and
# a sweep's seeds ask each round's figure of the same events.
_GUARANTEE_CACHE: collections.OrderedDict[tuple, 'PrivacyGuarantee'] = (
    collections.OrderedDict())
_GUARANTEE_CACHE_SIZE = 4096
# Noise multipliers this close (relative) are accounted as the smaller
# (`merge_float_neighbours`): 8 float32 ulps.
_NEIGHBOUR_GAP = 2.0**-20
# The caches above are read and filled by one thread at a time: a training
# computes its next round's figure ahead on another thread (`ahead`).
_LOCK = threading.RLock()


def _locked(function):
  @functools.wraps(function)
  def with_lock(*args, **kwargs):
    with _LOCK:
      return function(*args, **kwargs)
  return with_lock


class Ahead:
  """A computation `ahead` queued; `join()` waits until it has run."""

  def __init__(self, compute):
    self.compute = compute
    self.done = threading.Event()

  def join(self, timeout: Optional[float] = None) -> bool:
    return self.done.wait(timeout)


# `ahead`'s computations, run in turn by one daemon thread, started by the
# first (a thread started each round cost the training ~0.7 ms a round:
# `start` waits for the new thread to take the interpreter): [thread, its
# queue], both made anew where the thread is gone (a forked process).
_AHEAD_WORKER: list = []
_AHEAD_START = threading.Lock()


def _run_ahead(jobs):
  while True:
    job = jobs.get()
    try:
      job.compute()
    except Exception:  # pylint: disable=broad-except
      pass
    finally:
      job.done.set()


def ahead(compute) -> Ahead:
  """`compute()` on a daemon thread, for what it leaves in the caches (its
  result and errors are dropped: whoever asks the same question later gets
  the cached answer, or computes it, errors included). The computations run
  one at a time, in the order asked."""
  job = Ahead(compute)
  with _AHEAD_START:
    if not (_AHEAD_WORKER and _AHEAD_WORKER[0].is_alive()):
      jobs = queue.SimpleQueue()
      worker = threading.Thread(target=_run_ahead, args=(jobs,),
                                name='epsilon ahead', daemon=True)
      worker.start()
      _AHEAD_WORKER[:] = [worker, jobs]
    _AHEAD_WORKER[1].put(job)
  return job


def sub_events(event) -> list:
  if isinstance(event, dp_accounting.ComposedDpEvent):
    return list(event.events)
  if isinstance(event, _SAMPLED + (dp_accounting.SelfComposedDpEvent,)):
    return [event.event]
  return []


# ---------------------------------------------------------------------------
# Interpreting events: what happened -> what dp_accounting computes.


def neighboring_relation(event) -> dp_accounting.NeighboringRelation:
  """The adjacency `event` is accounted under; refuses mixed sampling."""
  kinds, pending = set(), [event]
  while pending:
    sub_event = pending.pop()
    if isinstance(sub_event, _SAMPLED):
      kinds.add(type(sub_event))
    pending.extend(sub_events(sub_event))
  if dp_accounting.SampledWithoutReplacementDpEvent not in kinds:
    return ADD_OR_REMOVE
  if len(kinds) > 1:
    raise ValueError(
        'Cannot compose fixed-size (without replacement) sampled rounds with '
        'other sampling: fixed-size sampling is analysed under replace-one '
        'adjacency, Poisson sampling under add-or-remove-one, and no '
        f'accountant composes the two. Sampling found: '
        f'{sorted(k.__name__ for k in kinds)}.')
  return REPLACE_ONE


def _effective_noise_multiplier(event) -> Optional[float]:
  """z of the one Gaussian equivalent to a composition of Gaussians.

  Gaussians z_i on one cohort release exactly what one Gaussian with
  z = (sum_i z_i^-2)^-1/2 releases (as in dp_accounting's RDP accountant);
  PLD accepts only a bare Gaussian under sampling. None if not all Gaussian.
  """
  if isinstance(event, dp_accounting.GaussianDpEvent):
    return float(event.noise_multiplier)
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    inner = _effective_noise_multiplier(event.event)
    if inner is None:
      return None
    return inner / math.sqrt(event.count) if event.count else math.inf
  if isinstance(event, dp_accounting.ComposedDpEvent):
    precision = 0.0
    for sub_event in event.events:
      inner = _effective_noise_multiplier(sub_event)
      if inner is None or inner == 0:
        return inner
      precision += inner**-2
    return math.inf if precision == 0 else precision**-0.5
  return None


def _gaussian_for(noise_multiplier: float, relation):
  if noise_multiplier == 0:
    return dp_accounting.NonPrivateDpEvent()
  if math.isinf(noise_multiplier):
    return dp_accounting.NoOpDpEvent()
  if relation == REPLACE_ONE:
    noise_multiplier /= 2  # Sensitivity 2C: google/differential-privacy#378.
  return dp_accounting.GaussianDpEvent(noise_multiplier)


def accounting_view(event, relation) -> dp_accounting.DpEvent:
  """The same mechanism in the conventions dp_accounting 0.4.3 computes with.

  Gaussians on one cohort become their equivalent Gaussian, z = 0 becomes
  `NonPrivateDpEvent`, replace-one halves z. Other events pass unchanged
  under add-or-remove (the accountant decides) and are refused under
  replace-one, where their sensitivity is unknown.
  """
  if isinstance(event, _SILENT):
    return event
  if isinstance(event, (dp_accounting.PoissonSampledDpEvent,
                        dp_accounting.SampledWithoutReplacementDpEvent)):
    noise_multiplier = _effective_noise_multiplier(event.event)
    inner = (accounting_view(event.event, relation) if noise_multiplier is None
             else _gaussian_for(noise_multiplier, relation))
    if isinstance(inner, _SILENT):
      return inner
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
      return dp_accounting.PoissonSampledDpEvent(
          float(event.sampling_probability), inner)
    return dp_accounting.SampledWithoutReplacementDpEvent(
        int(event.source_dataset_size), int(event.sample_size), inner)
  if isinstance(event, dp_accounting.GaussianDpEvent):
    return _gaussian_for(float(event.noise_multiplier), relation)
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return dp_accounting.SelfComposedDpEvent(
        accounting_view(event.event, relation), int(event.count))
  if isinstance(event, dp_accounting.ComposedDpEvent):
    return dp_accounting.ComposedDpEvent(
        [accounting_view(e, relation) for e in event.events])
  if relation == REPLACE_ONE:
    raise dp_accounting.UnsupportedEventError(
        f'{type(event).__name__} cannot be accounted under replace-one '
        '(fixed-size sampling) adjacency by tff_clip: its sensitivity under '
        'replacement is not known. Use Gaussian noise events.')
  return event


def _releases_nothing(event) -> bool:
  if isinstance(event, dp_accounting.NoOpDpEvent):
    return True
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return event.count == 0 or _releases_nothing(event.event)
  if isinstance(event, dp_accounting.ComposedDpEvent):
    return all(_releases_nothing(e) for e in event.events)
  return False


def _epsilon_from_rdp(orders, rdp_values, delta: float) -> tuple[float, float]:
  """`rdp.compute_epsilon` with every RDP value raised to 2 delta^2.

  Below about delta^2, `compute_epsilon` answers epsilon = 0 (its KL
  shortcut), and for huge noise dp_accounting's RDP is that small only by
  rounding (exactly 0 at order 1.1 for z = 1000, q = 1e-4; true value 5e-15).
  Overstating RDP keeps a valid bound and turns the shortcut off.
  """
  epsilon, order = rdp.compute_epsilon(
      orders, np.maximum(np.asarray(rdp_values, np.float64), 2 * delta**2),
      delta)
  return float(epsilon), float(order)


class _RdpAccountant(rdp.RdpAccountant):
  """dp_accounting's RDP accountant, converting with `_epsilon_from_rdp`."""

  def get_epsilon(self, target_delta):
    return _epsilon_from_rdp(self.orders, self.rdp, target_delta)[0]


@_locked
def _sampled_round(key) -> pld_numpy.SampledRound:
  """`_PLD_CACHE`'s round of `key` (z, q, grid), built if not kept."""
  found = _PLD_CACHE.get(key)
  if found is not None:
    _PLD_CACHE.move_to_end(key)
    return found
  found = _PLD_CACHE[key] = pld_numpy.SampledRound(
      pld_numpy.gaussian_round(*key))
  while len(_PLD_CACHE) > 1 and (
      len(_PLD_CACHE) > _PLD_CACHE_SIZE or
      sum(kept.nbytes for kept in _PLD_CACHE.values()) > _PLD_CACHE_BYTES):
    _PLD_CACHE.popitem(last=False)
  return found


class _PldAccountant(pld.PLDAccountant):
  """dp_accounting's PLD accountant, the PLD of each distinct Poisson-sampled
  Gaussian built once per grid (`_PLD_CACHE`, `pld_numpy.gaussian_round`):
  the same arithmetic on the same inputs, so the same epsilon, without
  rebuilding it every round."""

  @_locked  # A kept round (its compositions) is used by one thread at once.
  def _maybe_compose(self, event, count, do_compose):
    if count == 0 and isinstance(event, (dp_accounting.PoissonSampledDpEvent,
                                         dp_accounting.GaussianDpEvent)):
      return None  # Composed no times: nothing, as RDP's sum skips it.
    if (do_compose and isinstance(event, dp_accounting.PoissonSampledDpEvent)
        and isinstance(event.event, dp_accounting.GaussianDpEvent) and
        event.sampling_probability != 0 and
        event.event.noise_multiplier != 0 and
        self.neighboring_relation == ADD_OR_REMOVE):
      key = (float(event.event.noise_multiplier),
             float(event.sampling_probability),
             float(self._value_discretization_interval))
      self._pld = pld_numpy.compose(self._pld,
                                    _sampled_round(key).self_compose(count))
      return None
    if (do_compose and isinstance(event, dp_accounting.GaussianDpEvent) and
        event.noise_multiplier != 0):
      # As dp_accounting composes it (a banded or BLT run's rounds: a new
      # noise every round), built in NumPy.
      self._pld = pld_numpy.compose(self._pld, pld_numpy.gaussian_round(
          event.noise_multiplier / math.sqrt(count), 1.0,
          self._value_discretization_interval))
      return None
    return super()._maybe_compose(event, count, do_compose)

  def get_epsilon(self, target_delta: float) -> float:
    if self._contains_non_dp_event:
      return math.inf
    return pld_numpy.pld_epsilon(self._pld, target_delta)


def new_accountant(accountant: str, relation, grid: Optional[float] = None):
  if accountant == RDP:
    return _RdpAccountant(RDP_ORDERS, neighboring_relation=relation)
  return _PldAccountant(relation, value_discretization_interval=grid)


def compose(accountant: str, view, relation, grid=None):
  """A fresh accountant that composed the (interpreted) event `view`."""
  try:
    return new_accountant(accountant, relation, grid).compose(view)
  except dp_accounting.UnsupportedEventError as error:
    raise dp_accounting.UnsupportedEventError(
        f'The {accountant.upper()} accountant cannot account for {view}. '
        f'({error})') from error


def _rdp(view, relation) -> np.ndarray:
  """RDP of `view` at `RDP_ORDERS`, as dp_accounting's RDP accountant adds it.

  The RDP of each composed event (each round) is computed once per process:
  a ledger's epsilon after every round costs nothing per distinct round
  already seen (fixed-size sampling takes ~0.5 s per new one).
  """
  total, pending = np.zeros(len(RDP_ORDERS)), [(view, 1)]
  while pending:  # Depth first, in order: the accountant's order of sums.
    event, count = pending.pop()
    if isinstance(event, dp_accounting.ComposedDpEvent):
      pending.extend((e, count) for e in reversed(event.events))
    elif isinstance(event, dp_accounting.SelfComposedDpEvent):
      pending.append((event.event, count * event.count))
    elif count:
      total += count * _cached_rdp(event, relation)
  return total


@_locked
def _cached_rdp(event, relation) -> np.ndarray:
  # Keyed by the event itself (its fields compared exactly, so float32(1.1)
  # is not 1.1); an unhashable event (a list inside) is not cached.
  try:
    return _RDP_CACHE[(event, relation)]
  except KeyError:
    if len(_RDP_CACHE) > 4096:
      _RDP_CACHE.clear()
    value = _RDP_CACHE[(event, relation)] = compose(RDP, event, relation).rdp
  except TypeError:
    value = compose(RDP, event, relation).rdp
  return value


def check_pld_supports(view, relation) -> None:
  # Before any (possibly slow) RDP pass that would only size the PLD grid.
  if not new_accountant(PLD, relation, 1.0).supports(view):
    message = (
        'The PLD accountant cannot account for fixed-size sampling without '
        'replacement (SampledWithoutReplacementDpEvent): dp_accounting has no '
        'PLD for it. Use accountant="rdp" (replace-one adjacency), or Poisson '
        'sampling.' if relation == REPLACE_ONE else
        f'The PLD accountant cannot account for {view}.')
    raise dp_accounting.UnsupportedEventError(
        f'{message} (unsupported by dp_accounting.pld.PLDAccountant)')


def pld_grid(epsilon: float) -> float:
  """1e-4 x `epsilon` rounded down to a power of two, in [1e-6, 100]: as
  epsilon grows over a run, its rounds share a few grids (and the PLD of a
  round is built once per grid, `_PldAccountant`)."""
  if not math.isfinite(epsilon) or epsilon <= 0:
    return 1.0  # Unused: a non-private event gives inf on every grid.
  grid = 2.0**math.floor(math.log2(_PLD_RELATIVE_GRID * epsilon))
  return min(_PLD_MAX_GRID, max(_PLD_MIN_GRID, grid))


def reporting_accountant(view, relation) -> str:
  """The accountant a run reports (and calibrates) with: PLD wherever it
  can account for the (interpreted) events, RDP otherwise (fixed-size
  sampling, tree restarts)."""
  return PLD if new_accountant(PLD, relation, 1.0).supports(view) else RDP


# ---------------------------------------------------------------------------
# Epsilon.


@dataclasses.dataclass(frozen=True)
class PrivacyGuarantee:
  """An (epsilon, delta)-DP guarantee and how it was obtained.

  `epsilon` is `math.inf` when no finite one was shown (zero noise);
  `adjacency` 'add-or-remove-one client' (Poisson) or 'replace-one client'
  (fixed-size). RDP gives its minimising `rdp_order` (at `max(RDP_ORDERS)`
  the order grid limits RDP: PLD is much tighter), PLD its grid.
  """
  epsilon: float
  delta: float
  accountant: str
  adjacency: str
  rdp_order: Optional[float] = None
  value_discretization_interval: Optional[float] = None

  def label(self, private: bool = True) -> str:
    """'epsilon 7.98 (PLD, delta 1e-06)', as every report shows it; with
    `private=False` (a seeded, predictable noise) marked NOT private."""
    return epsilon_label(self.epsilon, self.accountant, self.delta, private)


def format_epsilon(epsilon) -> str:
  """Epsilon as printed: never 0 for a noisy mechanism (it is only small)."""
  if epsilon is None or not math.isfinite(epsilon):
    return 'infinite'
  if epsilon < 1e-3:
    return '< 0.001'
  return f'{epsilon:.4g}'


def epsilon_label(epsilon, accountant: str, delta: float,
                  private: bool = True) -> str:
  """'epsilon 7.98 (PLD, delta 1e-06)'; 'NOT private' when `private` is
  False (the noise is predictable: epsilon then guarantees nothing)."""
  shown = (format_epsilon(epsilon) if epsilon is None or epsilon < 1e-3 or
           epsilon >= 1e6 or not math.isfinite(epsilon) else f'{epsilon:.3f}')
  text = f'epsilon {shown} ({accountant.upper()}, delta {delta:g})'
  return text if private else text + ' NOT private (seeded noise)'


def event_key(value):
  """A hashable key equal exactly when two events are (each value's type
  kept: float32(1.1) is not 1.1)."""
  if isinstance(value, dp_accounting.DpEvent):
    return (type(value),) + tuple(
        (field.name, event_key(getattr(value, field.name)))
        for field in attr.fields(type(value)))
  if isinstance(value, (list, tuple)):
    return (type(value),) + tuple(event_key(item) for item in value)
  return (type(value), value)


def merge_float_neighbours(view):
  """`view` with its Poisson-sampled Gaussian rounds whose noise multipliers
  agree to within `_NEIGHBOUR_GAP` (relative) accounted together, at the
  smallest of them; `view` itself where there is nothing to merge.

  TFF's adaptive query recomputes its value's z in float32 every round, so a
  run's ledger holds rounds 1-3 float32 ulps apart (1.2398608922958374,
  1.2398609011505127, ...), and composing them one by one costs a PLD
  composition per distinct value after every round. The privacy loss of a
  Gaussian grows as z falls, so accounting each at its group's least z is an
  upper bound on the exact composition (by about 1e-7 relative in z: the
  figures move in their 7th digit), and one self-composition.
  """
  if not isinstance(view, dp_accounting.ComposedDpEvent):
    return view
  rounds, others = [], []  # rounds: (q, z, count)
  for event in view.events:
    inner, count = event, 1
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
      inner, count = event.event, event.count
    if (isinstance(inner, dp_accounting.PoissonSampledDpEvent) and
        isinstance(inner.event, dp_accounting.GaussianDpEvent)):
      rounds.append((inner.sampling_probability,
                     inner.event.noise_multiplier, count))
    else:
      others.append(event)
  groups = []  # [q, least z, count, largest z]
  for q, z, count in sorted(rounds, key=lambda r: (r[0], r[1])):
    if groups and groups[-1][0] == q and z <= groups[-1][1] * (
        1 + _NEIGHBOUR_GAP):
      groups[-1][2:] = groups[-1][2] + count, z
    else:
      groups.append([q, z, count, z])
  if all(least == largest for _, least, _, largest in groups):
    return view  # No neighbours: the events as given.
  return dp_accounting.ComposedDpEvent(others + [
      dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
          q, dp_accounting.GaussianDpEvent(z)), count)
      for q, z, count, _ in groups])


def _question(view, relation, delta, accountant, grid):
  """(the view, float32 neighbours merged; its `_GUARANTEE_CACHE` key, or
  None where a field is unhashable: computed, not cached)."""
  view = merge_float_neighbours(view)
  try:
    key = (event_key(view), relation, type(delta), delta, accountant,
           type(grid), grid)
    hash(key)
  except TypeError:
    return view, None
  return view, key


def known(view, relation, delta, accountant, grid) -> bool:
  """Whether `guarantee` of these arguments is answered from its cache;
  False, without waiting, while another thread computes a guarantee."""
  if not _LOCK.acquire(blocking=False):
    return False
  try:
    _, key = _question(view, relation, delta, accountant, grid)
    return key is not None and key in _GUARANTEE_CACHE
  finally:
    _LOCK.release()


@_locked
def guarantee(view, relation, delta, accountant, grid) -> PrivacyGuarantee:
  """Runs one accountant on an interpreted event (each distinct question
  answered once per process: the same arithmetic on the same inputs), its
  rounds of float32-neighbouring noise merged (`merge_float_neighbours`)."""
  view, key = _question(view, relation, delta, accountant, grid)
  if key is None:
    return _guarantee(view, relation, delta, accountant, grid)
  found = _GUARANTEE_CACHE.get(key)
  if found is None:
    found = _guarantee(view, relation, delta, accountant, grid)
    if len(_GUARANTEE_CACHE) >= _GUARANTEE_CACHE_SIZE:
      _GUARANTEE_CACHE.popitem(last=False)  # The least recently used.
    _GUARANTEE_CACHE[key] = found
  else:
    _GUARANTEE_CACHE.move_to_end(key)
  return found


def _guarantee(view, relation, delta, accountant, grid) -> PrivacyGuarantee:
  adjacency = _ADJACENCY_NAMES[relation]
  if _releases_nothing(view):
    # E.g. an empty ledger (RDP would give its 2 delta^2 floor's epsilon).
    return PrivacyGuarantee(0.0, delta, accountant, adjacency)
  if accountant == RDP:
    epsilon, order = _epsilon_from_rdp(RDP_ORDERS, _rdp(view, relation), delta)
    return PrivacyGuarantee(epsilon, delta, RDP, adjacency, rdp_order=order)
  check_pld_supports(view, relation)

  def pld_epsilon(grid: float) -> float:
    return float(compose(PLD, view, relation, grid).get_epsilon(delta))

  if grid is None:
    try:
      rdp_epsilon = guarantee(view, relation, delta, RDP, None).epsilon
    except dp_accounting.UnsupportedEventError:
      rdp_epsilon = None
    if rdp_epsilon is not None and PLD_MAX_EPSILON < rdp_epsilon < math.inf:
      raise dp_accounting.UnsupportedEventError(
          f'PLD is not computed above epsilon {PLD_MAX_EPSILON:g} (RDP gives '
          f'{rdp_epsilon:.3g}): its grid would not fit in memory, and the '
          'guarantee is void either way.')
    grid = (1e-4 if rdp_epsilon is None else
            _PLD_GRID_AT_ZERO if rdp_epsilon == 0 else pld_grid(rdp_epsilon))
    epsilon = pld_epsilon(grid)
    finer = max(pld_grid(epsilon), grid / _PLD_MAX_REFINEMENT)
    if epsilon > 0 and finer < grid / 3:
      # RDP far above PLD (small epsilons, RDP limited by its largest order):
      # size the grid by PLD's own answer; both passes are upper bounds.
      epsilon, grid = min((epsilon, grid), (pld_epsilon(finer), finer))
  else:
    epsilon = pld_epsilon(grid)
  return PrivacyGuarantee(epsilon, delta, PLD, adjacency,
                          value_discretization_interval=grid)
