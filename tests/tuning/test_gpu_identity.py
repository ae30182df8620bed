"""GPU identity (megawino.gpu.identity) and the choice of tables by architecture
(megawino.tuning.choice): CPU only."""
import json
import math
from itertools import combinations

import pytest

from megawino.core.ceilings import MEASURED_CEILINGS
from megawino.core.spec import LayerSpec, parse_shape
from megawino.core.tasks import TaskParams
from megawino.gpu import identity
from megawino.gpu.nvrtc import arch_options
from megawino.schedule.mapping import MappingParams
from megawino.schedule.simulator import CostModel
from megawino.tuning import choice, table as tuning


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"), ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA H800", "h800"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA L40S", "l40s"), ("weird device!", "weird-device"),
    ("", "unknown")])
def test_gpu_key(name, key):
    assert identity.gpu_key(name) == key


def test_family_and_gemm_engine_follow_the_compute_capability_not_the_name():
    hopper = identity.identity_of("Some Future Hopper", "90")
    assert (hopper.key, hopper.family, hopper.gemm_engine) == ("some-future-hopper", "sm_90", "wgmma")
    for capability in ("80", "86", "89", "100"):
        other = identity.identity_of("NVIDIA H100 80GB HBM3", capability)   # the name does not decide
        assert other.gemm_engine == "mma.sync" and other.family == f"sm_{capability}"
        assert arch_options(capability) == ()          # CuPy's own -arch: the mma.sync GEMM
    assert arch_options("90") == ("-arch=sm_90a",)
    assert identity.identity_of("x", None).family is None


def _shipped(tmp_path, monkeypatch, tables):
    """A mapping folder holding ``tables`` (key -> {shape: (params, mapping)})."""
    monkeypatch.setattr(tuning, "mapping_dir", lambda: tmp_path)
    monkeypatch.delenv(tuning.ENV_OVERRIDE, raising=False)
    for old in tmp_path.glob("*.json"):
        old.unlink()
    for key, entries in tables.items():
        table = {"layers": {}}
        for shape, (params, mapping) in entries.items():
            tuning.write_entry(table, parse_shape(shape), params, mapping, time_us=1.0)
        (tmp_path / f"{key}.json").write_text(json.dumps(table))


SHAPE = "n64c64k64h56w56"
P100, P200 = TaskParams(tiles_per_group=64), TaskParams(tiles_per_group=256)


def test_unknown_sm90_gpu_takes_the_hopper_table_unknown_sm80_the_heuristic(tmp_path, monkeypatch):
    _shipped(tmp_path, monkeypatch, {"h100": {SHAPE: (P100, MappingParams(1, 1, 1))}})
    spec = parse_shape(SHAPE)
    params, mapping, source = choice.choose_for_gpu(spec, identity.identity_of("NVIDIA Hopper X", "90"), "3xtf32")
    assert (params, source.kind, source.table) == (P100, "architecture", str(tmp_path / "h100.json"))
    assert "same-architecture fallback: h100.json" in source.describe()
    for name, capability in (("NVIDIA Ampere X", "80"), ("NVIDIA Hopper X", None)):
        params, mapping, source = choice.choose_for_gpu(spec, identity.identity_of(name, capability), "3xtf32")
        assert source.kind == "heuristic" and source.table is None
    # bf16x3 plans read the bf16x3 tables first (own GPU, then family), then the default tables
    _shipped(tmp_path, monkeypatch, {"h100": {SHAPE: (P100, MappingParams(1, 1, 1))},
                                     "h100-bf16x3": {SHAPE: (P200, MappingParams(2, 2, 1))}})
    chain = choice.table_chain(identity.identity_of("NVIDIA H800", "90"), "bf16x3")
    assert chain == [("h800-bf16x3", "tuned"), ("h100-bf16x3", "architecture"), ("h800", "tuned"),
                     ("h100", "architecture")]
    assert choice.choose_for_gpu(spec, identity.identity_of("NVIDIA H800", "90"), "bf16x3")[0] == P200


def test_the_h200_prefers_its_own_table_then_the_h100s(tmp_path, monkeypatch):
    spec = parse_shape(SHAPE)
    h200 = identity.identity_of("NVIDIA H200", "90")
    _shipped(tmp_path, monkeypatch, {"h100": {SHAPE: (P100, MappingParams(1, 1, 1))}})
    assert choice.choose_for_gpu(spec, h200, "3xtf32")[2].kind == "architecture"
    _shipped(tmp_path, monkeypatch, {"h100": {SHAPE: (P100, MappingParams(1, 1, 1))},
                                     "h200": {SHAPE: (P200, MappingParams(1, 1, 1))}})
    params, _, source = choice.choose_for_gpu(spec, h200, "3xtf32")
    assert (params, source.kind) == (P200, "tuned")
    # another sm_90 GPU: the sibling nearest in memory bandwidth first
    hbm3e = identity.identity_of("NVIDIA GH200 144G HBM3e", "90", nominal_bytes_per_s=4.9e12)
    assert identity.family_fallbacks(hbm3e, ["h100", "h200"]) == ["h200", "h100"]
    assert identity.family_fallbacks(identity.identity_of("Some Hopper", "90"), ["h200", "h100"]) == ["h200", "h100"]
    assert identity.family_fallbacks(identity.identity_of("NVIDIA H100 PCIe", "90"), ["h100", "h200"]) == ["h100", "h200"]
    assert identity.family_fallbacks(identity.identity_of("NVIDIA A100", "80"), ["h100", "h200"]) == []


