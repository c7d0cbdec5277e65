"""The run directory protocol: for each artifact of a run directory, its writer and its reader.

- ``ending``: how a run (its latest attempt) ended, ``ending.json``, and the exit status that ending maps to.

The paths themselves are still listed in ``toolkit.rundir``.
"""
