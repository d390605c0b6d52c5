"""The one door to trax's private names.

trax_revplus extends trax 1.4.1 where trax has no public hook: it reads and
sets private attributes of trax's `Loop`, trainers and layers, calls a few
private trax functions and wraps private `Loop` methods. Every such access
goes through a named function of this package, whose docstring names the
trax name and what we rely on; nothing else in trax_revplus names a private
trax attribute. Each function records the trax names it uses in
`registry.PRIVATE_NAMES`, and the tests check every one of them against the
installed trax (`tests/test_trax_door.py`), so that a trax upgrade that
renames or reshapes one fails in one place. What we patch on trax's classes
and objects, by whom and why, is listed in `patches.PATCHES`.

Modules:
  registry: `PrivateName`, `PRIVATE_NAMES` and the `uses` decorator.
  loop: a `training.Loop`'s private attributes and methods.
  trainers: trax's default `Trainer`'s and stock `ReversibleSerialTrainer`'s.
  layers: trax layers' private attributes and methods.
  functions: private functions and classes of trax's modules.
  patches: what trax_revplus binds on trax's classes and objects.
"""
