"""The JobManager: the job lifecycle, the checkpoint coordinator, scheduling, REST and gRPC services.

This folder is the package ``weir.jobmanager`` (``weir/jobmanager`` links here): Weir has one import root.
"""

if __name__ != "weir.jobmanager":
    raise ImportError(f"import weir.jobmanager, not {__name__}: this folder is the package weir.jobmanager")
