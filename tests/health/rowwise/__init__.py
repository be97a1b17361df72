"""The health rules as they were evaluated row by row: the reference the columnar rules match.

A copy of the per-row rules (one Python object per row, each rule looping over a step's rows),
kept to compare alerts with on generated flushes; not used by the library.
"""
