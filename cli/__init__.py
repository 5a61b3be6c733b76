"""The ``millpond`` command line."""
