"""The supported API: the names `trax_revplus` and `trax_revplus.trainer`
list, each resolving to the object its implementation defines, and
`import trax_revplus` staying free of trax."""

import subprocess
import sys

import pytest

import trax_revplus


def test_every_listed_name_resolves():
  for name in trax_revplus.__all__:
    assert getattr(trax_revplus, name) is not None, name
  from trax_revplus import trainer  # pylint: disable=g-import-not-at-top

  for name in trainer.__all__:
    assert getattr(trainer, name) is not None, name
  assert trax_revplus.TrainerOptions is trainer.TrainerOptions
  assert trax_revplus.ReversibleSerialTrainer is trainer.ReversibleSerialTrainer
  assert issubclass(trainer.DeviceMemoryBudgetError, trainer.MemoryBudgetError)
  assert issubclass(trainer.HostMemoryBudgetError, trainer.MemoryBudgetError)


def test_trainer_names_its_public_home():
  from trax_revplus import trainer  # pylint: disable=g-import-not-at-top

  assert trainer.ReversibleSerialTrainer.__module__ == 'trax_revplus.trainer'


def test_importing_the_package_does_not_import_trax():
  code = (
    'import sys, trax_revplus; '
    'assert "trax" not in sys.modules and "jax" not in sys.modules; '
    'assert "TrainerOptions" in dir(trax_revplus)'
  )
  subprocess.run([sys.executable, '-c', code], check=True)


def test_an_unknown_name_is_an_attribute_error():
  with pytest.raises(AttributeError, match='NoSuchName'):
    _ = trax_revplus.NoSuchName
