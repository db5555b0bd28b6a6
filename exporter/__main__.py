"""`python -m exporter` runs the command line."""

from exporter.shell.cli import main

raise SystemExit(main())
