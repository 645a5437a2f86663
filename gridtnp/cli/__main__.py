"""``python -m gridtnp.cli ...``: the same as the ``gridtnp`` command."""

from gridtnp.cli.main import main

main()
