"""CPU tests of the network layer tables and the suite file reader."""
from __future__ import annotations

import json

import pytest

from megawino.core.networks import DEFAULT_RESOLUTION, NETWORKS, NetworkLayer, find_layer, network_layers
from megawino.core.suite import load_suite
from megawino.core.spec import LayerSpec

PAPER_NETWORKS = ("vgg16", "resnet50", "yolov3", "densenet161")


def _suite_or_skip(suite):
    try:
        return load_suite(suite=suite)
    except FileNotFoundError as err:
        pytest.skip(f"shared suite file not available: {err}")


def _suite_entries(suite):
    specs = _suite_or_skip(suite)
    return [s for s in specs if s.name.split(".", 1)[0] in NETWORKS]


@pytest.mark.parametrize("network", sorted(NETWORKS))
@pytest.mark.parametrize("resolution", [None, 320, 257])
def test_builds_with_unique_names(network, resolution):
    layers = network_layers(network, batch=2, resolution=resolution, winograd_only=False)
    assert layers and all(isinstance(layer, NetworkLayer) for layer in layers)
    names = [layer.spec.name for layer in layers]
    assert len(names) == len(set(names))
    for layer in layers:
        assert isinstance(layer.spec, LayerSpec)
        assert layer.spec.name.startswith(network + ".")
        assert layer.spec.N == 2 and layer.count >= 1
        assert layer.spec.out_h >= 1
    winograd = network_layers(network, batch=2, resolution=resolution)
    assert winograd == [layer for layer in layers if layer.spec.winograd_eligible]
    if network != "alexnet":
        assert winograd


def test_default_resolutions():
    assert set(DEFAULT_RESOLUTION) == set(NETWORKS)
    assert DEFAULT_RESOLUTION["yolov3"] == 416
    assert network_layers("yolov3", resolution=416) == network_layers("yolov3")


def test_layout_passes_through():
    layers = network_layers("resnet50", layout="NHWC")
    assert {layer.spec.layout for layer in layers} == {"NHWC"}
    assert find_layer("resnet50.conv2_x", layout="NHWC").layout == "NHWC"


def test_vgg16_convs_and_flops():
    layers = network_layers("vgg16", winograd_only=False)
    assert len(layers) == 13 and all(layer.count == 1 for layer in layers)
    assert layers[0].spec.name == "vgg16.conv1_1" and layers[-1].spec.name == "vgg16.conv5_3"
    # 15.35 G multiply-adds (the usual "15.5 GFLOPs" figure counts MACs, and includes
    # the FC layers); direct_flops counts 2 FLOPs per multiply-add.
    total = sum(layer.spec.direct_flops * layer.count for layer in layers)
    assert total == pytest.approx(2 * 15.35e9, rel=0.01)
    # all 3x3 stride 1: the Winograd table is the whole network
    assert network_layers("vgg16") == layers


@pytest.mark.parametrize("network,gmacs", [
    ("resnet50", 4.09),       # torchvision: 4.09 GMAC (FC is 0.002)
    ("densenet161", 7.73),    # torchvision: 7.73 GMAC
    ("yolov3", 65.86 / 2),    # darknet reports 65.86 BFLOPs (2 per MAC) at 416
])
def test_total_flops_match_published(network, gmacs):
    total = sum(l.spec.direct_flops * l.count for l in network_layers(network, winograd_only=False))
    assert total == pytest.approx(2 * gmacs * 1e9, rel=0.01)


def test_resnet50_winograd_layers():
    layers = network_layers("resnet50")
    shapes = [(l.spec.name, l.spec.C, l.spec.K, l.spec.H, l.count) for l in layers]
    # v1.5: the first block of stages 3-5 has the strided 3x3, so 3, 3, 5, 2 stride-1 3x3s
    assert shapes == [("resnet50.conv2_x", 64, 64, 56, 3), ("resnet50.conv3_x", 128, 128, 28, 3),
                      ("resnet50.conv4_x", 256, 256, 14, 5), ("resnet50.conv5_x", 512, 512, 7, 2)]
    all_layers = network_layers("resnet50", winograd_only=False)
    per_stage = {}
    for layer in all_layers:
        if (layer.spec.R, layer.spec.S) == (3, 3):
            stage = layer.spec.name.split(".")[1]
            per_stage[stage] = per_stage.get(stage, 0) + layer.count
    assert per_stage == {"conv2_x": 3, "conv3_x": 4, "conv4_x": 6, "conv5_x": 3}
    assert sum(l.count for l in all_layers) == 53  # conv1 + 16 * 3 + 4 downsamples


