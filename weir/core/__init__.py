"""The core of values, rules and the typed protocol: no operator, connector or process role."""
