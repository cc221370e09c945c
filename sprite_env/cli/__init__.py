"""The ``sprite-env`` command line (``main.py`` holds the parser and the exit-code map)."""
