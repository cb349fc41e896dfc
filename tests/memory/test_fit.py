from __future__ import annotations

import textwrap

import pytest
import torch

from fastsab.cli import main
from fastsab.memory import PolynomialRegression, fit_memory_model, module_work

MiB = 2**20


def test_fit_memory_model_of_a_linear_workload():
    # work(n) allocates n x 1024 float32 = 4 KiB per row
    fit = fit_memory_model(lambda n: torch.zeros(n, 1024).numel(), [64, 128, 256, 512, 768], degree=1)
    assert fit.peaks == [n * 4096 for n in (64, 128, 256, 512, 768)]
    assert fit.model(torch.tensor([2048.0])).item() == pytest.approx(2048 * 4096, rel=1e-9)
    assert fit.report.max_under_prediction_final <= 1e-6 and fit.skipped == []


def test_module_work_train_and_eval():
    module = torch.nn.Linear(8, 4)
    work, cleanup = module_work(module, lambda n: torch.randn(n, 8))
    work(5)
    assert module.weight.grad is not None
    cleanup()
    assert module.weight.grad is None
    work_eval, _ = module_work(module, lambda n: (torch.randn(n, 8),), train=False)
    work_eval(5)
    assert module.weight.grad is None


def test_fit_needs_sizes():
    with pytest.raises(ValueError, match="sizes must not be empty"):
        fit_memory_model(len, [])


def test_fit_memory_cli_saves_model_and_plot(tmp_path, monkeypatch, capsys):
    (tmp_path / "toy_models.py").write_text(
        textwrap.dedent(
            """
            import torch

            def mlp():
                return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))

            def tokens(n):
                return torch.randn(n, 16)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out, plot = tmp_path / "mlp.json", tmp_path / "mlp.png"
    args = ["fit-memory", "toy_models:mlp", "--sizes", "32:256:32", "--input", "toy_models:tokens", "--degree", "1"]
    assert main([*args, "--out", str(out), "--plot", str(plot)]) == 0
    printed = capsys.readouterr().out
    assert "measured 8 sizes (0 ran out of memory: [])" in printed and "saved the model to" in printed
    model = PolynomialRegression.load(out)
    # a forward+backward of n tokens allocates at least the n x 64 hidden activations (float32)
    assert model(torch.tensor([1024.0], dtype=torch.float64)).item() >= 1024 * 64 * 4
    assert plot.read_bytes()[:4] == b"\x89PNG"
    default_out = tmp_path / "default.pt"
    assert (
        main(
            [
                "fit-memory",
                "toy_models:mlp",
                "--sizes",
                "8,16,32",
                "--input-dim",
                "16",
                "--eval",
                "--out",
                str(default_out),
            ]
        )
        == 0
    )
    assert PolynomialRegression.load(default_out).degree == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fit-memory", "nomodule", "--sizes", "1,2,3"], "expected 'package.module:name'"),
        (["fit-memory", "builtins:dict", "--sizes", "1,2,3"], "builtins:dict returned dict, not a torch.nn.Module"),
        (["fit-memory", "no_such_pkg:make", "--sizes", "1,2,3"], "cannot import 'no_such_pkg:make'"),
    ],
)
def test_fit_memory_cli_bad_model(args, message):
    with pytest.raises(SystemExit, match=message):
        main(args)


def test_fit_memory_cli_bad_sizes(capsys):
    with pytest.raises(SystemExit):
        main(["fit-memory", "x:y", "--sizes", "0:8:2"])
    assert "expected positive sizes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kind", "factory", "sizes"),
    [
        ("images", "cnn", "8:32:8"),
        ("graphs", "gnn", "10:60:10"),
        ("sequences", "encoder", "8:40:8"),
        ("packed", "encoder", "8:40:8"),
    ],
)
def test_fit_memory_cli_fits_a_batch_model_per_kind(tmp_path, monkeypatch, capsys, kind, factory, sizes):
    from fastsab.memory import BatchMemoryModel

    (tmp_path / "kind_models.py").write_text(
        textwrap.dedent(
            """
            import torch

            def cnn():
                return torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.ReLU())

            class Gnn(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.linear = torch.nn.Linear(4, 4)

                def forward(self, x, edges):
                    h = self.linear(x)
                    return torch.zeros_like(h).index_add(0, edges[1], h[edges[0]])

            def gnn():
                return Gnn()

            def encoder():
                return torch.nn.TransformerEncoderLayer(4, 1, 8, dropout=0.0, batch_first=True)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "model.json"
    args = ["fit-memory", f"kind_models:{factory}", "--kind", kind, "--sizes", sizes, "--input-dim", "4"]
    assert main([*args, "--batches", "12", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"measured 12 batches of {kind}" in printed and "held-back batches (3)" in printed
    model = BatchMemoryModel.from_json(out.read_text())
    assert model.advice in printed and model.fit.num_batches == 12
    assert model.cost == ("sum" if kind in ("graphs", "packed") else "padded")
    assert model.fit.worst_under_prediction <= 0
    assert model.per_item.num_features == (2 if kind in ("images", "graphs") else 1)


@pytest.mark.parametrize(
    ("option", "match"),
    [
        (["--safety-margin", "0.1"], r"--safety-margin 0\.1 does not apply to --kind sequences"),
        (["--plot", "fit.png"], r"--plot 'fit\.png' does not apply to --kind sequences"),
        (["--input", "torch:randn"], r"--input 'torch:randn' does not apply to --kind sequences"),
        (["--batch", "4"], r"--batch 4 does not apply to --kind sequences"),
    ],
)
def test_fit_memory_cli_refuses_the_options_of_sizes_with_a_batch_kind(option, match):
    args = ["fit-memory", "torch.nn:Identity", "--kind", "sequences", "--sizes", "8,16", *option]
    with pytest.raises(SystemExit, match=match):
        main(args)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fit_memory_model_takes_low_precision_sizes(dtype: torch.dtype) -> None:
    sizes = [64, 128, 256, 512, 768]  # exact in both dtypes
    fit = fit_memory_model(lambda n: torch.zeros(int(n), 1024).numel(), torch.tensor(sizes, dtype=dtype), degree=1)
    assert fit.sizes == sizes and fit.peaks == [n * 4096 for n in sizes]
    # predictions for float64 sizes as with sizes given as integers; for the narrow dtype, rounded up to it
    assert fit.model(torch.tensor([2048.0], dtype=torch.float64)).item() == pytest.approx(2048 * 4096, rel=1e-9)
    assert fit.model(torch.tensor([8.0], dtype=dtype)).item() >= 8 * 4096 * (1 - 1e-9)