def test_densenet161_dense_layers():
    layers = network_layers("densenet161")
    assert [(l.spec.name, l.spec.C, l.spec.K, l.spec.H, l.count) for l in layers] == [
        ("densenet161.block1", 192, 48, 56, 6), ("densenet161.block2", 192, 48, 28, 12),
        ("densenet161.block3", 192, 48, 14, 36), ("densenet161.block4", 192, 48, 7, 24)]
    l3 = find_layer("densenet161.block1.l3.1x1")
    assert (l3.C, l3.K, l3.H, l3.R) == (96 + 2 * 48, 192, 56, 1)
    assert find_layer("densenet161.b1.l3.1x1") == l3          # alias
    assert find_layer("densenet161.b4", 64) == find_layer("densenet161.block4", 64)
    assert (find_layer("densenet161.t3").C, find_layer("densenet161.t3").K) == (2112, 1056)


def test_yolov3_layers():
    layers = network_layers("yolov3", winograd_only=False)
    assert sum(l.count for l in layers) == 75
    counts = {l.spec.name: l.count for l in layers}
    assert [counts[f"yolov3.res{i}"] for i in range(1, 6)] == [1, 2, 8, 8, 4]
    assert counts["yolov3.head1.3x3"] == 3
    down3 = find_layer("yolov3.down3")
    assert (down3.C, down3.K, down3.H, down3.stride, down3.out_h) == (128, 256, 104, 2, 52)
    assert find_layer("yolov3.head2.1x1_in").C == 768
    assert find_layer("yolov3.head3.3x3", resolution=320).H == 40


@pytest.mark.parametrize("suite", ["winograd", "direct"])
def test_suite_layers_resolve(suite):
    entries = _suite_entries(suite)
    assert entries
    for entry in entries:
        spec = find_layer(entry.name, batch=64)
        fields = ("N", "C", "K", "H", "W", "R", "S", "stride", "padding")
        assert [getattr(spec, f) for f in fields] == [getattr(entry, f) for f in fields], entry.name
    names = {entry.name.split(".", 1)[0] for entry in entries}
    if suite == "winograd":
        assert names == set(PAPER_NETWORKS)


def test_unknown_names():
    with pytest.raises(ValueError, match="known networks: vgg16"):
        network_layers("resnet51")
    with pytest.raises(ValueError, match="resnet50"):
        find_layer("resnet51.conv2_x")
    with pytest.raises(ValueError, match="close matches: resnet50.conv2_x"):
        find_layer("resnet50.conv2x")
    with pytest.raises(ValueError):
        find_layer("conv2_x")
    with pytest.raises(ValueError):
        find_layer("vgg16.conv6_1")


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_resolution(bad):
    with pytest.raises(ValueError, match="resolution"):
        network_layers("resnet50", resolution=bad)


def test_tiny_resolutions():
    # ResNet-50 never empties (padded convs and pool); VGG-16 pools five times.
    assert {l.spec.H for l in network_layers("resnet50", resolution=1)} == {1}
    with pytest.raises(ValueError, match="smallest resolution that works is 32"):
        network_layers("vgg16", resolution=16)
    assert network_layers("vgg16", resolution=32)[-1].spec.H == 2


def test_load_suite_file(tmp_path, monkeypatch):
    data = {"about": "x", "mine": [
        {"name": "a", "N": 8, "C": 16, "K": 32, "H": 10, "W": 12, "R": 3, "S": 3,
         "stride": 1, "pad": 1},
        {"name": "b", "N": 8, "C": 16, "K": 32, "H": 9, "W": 9, "R": 1, "S": 1,
         "stride": 2, "pad": 0}]}
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(data))
    a, b = load_suite(path, suite="mine")
    assert (a.N, a.C, a.K, a.H, a.W, a.padding, a.name) == (8, 16, 32, 10, 12, 1, "a")
    assert (b.R, b.stride, b.padding) == (1, 2, 0)
    assert [s.N for s in load_suite(path, suite="mine", batch=3)] == [3, 3]
    with pytest.raises(ValueError, match="suites: mine"):
        load_suite(path, suite="winograd")
    monkeypatch.setenv("MEGAWINO_SUITE", str(tmp_path))  # a directory means its layers.json
    assert load_suite(suite="mine") == load_suite(path, suite="mine")
    monkeypatch.setenv("MEGAWINO_SUITE", str(tmp_path / "missing.json"))
    with pytest.raises(FileNotFoundError, match="MEGAWINO_SUITE"):
        load_suite(suite="mine")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_suite(tmp_path / "nope.json")


def test_select_specs_by_name_or_unique_substring():
    from megawino.core.suite import select_specs
    specs = [LayerSpec(1, 8, 8, 8, 8, name=n) for n in ("a.x", "b.x", "c.y")]
    assert [s.name for s in select_specs(specs, "c.y,a.x")] == ["c.y", "a.x"]   # order named
    assert [s.name for s in select_specs(specs, ["b", "b.x"])] == ["b.x"]        # each once
    assert select_specs(specs, None) == specs and select_specs(specs, "") == specs
    with pytest.raises(ValueError, match="'zz' matches 0 layers"):
        select_specs(specs, "a.x,zz")
    with pytest.raises(ValueError, match="'x' matches 2 layers"):
        select_specs(specs, "x")
