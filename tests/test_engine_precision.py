"""dtype: auto picks the precision for the CPU it runs on (synthetic flag sets: the decision, not this machine's
CPU), explicit dtypes are honoured, and the build config accepts auto only where it means something."""

import pytest

from trtspec.config import ConfigError, load_config
from trtspec.reference_engine.device import bf16_exact, choose_precision, cpu_flags, describe_precision

ZEN3 = frozenset({"fpu", "sse2", "avx", "avx2", "fma"})
ZEN4 = ZEN3 | {"avx512f", "avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN3 | {"avx512f", "amx_bf16", "amx_tile", "avx512_fp16"}


@pytest.mark.parametrize(("flags", "native", "exact"), [(ZEN3, False, False), (ZEN4, True, False),
                                                     (SAPPHIRE_RAPIDS, True, True), (frozenset(), False, False)])
def test_auto_picks_bf16_only_where_the_cpu_computes_it_natively_and_it_is_exact(flags, native, exact):
    # exact: bf16 measured batch-invariant there (device.BF16_EXACT_FLAGS: AMX); AVX-512 BF16 alone is unmeasured
    p = choose_precision("auto", "cpu", flags)
    assert p.dtype == ("bfloat16" if exact else "float32") and p.warning is None
    assert ("computes bf16 natively" in p.reason) == native
    assert ("no native bf16" in p.reason) == (not native)
    assert ("tokens change with the batch" in p.reason) == (native and not exact)
    assert p.batch_invariant == exact  # float32 is not bitwise batch-invariant on the default kernels


def test_explicit_dtypes_are_honoured_with_a_warning_where_the_cpu_lacks_them():
    assert choose_precision("float32", "cpu", ZEN3).dtype == "float32"
    slow = choose_precision("bfloat16", "cpu", ZEN3)
    assert slow.dtype == "bfloat16" and "without native bf16" in slow.warning and "auto" in slow.warning
    assert choose_precision("bfloat16", "cpu", ZEN4).warning is None
    assert "fp16" in choose_precision("float16", "cpu", ZEN4).warning
    assert choose_precision("float16", "cpu", SAPPHIRE_RAPIDS).warning is None


def test_cuda_keeps_its_dtypes_and_auto_is_float32_there():
    assert choose_precision("auto", "cuda", ZEN4).dtype == "float32"
    assert choose_precision("float16", "cuda:0", ZEN3).dtype == "float16"


def test_an_unknown_dtype_is_named():
    with pytest.raises(ValueError, match="int4"):
        choose_precision("int4", "cpu", ZEN3)


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_doctor_line_says_what_and_why():
    line = describe_precision("auto", "cpu")
    assert line.startswith(("float32 (auto", "bfloat16 (auto")) and "batch-invariant" in line
    # bf16's tokens change with the batch on this CPU unless it was measured batch-invariant here (AMX)
    assert ("greedy tokens can change with the batch" in describe_precision("bfloat16", "cpu")) == (not bf16_exact())


def _config(tmp_path, engine, dtype):
    path = tmp_path / "c.yaml"
    path.write_text(f"name: t\nengine: {engine}\ntarget:\n  checkpoint: demo:target\n  dtype: {dtype}\n"
                    "speculative:\n  draft_source: ngram\n")
    return path


def test_config_accepts_auto_for_the_reference_engine_only(tmp_path):
    assert load_config(_config(tmp_path, "reference", "auto")).target.dtype == "auto"
    with pytest.raises(ConfigError, match="target.dtype: auto applies to engine: reference"):
        load_config(_config(tmp_path, "tensorrt_llm", "auto"))


def test_the_demo_default_is_auto():
    from importlib.resources import files

    demo = load_config(files("trtspec") / "assets" / "demo.yaml")
    assert demo.target.dtype == "auto" and demo.draft.dtype == "auto"
