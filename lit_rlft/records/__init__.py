"""The ground floor of results: what every study, demo and benchmark writes and reads a result with.

- :func:`write_result` / :func:`write_json` / :func:`read_json`: atomic JSON files, a result with the environment it
  was measured in (:func:`environment`).
- :func:`read_scalars`: a run's TensorBoard scalars back; :func:`plot_curves`, :func:`pyplot`, :func:`smooth`: the
  plots' helpers.

It imports nothing of ``lit_rlft`` above it, so the command line, the study and the benchmarks all stand on it.
"""

from lit_rlft.records.environment import KERNEL_VARIABLES, PACKAGES, cpu_model, cpu_vector_flags, environment
from lit_rlft.records.jsonio import read_json, write_json, write_result
from lit_rlft.records.plots import plot_curves, pyplot, smooth
from lit_rlft.records.scalars import read_scalars

__all__ = ["KERNEL_VARIABLES", "PACKAGES", "cpu_model", "cpu_vector_flags", "environment", "plot_curves", "pyplot",
           "read_json", "read_scalars", "smooth", "write_json", "write_result"]
