"""Weir: a distributed stream processor on the model of Apache Flink."""

__version__ = "0.1.0"
