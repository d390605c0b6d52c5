"""The list of trax's private names trax_revplus relies on.

Every accessor of `trax_revplus.trax_door` is declared with `uses`, which
records each private trax name it touches in `PRIVATE_NAMES`. The tests
check each entry against the installed trax: that the name exists where we
look for it (an attribute of a built instance, a method or a module
function) and has the shape we rely on (`check` on an attribute's value,
the leading `parameters` of a callable we call or wrap).
"""

import dataclasses
from typing import Any, Callable, TypeVar

# What a name is, where the tests look for it.
ATTRIBUTE = 'instance attribute'  # Set by the owner class's constructor.
METHOD = 'method'  # Defined on the owner class (or a base class).
FUNCTION = 'function'  # Module-level callable of the owner module.
CLASS = 'class'  # Module-level class of the owner module.


@dataclasses.dataclass(frozen=True)
class PrivateName:
  """One private trax name and what trax_revplus relies on about it.

  Attributes:
    owner: dotted path of the trax class whose instances (ATTRIBUTE) or
      which (METHOD) have the name, or of the module (FUNCTION, CLASS).
    name: the private name, e.g. '_output_dir'.
    kind: ATTRIBUTE, METHOD, FUNCTION or CLASS.
    relied_on: what we rely on, in words.
    parameters: for a callable, the names of the leading parameters we pass
      (a method's without `self`), in order; None for an attribute.
    check: for an attribute, a predicate its value on a built instance
      satisfies; None where any value will do.
  """

  owner: str
  name: str
  kind: str
  relied_on: str
  parameters: tuple[str, ...] | None = None
  check: Callable[[Any], bool] | None = None


PRIVATE_NAMES: list[PrivateName] = []


Accessor = TypeVar('Accessor', bound=Callable[..., Any])


def uses(
  owner: str,
  name: str,
  kind: str,
  relied_on: str,
  parameters: tuple[str, ...] | None = None,
  check: Callable[[Any], bool] | None = None,
) -> Callable[[Accessor], Accessor]:
  """Declares that the decorated accessor uses trax's `owner`.`name`.

  Records a `PrivateName` (once per owner and name) and adds it to the
  function's `trax_names` attribute; stack one `uses` per name.

  Returns:
    The decorator; it returns the function itself.
  """
  entry = PrivateName(owner, name, kind, relied_on, parameters, check)
  if not any((p.owner, p.name) == (owner, name) for p in PRIVATE_NAMES):
    PRIVATE_NAMES.append(entry)

  def declare(fn: Accessor) -> Accessor:
    # setattr: a function attribute, which a callable's type declares not.
    setattr(  # noqa: B010
      fn,
      'trax_names',
      getattr(fn, 'trax_names', ()) + ((owner, name),),
    )
    return fn

  return declare
