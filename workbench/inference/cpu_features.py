"""Whether this CPU computes bfloat16 natively: for the "--dtype bfloat16 is emulated" hint, and
for training's bfloat16 base weights (`optimization_dtype`), which only pay where it does.

Linux only (the flags of /proc/cpuinfo); elsewhere the answer is unknown and nothing is said.
"""

from __future__ import annotations

from pathlib import Path

BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
BF16_EMULATED = "bfloat16 on this CPU is emulated: float32 is likely faster"


def native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """True when the CPU flags include amx_bf16 or avx512_bf16, False when they include neither,
    None when unknown (no readable cpuinfo with an x86 flags line: not Linux, or not x86)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == "flags":  # x86; ARM's "Features" line is left unknown
            return not BF16_FLAGS.isdisjoint(value.split())
    return None


def cpu_has_bf16() -> bool:
    """True only when this CPU is known to multiply bfloat16 in hardware (x86 AMX or
    AVX512-BF16): without it torch emulates bfloat16, slower than float32."""
    return native_bf16() is True


def dtype_hint(dtype: str) -> str | None:
    """The one line to show for an in-process model loaded in `dtype` on the CPU, if any."""
    return BF16_EMULATED if dtype == "bfloat16" and native_bf16() is False else None