def test_shipped_tables_resolve_for_every_hopper():
    """The package's own tables: every known sm_90 GPU gets a tuned or same-architecture entry for
    the suite's shapes; an sm_80 GPU gets the heuristic."""
    spec = parse_shape(SHAPE)
    for key, (capability, _) in identity.KNOWN_GPUS.items():
        kind = choice.choose_for_gpu(spec, identity.identity_for_key(key), "3xtf32")[2].kind
        assert kind == ("heuristic" if capability != "90" else kind)
        if capability == "90":
            assert kind in ("tuned", "architecture")


def test_near_is_what_the_shipped_tables_agree_on():
    """NEAR_TILES_RATIO from the data: in each shipped table, every two entries near each other
    (same C, K and padding, tile counts within the ratio) chose the same group size and
    GEMM_OUTPUT choice; and at least one pair of the same C and K farther apart did not."""
    near_pairs = disagreeing_far = 0
    for path in sorted(tuning.mapping_dir().glob("*.json")):
        if path.stem.startswith("direct_"):
            continue
        layers = tuning.read_table(path)["layers"]
        for a, b in combinations(layers, 2):
            pa, pb = layers[a]["params"], layers[b]["params"]
            same = (pa["tiles_per_group"], bool(pa.get("fused_output"))) == \
                   (pb["tiles_per_group"], bool(pb.get("fused_output")))
            if choice.is_near(parse_shape(a), b):
                near_pairs += 1
                assert same, f"{path.name}: {a} and {b} are near but chose differently"
            elif (parse_shape(a).C, parse_shape(a).K) == (parse_shape(b).C, parse_shape(b).K):
                disagreeing_far += not same
    assert near_pairs >= 2 and disagreeing_far >= 1


def test_params_source_says_where_parameters_came_from():
    src = choice.ParamsSource("nearest", "/x/h100.json", SHAPE)
    assert src.describe() == f"nearest tuned shape: h100.json, entry {SHAPE}" == str(src)
    assert choice.HEURISTIC.describe().startswith("heuristic")
    with pytest.raises(ValueError, match="kind must be one of"):
        choice.ParamsSource("guess")


def test_ceilings_are_a_record_per_gpu_or_from_the_device():
    h100 = identity.ceilings(identity.identity_of("NVIDIA H100 80GB HBM3", "90", sms=132))
    assert h100 == MEASURED_CEILINGS["h100"]
    assert CostModel() == CostModel.for_ceilings(h100)
    h200 = identity.ceilings(identity.identity_of("NVIDIA H200", "90", sms=132, nominal_bytes_per_s=4.8e12,
                                                  clock_hz=1.98e9))
    if "h200" not in MEASURED_CEILINGS:
        assert math.isclose(h200.bytes_per_s, 4.8e12 * identity.COPY_FRACTION) and h200.sms == 132
    assert h200.bytes_per_s > h100.bytes_per_s
    small = identity.ceilings(identity.identity_of("NVIDIA L4", "89", sms=58, nominal_bytes_per_s=0.3e12,
                                                   clock_hz=2.04e9))
    assert small.sms == 58 and small.flops_per_s < h100.flops_per_s and small.bytes_per_s < 0.3e12
    model = CostModel.for_ceilings(small)
    assert (model.sms, model.bytes_per_s, model.device) == (58, small.bytes_per_s, "NVIDIA L4")
    # without a device: the default target's record
    assert identity.ceilings(identity.DEFAULT_TARGET) == h100
    assert identity.current_identity() == identity.DEFAULT_TARGET or identity.device_name()


def test_tables_in_use_names_the_table_or_the_tune_command(tmp_path, monkeypatch):
    _shipped(tmp_path, monkeypatch, {"h100": {SHAPE: (P100, MappingParams(1, 1, 1))}})
    monkeypatch.setenv("MEGAWINO_CACHE_DIR", str(tmp_path / "cache"))
    text = choice.tables_in_use(identity.identity_of("NVIDIA H200", "90"), "3xtf32")
    assert "h100.json (same-architecture fallback, 1 layers)" in text and "megawino tune suite" in text
    text = choice.tables_in_use(identity.identity_of("NVIDIA A100", "80"), "bf16x3")
    assert text.startswith("none: megawino has not been measured on this GPU (a100, sm_80)")
    assert text.endswith("megawino tune suite --gemm-math bf16x3")
    assert choice.tables_in_use(identity.identity_of("NVIDIA H100 80GB HBM3", "90"), "3xtf32").endswith(
        "(tuned for this GPU, 1 layers)")
