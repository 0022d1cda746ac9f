"""Process infrastructure, beside the maths of :mod:`lit_rlft.core`: the killable worker pool that scores rewards and
steps environments (:mod:`~lit_rlft.runtime.worker_pool`), process lifetimes (:mod:`~lit_rlft.runtime.processes`:
parent-death signal, process groups, the reaper), the calls across ranks (:mod:`~lit_rlft.runtime.distributed`:
``Collective``, the failure board, row splitting) and dotted-path imports (:mod:`~lit_rlft.runtime.imports`).
torch and numpy only; no Lightning."""
