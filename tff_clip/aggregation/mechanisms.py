"""The registries: every bounding and every noise mechanism, by public name.

A bounding (`tff_clip.aggregation.boundings`) and a noise mechanism
(`tff_clip.aggregation.noise_mechanisms`, `tff_clip.aggregation.correlated_noise`) are each one
small class; the two lists below are the one place that names them. Every
other module looks a name up here -- an unknown name is refused at the
lookup, with the known ones -- and then asks the object: is it per-layer,
what noise does round t add, what does a participation cost, which
placement and participation does it need. Adding one is a class and a line
here; `register` adds one from outside the library (e.g. in a test).

No TensorFlow import: the command line checks its flags against these
names before TensorFlow loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from tff_clip import checks
from tff_clip.aggregation import blt
from tff_clip.aggregation import boundings
from tff_clip.aggregation import correlated_noise
from tff_clip.aggregation import noise_mechanisms

__all__ = ['BOUNDINGS', 'NOISE_MECHANISMS', 'Registry', 'bounding',
           'noise_mechanism', 'noise_mechanism_from']


class Registry:
  """Classes by their `name`, in the order given; looked up by `get`."""

  def __init__(self, label: str, classes):
    self._label = label
    self._classes = {}
    for cls in classes:
      self.register(cls)

  @property
  def names(self) -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(self._classes)

  @property
  def classes(self) -> tuple[type, ...]:
    """The registered classes, in registration order."""
    return tuple(self._classes.values())

  def __iter__(self):
    return iter(self._classes)

  def __contains__(self, name) -> bool:
    return isinstance(name, str) and name in self._classes

  def get(self, name, label: Optional[str] = None) -> type:
    """The class registered as `name`; ValueError naming `label` (default:
    the registry's) and the known names for any other value."""
    return self._classes[checks.one_of(name, label or self._label,
                                       self.names)]

  def register(self, cls: type) -> type:
    """Adds `cls` under `cls.name` (refused if the name is taken)."""
    name = getattr(cls, 'name', None)
    if not isinstance(name, str) or not name:
      raise ValueError(f'{cls!r} has no `name` to be registered under.')
    if name in self._classes:
      raise ValueError(f'`{self._label}` {name!r} is already registered '
                       f'({self._classes[name]!r}).')
    self._classes[name] = cls
    return cls

  def unregister(self, name: str) -> None:
    """Removes `name` (e.g. a class a test registered)."""
    self.get(name)
    del self._classes[name]


BOUNDINGS = Registry('bounding_method', [
    boundings.Clip,
    boundings.Normalize,
    boundings.PerLayerClip,
    boundings.PerLayerNormalize,
    boundings.NoiseFollowing,
])

NOISE_MECHANISMS = Registry('noise_mechanism', [
    noise_mechanisms.Independent,
    correlated_noise.Tree,
    correlated_noise.Banded,
    blt.Blt,
])


def bounding(name, label: str = 'bounding_method') -> boundings.Bounding:
  """The bounding registered as `name` (ValueError naming `label`). A
  `Bounding` given as `name` is returned as it is."""
  if isinstance(name, boundings.Bounding):
    return name
  return BOUNDINGS.get(name, label)()


def noise_mechanism(name, bands: int = 1, *,
                    rounds: Optional[int] = None,
                    separation: Optional[int] = None,
                    **options) -> noise_mechanisms.NoiseMechanism:
  """The noise mechanism registered as `name`, for `bands`, `rounds` and the
  participation `separation` (see `NoiseMechanism`); of `options` (e.g.
  `blt_buffers`), those the class declares in its `options`. A
  `NoiseMechanism` given as `name` is returned as it is."""
  if isinstance(name, noise_mechanisms.NoiseMechanism):
    return name
  known = {option for cls in NOISE_MECHANISMS.classes
           for option in cls.options}
  unknown = sorted(set(options) - known)
  if unknown:
    raise TypeError(f'`{unknown[0]}` is an option of no noise mechanism; '
                    f'the options are {sorted(known)}.')
  cls = NOISE_MECHANISMS.get(name)
  return cls(bands, rounds=rounds, separation=separation,
             **{key: value for key, value in options.items()
                if key in cls.options})


def noise_mechanism_from(parameters: Mapping[str, Any],
                         separation: Optional[int]
                         ) -> noise_mechanisms.NoiseMechanism:
  """The noise mechanism that DP `parameters` (by `tff_clip.aggregation.spec.DPSpec`'s
  names) describe, for participation with minimum `separation`: its name,
  `bands`, `rounds` and the options its class declares."""
  cls = NOISE_MECHANISMS.get(parameters['noise_mechanism'])
  return cls(parameters['bands'], rounds=parameters['rounds'],
             separation=separation,
             **{option: parameters[option] for option in cls.options})
