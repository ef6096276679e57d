"""The TaskManager: subtasks, the network stack, barrier alignment, state snapshots.

This folder is the package ``weir.taskmanager`` (``weir/taskmanager`` links here): Weir has one import root.
"""

if __name__ != "weir.taskmanager":
    raise ImportError(f"import weir.taskmanager, not {__name__}: this folder is the package weir.taskmanager")
