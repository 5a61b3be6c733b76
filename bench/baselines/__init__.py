"""Baselines that need more than a helper in ``bench.common``: other engines doing the
benchmark's work on the same broker and topic in the same run."""
