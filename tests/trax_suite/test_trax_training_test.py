"""trax 1.4.1's own `trax/supervised/training_test.py`: stock, trax_revplus.

Loaded from the installed trax package (see `trax_test_files`): each test
runs with `trax_revplus.activate()` applied first and, where
`trax_test_files.matrix` says, with stock trax; each must end as the tables
of `trax_test_files` predict.
"""

import pytest

import trax_test_files

# A module attribute, not the class: pytest would collect a TestCase class
# itself and run it a third time, without trax_revplus.
_TRAX_TESTS = trax_test_files.load('trax.supervised.training_test')

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')
_CLASS_NAME = 'TrainingTest'


@pytest.mark.parametrize(
    'test_id,implementation',
    trax_test_files.matrix(getattr(_TRAX_TESTS, _CLASS_NAME)))
def test_trax_training_test(test_id, implementation):
  trax_test_files.check(getattr(_TRAX_TESTS, _CLASS_NAME), test_id,
                        implementation)
