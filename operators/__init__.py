"""Runtime operators: what runs inside a subtask, chained, one record at a time.

This folder is the package ``weir.operators`` (``weir/operators`` links here): Weir has one import root.
"""

if __name__ != "weir.operators":
    raise ImportError(f"import weir.operators, not {__name__}: this folder is the package weir.operators")
