"""`python -m trax_revplus.cli ...`, the same as `trax-revplus ...`."""

from trax_revplus import cli

if __name__ == '__main__':
  cli.run()
