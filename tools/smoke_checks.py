"""What the smoke scripts in tools/ share: one PASS or FAIL line per check.

Each script runs as `python tools/NAME_smoke.py`, so this module imports as
`smoke_checks` (tools/ is the script's directory on sys.path).
"""


class Checks:
  """Prints a PASS or FAIL line per check and remembers any failure.

  Attributes:
    failed: list of str, the names of the checks that failed, in order.
  """

  def __init__(self):
    self.failed = []

  def check(self, name, ok, detail=''):
    """Prints `PASS name` or `FAIL name` (with `: detail`); returns `ok`."""
    print(
      f'{"PASS" if ok else "FAIL"} {name}' + (f': {detail}' if detail else ''),
      flush=True,
    )
    if not ok:
      self.failed.append(name)
    return ok
