"""Weir's end-to-end scenarios: the design card's outcomes, checked on a real local cluster.

Harness code, not the product (Flink keeps its end-to-end tests in a module of their own): the
framework (``framework``, ``driving``), the keyed aggregation job every scenario shares
(``keyed_job``), one module per scenario, and the registry (``registry``) that ``python -m
weir.scenarios`` and ``weir scenario`` run. It sits above the tools in the layer contracts; nothing
in the product imports it.
"""
