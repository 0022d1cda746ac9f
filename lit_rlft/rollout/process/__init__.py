"""Rollouts made in a process of their own, with their own copy of the policy's weights: :class:`ProcessRollouts`, the
rollout source of asynchronous runs (``model.asynchronous.depth = k >= 1``).

    source = ProcessRollouts(policy_factory, HFEngine(), scorer, tokenizer, success_threshold, threads=1)
    source.attach(policy)                 # the trainer's policy: its weights are copied when the process starts
    source.submit(request)                # returns at once; the process works through requests in order
    reply = source.receive()              # blocks (bounded); an error names the process, how it ended, and why
    source.sync_weights(policy, version=3)        # the trainer's trainable weights, through shared memory
    source.close()

One process per rank (:class:`GenerationProcess`): a fresh interpreter (``python -c``, so a training script needs no
``if __name__ == "__main__"`` guard) with its own torch threads and device. It builds its copy of the policy with the
factory it was given (no reference, no optimizer), sets its engine up on it (HF with the sampling log-probs, or vLLM)
and scores with the scorer it was given (and its own environment workers for multi-turn episodes). Requests and
weight pushes go through one connection, in order, so every request samples from the last weights pushed before it
was submitted. Weights travel through files in shared memory (``/dev/shm``) that both processes map; a push waits
until the process has loaded the previous one before overwriting them, so a version is never torn.

Lifetime: the process runs in a session of its own, asks the kernel for SIGKILL when its parent dies (Linux), polls
its parent otherwise, and its group is killed by :meth:`close`, at garbage collection, at interpreter exit and by the
trainer's reaper when the trainer dies (:mod:`lit_rlft.runtime.processes`): what it started dies with it.

Failures: a process that fails, dies or stops answering ends the trainer's waiting call within ``timeout_s`` with a
:class:`GenerationError` naming its pid, how it ended (exit code, signal) and what the trainer was doing (submitting a
batch, receiving one, pushing or loading weights, a validation call), with its traceback when it reported one.

The roles, one module each (as :mod:`lit_rlft.rollout.servers` splits its own):

- :mod:`~lit_rlft.rollout.process.wire`: what both sides exchange (the messages, the replies, the shared weight files);
- :mod:`~lit_rlft.rollout.process.child`: the process side (``main``: build, then serve pushes and requests);
- :mod:`~lit_rlft.rollout.process.handle`: the trainer's handle on one process (:class:`GenerationProcess`: start,
  push, submit, wait, name a failure, stop);
- :mod:`~lit_rlft.rollout.process.source`: the rollout source over it (:class:`ProcessRollouts`).
"""

from lit_rlft.rollout.process.handle import GenerationError, GenerationProcess, default_threads
from lit_rlft.rollout.process.source import ProcessRollouts

__all__ = ["GenerationError", "GenerationProcess", "ProcessRollouts", "default_threads"]
