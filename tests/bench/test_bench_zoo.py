"""bench/models.py --zoo (bench/zoo.py) on the CPU: its per-model record with small models on
megawino's CPU executor, a failing model as a row of its own, the run's exit status, its
arguments (no torchvision needed)."""
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench_module(name):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return __import__(name)


class Tiny(nn.Module):
    """A classifier with a layer megawino runs (3x3), one it hands to PyTorch on the CPU (1x1)
    and one it leaves alone (depthwise)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pointwise = nn.Conv2d(8, 16, 1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.pointwise(torch.relu(self.depthwise(torch.relu(self.stem(x))))))
        return self.fc(x.mean((2, 3)))


def broken():
    raise RuntimeError("no such layer")


def test_zoo_record_of_a_small_model():
    zoo = _bench_module("zoo")
    row = zoo.model_record("tiny", Tiny, 3, 12, device="cpu")
    assert "error" not in row, row
    assert (row["layers"], row["replaced"], row["on_megawino"]) == (3, 2, 1)
    assert list(row["left_alone"]) == ["depthwise"] and "groups" in row["left_alone"]["depthwise"]
    assert row["left_alone_reasons"] == {"megawino runs groups=1 only (no grouped or depthwise convolution)": 1}
    assert row["algos"] == {"cpu-executor": 1, "pytorch-cpu": 1}
    assert 0 < row["rel_l2"]["megawino"] < 1e-5 and row["rel_l2"]["pytorch_fp32"] < 1e-5
    assert row["top1"] == {"pytorch_fp32": 1.0, "megawino": 1.0}
    assert row["error_within_bar"] is True and row["convert_s"] > 0
    assert not any(key.endswith("_ms") for key in row)          # no timings on the CPU
    line = zoo.progress_line(1, 2, row, 0.5)
    assert "tiny" in line and "2/3 converted" in line


def test_zoo_error_sources_send_the_other_families_to_pytorch():
    zoo = _bench_module("zoo")
    row = zoo.model_record("tiny", Tiny, 3, 12, device="cpu", error_sources=True)
    sources = row["error_sources"]
    assert sources["3x3 layers on megawino"] == 1                  # the stem (the depthwise is left alone)
    assert sources["1x1 layers on megawino"] == 0 and sources["other layers on megawino"] == 0
    assert sources["3x3 only"] > 0 and sources["3x3 only"] != row["rel_l2"]["pytorch_fp32"]
    # Every layer sent to PyTorch: the unconverted model's bits.
    assert sources["other only"] == row["rel_l2"]["pytorch_fp32"]
    assert sources["1x1 only"] < 2 * row["rel_l2"]["pytorch_fp32"]      # the CPU's choice for it: PyTorch


def test_scale_bias_is_the_error_along_the_output():
    zoo = _bench_module("zoo")
    ref = torch.randn(4, 8, 5, 5, dtype=torch.float64)
    shrunk = zoo.error_and_scale_bias((ref * (1 - 3e-7)).float(), ref)
    assert shrunk["scale_bias"] == pytest.approx(-3e-7, abs=2e-8)            # float32 rounding aside
    noise = torch.randn(ref.shape, dtype=torch.float64) * 1e-6 * ref.abs().mean()
    noisy = zoo.error_and_scale_bias(ref + noise, ref)
    assert noisy["rel_l2"] > 5e-7 and abs(noisy["scale_bias"]) < noisy["rel_l2"] / 5   # random: little along ref


def test_scale_bias_needs_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without a GPU")
    models = _bench_module("models")
    assert models.main(["--scale-bias"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_zoo_counts_layers_that_never_ran_and_reasons_alike_together():
    zoo = _bench_module("zoo")

    class Aux(Tiny):          # an auxiliary head that eval mode skips, as Inception's
        def __init__(self):
            super().__init__()
            self.aux = nn.Conv2d(8, 4, 3)
            self.grouped = nn.Conv2d(8, 8, 3, groups=2)
    row = zoo.model_record("aux", Aux, 1, 8, device="cpu")
    assert row["algos"]["not run"] == 1 and row["replaced"] == 3
    assert list(row["left_alone_reasons"].values()) == [2]


def test_zoo_records_a_failure_and_goes_on():
    zoo = _bench_module("zoo")
    row = zoo.model_record("broken", broken, 1, 8, device="cpu")
    assert row["error"] == "build: RuntimeError: no such layer"
    assert "FAILED" in zoo.progress_line(1, 1, row, 0.1)


def test_zoo_run_writes_every_row_and_fails_when_a_model_fails(tmp_path, capsys):
    models, zoo = _bench_module("models"), _bench_module("zoo")
    builders = {"tiny": Tiny, "broken": broken}
    out = tmp_path / "zoo.json"
    argv = ["--zoo", "--device", "cpu", "--batch", "2", "--resolution", "32", "--json", str(out)]
    assert zoo.run_zoo(models.parse_args(argv + ["--models", "tiny"]), list(builders),
                       lambda name: builders[name]()) == 0
    assert zoo.run_zoo(models.parse_args(argv), list(builders), lambda name: builders[name]()) == 2
    doc = json.loads(out.read_text())
    assert [row["model"] for row in doc["rows"]] == ["tiny", "broken"] and doc["failed"] == ["broken"]
    assert doc["batch"] == 2 and doc["rows"][0]["resolution"] == 32 and doc["argv"] == argv
    printed = capsys.readouterr().out
    assert "[2/2] broken" in printed and "1 failed" in printed
    assert zoo.run_zoo(models.parse_args(argv + ["--models", "alexnet"]), list(builders)) == 2


def test_zoo_arguments():
    models = _bench_module("models")
    args = models.parse_args(["--zoo", "--models", "resnet18,inception_v3", "--batch", "2"])
    assert (args.zoo, args.models, args.batch, args.device, args.json) == (
        True, ["resnet18", "inception_v3"], 2, "cuda", None)
    assert models.parse_args(["--zoo"]).models == [] and models.parse_args(["--zoo"]).batch == 8
    for bad in (["--zoo", "--batch", "0"], ["--zoo", "--resolution", "8"], ["--zoo", "--device", "tpu"]):
        with pytest.raises(SystemExit):
            models.parse_args(bad)


def test_zero_initialised_classifiers_are_made_random():
    """A model whose classifier starts at zero (torchvision's ViTs) gives all-zero logits: the
    zoo draws such weights so its error against float64 and its top-1 mean something."""
    zoo = _bench_module("zoo")
    model = Tiny()
    with torch.no_grad():
        model.fc.weight.zero_()
        stem = model.stem.weight.clone()
    zoo.randomize_zero_weights(model)
    assert model.fc.weight.any() and float(model.fc.weight.std()) == pytest.approx(0.02, rel=0.5)
    assert torch.equal(model.stem.weight, stem)               # weights already random stay as they were
    row = zoo.model_record("tiny", lambda: model, 2, 12, device="cpu")
    assert "error" not in row and row["rel_l2"]["pytorch_fp32"] > 0
