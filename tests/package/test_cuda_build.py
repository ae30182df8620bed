"""Every cuda/*.cu compiles standalone with nvcc for each architecture megawino supports (sm_80,
sm_86, sm_89, sm_90a, sm_100), and no kernel uses local memory (no spills, no stack frame).
CPU only; skipped without nvcc.

Every variant the runtime builds (m, layout, tracing, GEMM arithmetic; the pointwise and direct
modules) compiles for sm_90a (the wgmma family) and sm_80 (the mma.sync and FFMA families every
other architecture runs); sm_86, sm_89 and sm_100 compile the default variant of each module,
which runs the same family's code as sm_80 (MEGAWINO_BUILD_EVERY_ARCH=1 compiles every variant
for them too; the one that still spills there is in KNOWN_SPILLS, a strict xfail).  The compiles run in parallel, one per CPU, before the first test reads them."""
from __future__ import annotations

import concurrent.futures
import functools
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from megawino.core.resources import cuda_dir
from megawino.direct.config import DEFAULT_CONFIG, FLUSH_TERMS
from megawino.gpu import nvrtc

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")

SOURCES = sorted(p.name for p in cuda_dir().glob("*.cu"))
WINOGRAD_SOURCES = ("megakernel.cu", "nonfused.cu")
# The targets NVRTC builds for each GPU: sm_90a where the wgmma family exists (ARCH_SPECIFIC_TARGETS,
# which megawino.gpu.nvrtc.arch_options reads), the plain architecture elsewhere.
ARCH_OPTIONS = {"sm_80": ("-arch=sm_80",), "sm_86": ("-arch=sm_86",), "sm_89": ("-arch=sm_89",),
                "sm_90a": ("-gencode=arch=compute_90a,code=sm_90a",), "sm_100": ("-arch=sm_100",)}
EVERY_VARIANT_ARCHS = ("sm_80", "sm_90a")
MATHS = {"3xtf32": ("-DMW_GEMM_TF32X3=1", "-DMW_GEMM_BF16X3=0"), "bf16x3": ("-DMW_GEMM_TF32X3=0", "-DMW_GEMM_BF16X3=1"),
         "ffma": ("-DMW_GEMM_TF32X3=0", "-DMW_GEMM_BF16X3=0")}


def _module_variants(every: bool) -> list[tuple[str, tuple[str, ...]]]:
    """(source, defines) of each module build: every one the runtime makes, or the defaults."""
    if not every:
        return [(source, ()) for source in SOURCES]
    out = []
    for source in WINOGRAD_SOURCES:
        for math in MATHS.values():
            for m in (2, 4):
                for nhwc in (0, 1):
                    out.append((source, (f"-DMW_M={m}", f"-DMW_NHWC={nhwc}", *math)))
    out += [("megakernel.cu", ("-DMW_M=4", "-DMW_TRACE")), ("megakernel.cu", ("-DMW_M=2", "-DMW_NHWC=1", "-DMW_TRACE")),
            ("megakernel.cu", ("-DMW_M=4", *MATHS["bf16x3"], "-DMW_TRACE"))]
    out += [("pointwise.cu", math) for math in MATHS.values()]
    # The direct kernel: its standalone defaults, and the runtime's default tile in each layout.
    out += [("direct.cu", ()), ("direct.cu", DEFAULT_CONFIG.defines(False)),
            ("direct.cu", DEFAULT_CONFIG.defines(True, FLUSH_TERMS))]
    out += [(source, ()) for source in SOURCES if source not in {s for s, _ in out}]
    return out


def build_variants() -> list[tuple[str, str, tuple[str, ...]]]:
    """(arch, source, defines) of every compile the tests check."""
    every_arch = os.environ.get("MEGAWINO_BUILD_EVERY_ARCH") == "1"
    return [(arch, source, defines) for arch in ARCH_OPTIONS
            for source, defines in _module_variants(every_arch or arch in EVERY_VARIANT_ARCHS)]


def _variant_id(variant) -> str:
    arch, source, defines = variant
    return " ".join((arch, source, *(d[2:] for d in defines)))


