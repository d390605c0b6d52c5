"""trax 1.4.1's own test files, with trax_revplus and with stock trax.

Loaded from the installed trax package (see `trax_test_files`):
`trax/layers/reversible_test.py`, `trax/optimizers/trainer_test.py` and
`trax/supervised/training_test.py`. Each test runs with
`trax_revplus.activate()` applied first and, where `trax_test_files.matrix`
says, with stock trax; each must end as the tables of `trax_test_files`
predict.
"""

import pytest

import trax_test_files

# trax test module -> its TestCase class. The classes are kept in a dict,
# not as module attributes: pytest would collect a TestCase class itself and
# run it once more, without trax_revplus.
_TRAX_TEST_FILES = {
  'trax.layers.reversible_test': 'ReversibleLayerTest',
  'trax.optimizers.trainer_test': 'TrainerTest',
  'trax.supervised.training_test': 'TrainingTest',
}
_CLASSES = {
  class_name: getattr(trax_test_files.load(module), class_name)
  for module, class_name in _TRAX_TEST_FILES.items()
}

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


@pytest.mark.parametrize(
  'test_id,implementation',
  [
    pair
    for test_class in _CLASSES.values()
    for pair in trax_test_files.matrix(test_class)
  ],
)
def test_trax_test(test_id, implementation):
  test_class = _CLASSES[test_id.split('.', 1)[0]]
  trax_test_files.check(test_class, test_id, implementation)
