#!/usr/bin/env python3
"""Build the block-FP8 golden fixtures (tests/fixtures/qwen35_fp8, tests/fixtures/qwen3_next_fp8)
and the e4m3fn table (tests/fixtures/e4m3fn_torch.txt) with torch and transformers.

Each FP8 fixture is an existing tiny bf16 fixture (qwen35_bf16, qwen3_next; made by
scripts/make_fixtures.py) re-written in exactly the format of Qwen's FP8 releases:

- config.json gains `quantization_config` = {quant_method "fp8", fmt "e4m3", activation_scheme
  "dynamic", weight_block_size [128, 128], modules_to_not_convert [...]}, the unconverted modules
  listed by full name as Qwen lists them (lm_head, the embedding, MoE router `mlp.gate`,
  `shared_expert_gate`, GDN `conv1d` and `in_proj_a`/`in_proj_b` (Qwen3-Next: `in_proj_ba`),
  `mtp.fc`) plus `model.visual` for the vision tower.
- Every other linear weight `[out, in]` is stored as float8_e4m3fn with `weight_scale_inv`
  `[ceil(out/128), ceil(in/128)]`: per 128 x 128 tile, scale = amax / 448 and code =
  e4m3(w / scale) rounded to nearest even (the recipe of DeepSeek-V3 / Qwen's releases). The tiny
  models' dims are below 128 or (in_proj_qkv [160, 64], in_proj_qkvz [192, 64]) above 128 and not
  a multiple of it, so every tile is partial somewhere: exactly the case the block math must get
  right. qwen35_fp8 stores its scales in float32, qwen3_next_fp8 in bfloat16 (both occur in
  published checkpoints; float16 is covered by the Rust unit tests).

Expected outputs: the FP8 checkpoint is dequantized here, W = float32(code) * float32(scale) per
tile (one f32 rounding, which is also how deltaserve dequantizes), the dequantized values are saved
as an ordinary f32 checkpoint in a temporary directory, loaded back with transformers'
`from_pretrained` (the same float32 / eager path as scripts/make_fixtures.py) and run there. That
is the exact reference for exact dequantization: any difference left between deltaserve and
these logits is float32 compute noise, so the Rust golden tests compare with their usual
tolerance.

The script also loads each FP8 directory through transformers' own FP8 support on the CPU
(`FineGrainedFP8Config(dequantize=True)`) and records in expected.json `checks` which tensors it
dequantizes to the same values. transformers 5.24 derives the tile size as rows / scale_rows, so it
agrees wherever a dimension is a multiple of 128 or below it, and differs on the >128,
not-a-multiple matrices (it uses 80- or 96-row tiles there); real Qwen checkpoints have no such
quantized matrix, the fixtures do on purpose.

Run from the repository root:  .venv/bin/python scripts/make_fp8_fixture.py
Requirements: scripts/requirements-fixtures.txt (+ accelerate for the transformers FP8 check).
Deterministic: no random numbers are drawn beyond make_fixtures' seeded prompt selection.
"""

from __future__ import annotations

import json
import struct
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import transformers
from transformers import Qwen3_5ForConditionalGeneration, Qwen3NextForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (the golden-fixture machinery: loading, expected outputs)

GENERATOR = "scripts/make_fp8_fixture.py"
BLOCK = 128
E4M3_MAX = 448.0
FP8 = torch.float8_e4m3fn

# Module-name suffixes Qwen's FP8 configs keep unquantized (as whole dotted components).
NOT_CONVERTED_SUFFIXES = (
    "lm_head",
    "embed_tokens",
    "mlp.gate",
    "shared_expert_gate",
    "linear_attn.conv1d",
    "linear_attn.in_proj_a",
    "linear_attn.in_proj_b",
    "linear_attn.in_proj_ba",
    "mtp.fc",
)
VISION_PREFIX = "model.visual"


# --------------------------------------------------------------------------------------------
# e4m3fn table
# --------------------------------------------------------------------------------------------


def f32_bits(x: torch.Tensor) -> list[int]:
    return [struct.unpack("<I", struct.pack("<f", float(v)))[0] for v in x.tolist()]