def ptxas_report(arch: str, source: str, defines, out_dir) -> dict[str, tuple[int, int, int]]:
    """function -> (stack frame, spill stores, spill loads) bytes of one nvcc -cubin compile."""
    out = os.path.join(out_dir, re.sub(r"\W+", "_", _variant_id((arch, source, defines))) + ".cubin")
    cmd = [NVCC, *ARCH_OPTIONS[arch], "-cubin", "-Xptxas", "-v", "-I", str(cuda_dir()), *defines,
           str(cuda_dir() / source), "-o", out]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stderr}"
    report = {}
    current = None
    for line in (res.stdout + res.stderr).splitlines():
        m = re.search(r"Function properties for (\w+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            report[current] = tuple(int(v) for v in m.groups())
            current = None
    return report


@functools.lru_cache(maxsize=1)
def _all_reports() -> dict:
    """Every build variant's report (or the AssertionError of its failed compile), compiled in
    parallel once per test run."""
    variants = build_variants()
    out_dir = tempfile.mkdtemp(prefix="megawino_build_")
    def one(variant):
        try:
            return ptxas_report(*variant, out_dir)
        except AssertionError as exc:
            return exc
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            return dict(zip(variants, pool.map(one, variants)))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def test_sources_found():
    assert {"megakernel.cu", "nonfused.cu", "pointwise.cu", "direct.cu"} <= set(SOURCES)


def test_every_arch_builds_every_module():
    variants = build_variants()
    for arch in ARCH_OPTIONS:
        assert {s for a, s, _ in variants if a == arch} == set(SOURCES), arch
    for arch in EVERY_VARIANT_ARCHS:
        winograd = [d for a, s, d in variants if a == arch and s == "megakernel.cu"]
        assert any("-DMW_TRACE" in d for d in winograd) and len(winograd) >= 3 * 2 * 2


# Builds that still spill, which only MEGAWINO_BUILD_EVERY_ARCH=1 compiles (strict xfail: a fix
# makes the test fail until its entry goes): the direct kernel's default tile in NHWC with
# flushing for sm_100 (8 B, direct_conv.cuh).
KNOWN_SPILLS = {
    _variant_id(("sm_100", "direct.cu", DEFAULT_CONFIG.defines(True, FLUSH_TERMS))): "direct kernel, NHWC, flushing",
}


def _with_known_spills(variants):
    return [pytest.param(v, marks=pytest.mark.xfail(strict=True, reason=f"spills: {KNOWN_SPILLS[_variant_id(v)]}"))
            if _variant_id(v) in KNOWN_SPILLS else v for v in variants]


def test_known_spills_are_outside_the_default_set():
    """The default set (what CI runs) has no known spill: every variant it compiles must pass."""
    if os.environ.get("MEGAWINO_BUILD_EVERY_ARCH") == "1":
        pytest.skip("the exhaustive set includes the known spills")
    assert not {_variant_id(v) for v in build_variants()} & set(KNOWN_SPILLS)


@pytest.mark.parametrize("variant", _with_known_spills(build_variants()), ids=_variant_id)
def test_compiles_without_spills(variant):
    report = _all_reports()[variant]
    if isinstance(report, AssertionError):
        raise report
    assert report, f"no ptxas report for {_variant_id(variant)}"
    for fn, (stack, spill_st, spill_ld) in report.items():
        assert spill_st == 0 and spill_ld == 0, f"{fn} spills ({spill_st} B stores, {spill_ld} B loads)"
        assert stack == 0, f"{fn} uses a {stack}-byte stack frame (local memory)"


def test_params_struct_is_generated_from_abi():
    from megawino.core import abi
    text = (cuda_dir() / "generated_tasks.cuh").read_text()
    body = text[text.index("struct Params"):]
    body = body[body.index("{") + 1:body.index("};")]
    members = [ln.split("//")[0].strip() for ln in body.splitlines()]
    members = [m for m in members if m]
    assert members == [f"long long {name};" for name, _ in abi.PARAM_FIELDS]
    assert abi.STATE_WORDS >= abi.state_offset("STATUS") + len(abi.STATUS_FIELDS)


def _ptx(source: str, arch: str, defines, tmp_path) -> str:
    out = tmp_path / f"{source}.{arch}.ptx"
    cmd = [NVCC, *ARCH_OPTIONS[arch], "-ptx", "-I", str(cuda_dir()), *defines, str(cuda_dir() / source), "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stderr}"
    return out.read_text()


@pytest.mark.parametrize("arch", [a for a in ARCH_OPTIONS if a != "sm_90a"])
@pytest.mark.parametrize("source", ["megakernel.cu", "pointwise.cu"])   # nonfused.cu: the same GEMM
def test_wgmma_only_on_sm90a(source, arch, tmp_path):
    """The wgmma family compiles for sm_90a only; every other architecture's GEMM (3xTF32 and
    BF16x3) is on mma.sync, and its module says so (mw_gemm_wgmma = 0, mw_split_operands = 0)."""
    for math in ("3xtf32", "bf16x3"):
        text = _ptx(source, arch, MATHS[math], tmp_path)
        assert "wgmma." not in text, f"{arch} {math} {source} has wgmma instructions"
        assert "mma.sync.aligned" in text
        if source != "pointwise.cu":
            assert re.search(r"\.u32 mw_gemm_wgmma( = 0)?;", text)
            assert re.search(r"\.u32 mw_split_operands( = 0)?;", text)


@pytest.mark.parametrize("source", ["megakernel.cu", "nonfused.cu"])
def test_sm90a_build_uses_wgmma(source, tmp_path):
    """The sm_90a build's GEMM is on warpgroup MMAs (and says so in mw_gemm_wgmma); sm_80's is not."""
    wgmma, plain = _ptx(source, "sm_90a", (), tmp_path), _ptx(source, "sm_80", (), tmp_path)
    assert "wgmma.mma_async" in wgmma and "mw_gemm_wgmma = 1" in wgmma
    assert "wgmma.mma_async" not in plain and re.search(r"\.u32 mw_gemm_wgmma( = 0)?;", plain)


@pytest.mark.parametrize("source", ["megakernel.cu", "nonfused.cu"])
def test_sm90a_bf16x3_build_multiplies_split_operands(source, tmp_path):
    """The sm_90a BF16x3 build runs BF16 warpgroup MMAs on split operands (mw_split_operands = 1:
    the transforms store BF16 parts); its sm_80 build keeps float32 operands and mma.sync."""
    split, plain = _ptx(source, "sm_90a", MATHS["bf16x3"], tmp_path), _ptx(source, "sm_80", MATHS["bf16x3"], tmp_path)
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in split and "mw_split_operands = 1" in split
    assert "st.global.b16" in split
    assert "wgmma.mma_async" not in plain and re.search(r"\.u32 mw_split_operands( = 0)?;", plain)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in plain


def test_no_file_in_cuda_over_400_lines():
    long = {p.name: n for p in cuda_dir().glob("*.cu*") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these by responsibility: {long}"


# The diagnostic builds (cuda/diagnostics.cuh; wrong outputs by design) keep compiling.
DIAGNOSTIC_DEFINES = [("-DMW_M=4", "-DMW_GEMM_FREE=2"), ("-DMW_M=4", "-DMW_TRANSFORMS_FREE"),
                      ("-DMW_M=4", "-DMW_NHWC=1", "-DMW_GEMM_FREE=1", "-DMW_TRANSFORMS_FREE")]


@pytest.mark.parametrize("defines", DIAGNOSTIC_DEFINES, ids=" ".join)
@pytest.mark.parametrize("source", WINOGRAD_SOURCES)
def test_diagnostic_builds_compile(source, defines, tmp_path):
    assert ptxas_report("sm_90a", source, defines, tmp_path), f"no ptxas report for {source}"


def test_diagnostics_live_in_one_header():
    """Only cuda/diagnostics.cuh holds the diagnostic builds' code; params.cuh includes it, and
    the production headers hold no more than a hook per stage."""
    texts = {p.name: p.read_text() for p in cuda_dir().glob("*.cu*")}
    includes = [name for name, text in texts.items() if '#include "diagnostics.cuh"' in text]
    assert includes == ["params.cuh"]
    for name, text in texts.items():
        if name != "diagnostics.cuh":
            hooks = re.findall(r"#ifn?def (MW_GEMM_FREE|MW_TRANSFORMS_FREE)", text)
            assert len(hooks) <= 2, f"{name} holds {len(hooks)} diagnostic branches"


# Names cuda/ may test with #if / #ifdef / #ifndef besides those the runtime passes or the sources
# set (nvrtc.owned_defines): derived from them (params.cuh), the GPU tests' family override, and
# the diagnostic builds (cuda/diagnostics.cuh).
NOT_PASSED_BY_THE_RUNTIME = {"MW_GEMM_WGMMA", "MW_SPLIT_OPERANDS", "MW_U_PAIRED", "MW_GEMM_FREE", "MW_TRANSFORMS_FREE"}


def test_no_knob_the_runtime_never_sets():
    """Every MW_* name a preprocessor condition in cuda/ reads is one the runtime defines (the
    Winograd and pointwise modules' options, the direct kernel's tile), or one of the few above."""
    runtime = set(nvrtc.owned_defines())
    runtime |= {nvrtc.define_name(o) for o in DEFAULT_CONFIG.defines(True, FLUSH_TERMS)}
    tested = set()
    for path in cuda_dir().glob("*.cu*"):
        for line in path.read_text().splitlines():
            if re.match(r"\s*#\s*(if|ifdef|ifndef|elif)\b", line):
                tested |= set(re.findall(r"\bMW_[A-Z0-9_]+", line))
    assert tested - runtime - NOT_PASSED_BY_THE_RUNTIME == set()
    assert NOT_PASSED_BY_THE_RUNTIME <= tested, "a name listed above is gone: drop it from the list"
