"""One adapter per external system: Kafka, PostgreSQL, S3 (object storage).

This folder is the package ``weir.connectors`` (``weir/connectors`` links here): Weir has one import root.
"""

if __name__ != "weir.connectors":
    raise ImportError(f"import weir.connectors, not {__name__}: this folder is the package weir.connectors")