def write_e4m3_table(path: Path) -> int:
    """All 256 codes decoded by torch, and torch's cast of probe values (every finite code value,
    the midpoints between neighbouring codes and one f32 ulp either side of them, subnormal
    and out-of-range-but-rounding values), both signs."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    decoded = codes.view(FP8).to(torch.float32)
    finite = sorted({float(v) for v in decoded.tolist() if v == v and v >= 0})
    probes = set(finite)
    for lo, hi in zip(finite, finite[1:]):
        mid = torch.tensor((lo + hi) / 2, dtype=torch.float32)
        probes.add(float(mid))
        probes.add(float(torch.nextafter(mid, torch.tensor(0.0))))
        probes.add(float(torch.nextafter(mid, torch.tensor(1e9))))
    # Above 448 torch rounds to 448 until the midpoint towards the (NaN) next code, 464.
    probes.update([450.0, 456.0, 463.0, float(torch.nextafter(torch.tensor(464.0), torch.tensor(0.0)))])
    probes.update([2.0**-12, 2.0**-11, 3 * 2.0**-11, 1e-30, 0.3, 1.7, 100.1, 333.3])
    values = torch.tensor(sorted(probes), dtype=torch.float32)
    values = torch.cat([values, -values])
    cast = values.to(FP8).view(torch.uint8).to(torch.int32)
    lines = [
        f"# float8_e4m3fn as torch {torch.__version__} decodes and casts it; made by {GENERATOR}.",
        "# decode CODE F32_BITS  |  cast F32_BITS CODE  (all hex)",
    ]
    lines += [f"decode {c:02x} {b:08x}" for c, b in zip(range(256), f32_bits(decoded))]
    lines += [f"cast {b:08x} {int(c):02x}" for b, c in zip(f32_bits(values), cast.tolist())]
    path.write_text("\n".join(lines) + "\n")
    return len(values)


# --------------------------------------------------------------------------------------------
# Block FP8
# --------------------------------------------------------------------------------------------


def quantize_blocks(w: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (float8_e4m3fn codes, scales [ceil(out/128), ceil(in/128)] in scale_dtype)."""
    rows, cols = w.shape
    grid = (-(-rows // BLOCK), -(-cols // BLOCK))
    w = w.to(torch.float32)
    scales = torch.ones(grid, dtype=torch.float32)
    for i in range(grid[0]):
        for j in range(grid[1]):
            amax = w[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK].abs().max()
            if amax > 0:
                scales[i, j] = amax / E4M3_MAX
    scales = scales.to(scale_dtype)  # the stored scale is the one the codes are computed with
    expanded = expand(scales.to(torch.float32), rows, cols)
    codes = (w / expanded).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return codes, scales


def expand(scales: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The per-element scale of a [rows, cols] matrix: tile (i, j) covers rows 128i.. and cols 128j..."""
    return scales.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]


def dequantize_blocks(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    rows, cols = codes.shape
    return codes.to(torch.float32) * expand(scales.to(torch.float32), rows, cols)


def module_of(name: str) -> str:
    return name.removesuffix(".weight")


def is_converted(name: str, value: torch.Tensor) -> bool:
    """A linear weight outside Qwen's not-converted list and the vision tower."""
    if value.dim() != 2 or not name.endswith(".weight") or name.startswith(VISION_PREFIX):
        return False
    return not is_listed(name)


def is_listed(name: str) -> bool:
    padded = f".{module_of(name)}."
    return any(f".{suffix}." in padded for suffix in NOT_CONVERTED_SUFFIXES)


def not_converted_modules(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Full names of the modules Qwen's configs list as left unquantized (linears and conv1d),
    then the vision tower as one prefix."""
    names = sorted(
        module_of(n)
        for n in tensors
        if n.endswith(".weight") and not n.startswith(VISION_PREFIX) and is_listed(n)
    )
    return names + [VISION_PREFIX]


def to_fp8_checkpoint(tensors, scale_dtype):
    """(the FP8 checkpoint's tensors, the same model dequantized to float32, converted names)."""
    stored, dequantized, converted = {}, {}, []
    for name, value in sorted(tensors.items()):
        if is_converted(name, value):
            codes, scales = quantize_blocks(value, scale_dtype)
            stored[name] = codes
            stored[name + "_scale_inv"] = scales
            dequantized[name] = dequantize_blocks(codes, scales)
            converted.append(name)
        else:
            stored[name] = value
            dequantized[name] = value.to(torch.float32)
    return stored, dequantized, converted


def as_loaded(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors under the names transformers' modules use (experts packed)."""
    return mf.pack_experts(tensors) if mf.is_per_expert(tensors) else tensors


def quantization_config(tensors) -> dict:
    return {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "modules_to_not_convert": not_converted_modules(tensors),
        "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK],
    }


# --------------------------------------------------------------------------------------------
# transformers' own FP8 loader, as a cross-check
# --------------------------------------------------------------------------------------------


def transformers_fp8_agreement(model_cls, directory: Path, dequantized, converted) -> dict:
    """Which converted tensors transformers' CPU FP8 path (dequantize=True) loads with exactly our
    dequantized values. Returns a summary for expected.json's `checks`."""
    from transformers import FineGrainedFP8Config

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = model_cls.from_pretrained(
                directory,
                dtype=torch.float32,
                quantization_config=FineGrainedFP8Config(dequantize=True),
                attn_implementation="eager",
                experts_implementation="eager",
            )
    except Exception as err:  # report, do not fail: this is a cross-check of transformers
        return {"transformers_fp8_load": f"failed: {type(err).__name__}: {err}"[:300]}
    loaded = model.state_dict()
    ours = as_loaded(dequantized)
    converted = set(converted)
    same, differ, absent = [], [], []
    for name in sorted(ours):
        if name not in converted and ".mlp.experts." not in name:
            continue
        if name.startswith("mtp."):
            continue  # transformers' classes have no MTP module
        if name not in loaded:
            absent.append(name)
        elif torch.equal(loaded[name].to(torch.float32), ours[name]):
            same.append(name)
        else:
            differ.append(f"{name} {list(ours[name].shape)}")
    return {
        "transformers_fp8_load": "FineGrainedFP8Config(dequantize=True) on CPU",
        "transformers_fp8_equal_tensors": len(same),
        "transformers_fp8_differing_tensors": differ,
        "transformers_fp8_not_compared": len(absent),
    }


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


def build(source: str, target: str, model_cls, seed: int, scale_dtype, mtp: bool) -> str:
    src_dir = mf.FIXTURES_DIR / source
    tensors = mf.read_safetensors_dir(src_dir)
    config = json.loads((src_dir / "config.json").read_text())
    if config.get("quantization_config"):
        raise AssertionError(f"{source} is already quantized")
    stored, dequantized, converted = to_fp8_checkpoint(tensors, scale_dtype)
    fp8_config = dict(config)
    fp8_config["quantization_config"] = quantization_config(tensors)

    directory = mf.FIXTURES_DIR / target
    mf.reset_dir(directory)
    mf.write_safetensors(directory / "model.safetensors", stored)
    mf.write_json(directory / "config.json", fp8_config)

    # The reference: the dequantized weights as a plain f32 checkpoint, run by transformers.
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp)
        mf.write_safetensors(plain / "model.safetensors", dequantized)
        mf.write_json(plain / "config.json", config)
        loaded = mf.load_fixture(model_cls, plain)
        reference = {k: v for k, v in as_loaded(dequantized).items() if not k.startswith("mtp.")}
        mf.assert_loaded_weights(loaded, reference, plain)
        expected = mf.compute_expected(loaded, seed, mf.load_mtp(loaded, plain) if mtp else None)

    expected.checks |= transformers_fp8_agreement(model_cls, directory, dequantized, converted)
    shapes = sorted({tuple(tensors[n].shape) for n in converted})
    expected.checks["fp8_tensors"] = len(converted)
    expected.checks["fp8_matrix_shapes"] = [list(s) for s in shapes]
    expected.checks["fp8_max_rel_weight_error"] = max(
        float(((dequantized[n] - tensors[n].float()).abs().max() / tensors[n].float().abs().max()))
        for n in converted
    )
    scale_name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[scale_dtype]
    notes = (
        f"{source} re-written as a block-FP8 checkpoint in the format of Qwen's FP8 releases: "
        f"{len(converted)} linear weights float8_e4m3fn with weight_scale_inv [ceil(out/128), "
        f"ceil(in/128)] in {scale_name}; modules_to_not_convert and every other tensor as in "
        f"{source}. Outputs: transformers in float32 on the exactly dequantized weights "
        f"(code * scale per 128 x 128 tile). "
    )
    mf.write_expected(directory, expected, "float8_e4m3fn", notes + mf.COMMON_NOTES)
    (directory / "expected.json").write_text(
        (directory / "expected.json")
        .read_text()
        .replace(f'"generator": "{mf.GENERATOR}"', f'"generator": "{GENERATOR}"')
    )
    return target


def main() -> int:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    probes = write_e4m3_table(mf.FIXTURES_DIR / "e4m3fn_torch.txt")
    print(f"e4m3fn_torch.txt: 256 codes, {probes} cast probes")
    for fixture in (
        build("qwen35_bf16", "qwen35_fp8", Qwen3_5ForConditionalGeneration, 3501, torch.float32, True),
        build("qwen3_next", "qwen3_next_fp8", Qwen3NextForCausalLM, 3504, torch.bfloat16, False),
    ):
        record = json.loads((mf.FIXTURES_DIR / fixture / "expected.json").read_text())
        print(f"{fixture}: margin {record['greedy_min_margin']:.4f} checks {record['checks']}")
        for path in sorted((mf.FIXTURES_DIR / fixture).iterdir()):
            print(f"  {path.stat().st_size:>9}  {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
