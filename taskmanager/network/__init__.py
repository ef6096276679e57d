"""The data plane: channels between subtasks over gRPC, batched, with credit-based flow control.

A producing subtask opens one bidirectional ``OpenChannel`` stream per consumer subtask. It sends
buffers (a batch of records as one bytes blob, then at most one in-band event: watermark, watermark
status idle/active, barrier, end of stream); the consumer answers with credits. A buffer is only
sent against a credit, and the consumer grants a credit back only when its task has taken a buffer
out of the channel's queue, so each channel holds at most ``initial_credits`` buffers: memory is
bounded and a slow consumer backpressures its producers.

A producer and a consumer subtask in the same TaskManager skip gRPC: a ``LocalOutputChannel``
hands its buffers straight to the consumer's ``InputGate``, under the same credits, without a
thread of its own and without encoding the records (Flink's ``LocalInputChannel``). Its buffers are
``LocalBuffer`` values: the producer's lists of values and timestamps, shared with the consumer.
So, as between the operators of one chain, a record's value is one object on both sides: an operator
must not mutate a value it has emitted, nor a value it was given (Flink's contract with object reuse
enabled). The record writer never touches a list again once it handed it over. Records are encoded
only when an unaligned checkpoint captures a local buffer (``codec.encoded``).

A record's path through the modules, in order: ``writer`` (the chain's edge output and its record
writer: partitioning, batching, buffer timeout) -> ``output_channels`` (remote or local, credits) ->
``server`` (the consumer TaskManager's half of a remote channel: the ``OpenChannel`` stream, which
pushes into the gate and streams credits back) -> ``gate`` (the consumer's input gate). ``codec``
is what they carry and how it is encoded.
"""
