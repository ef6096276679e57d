"""Runtime operators: what runs inside a subtask, chained, one record at a time."""
