from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader
from fastsab.memory import PolynomialRegression

f64 = torch.float64


def test_recovers_a_cubic_on_byte_sized_targets():
    # y in bytes up to ~3e10: scaling keeps degree 3 well conditioned
    x = torch.linspace(1, 4096, 50, dtype=f64)
    y = 1e3 + 5e2 * x + 3 * x**2 + 0.5 * x**3
    model = PolynomialRegression(3)
    report = model.fit(x, y)
    test = torch.tensor([7.0, 1000.5, 3000.0], dtype=f64)
    expected = 1e3 + 5e2 * test + 3 * test**2 + 0.5 * test**3
    assert torch.allclose(model(test), expected, rtol=1e-9, atol=1e-12 * float(y.max()))
    assert report.rmse / float(y.max()) < 1e-9


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-5, 5), min_size=1, max_size=5),
    st.lists(st.floats(0, 100), min_size=8, max_size=30, unique=True),
)
def test_horner_matches_direct_evaluation(coefficients, points):
    # invariant: fitting exact polynomial data and evaluating by Horner gives the polynomial back
    degree = len(coefficients) - 1
    x = torch.tensor(points, dtype=f64)
    if len(points) <= degree:
        return
    y = sum(c * x**k for k, c in enumerate(coefficients))
    model = PolynomialRegression(degree)
    model.fit(x, y)
    assert torch.allclose(model(x), y, rtol=1e-6, atol=1e-6 * (1 + float(y.abs().max())))


def test_two_feature_polynomial_of_total_degree_two():
    rng = np.random.default_rng(0)
    nodes = torch.from_numpy(rng.integers(1, 500, 200).astype(float))
    edges = torch.from_numpy(rng.integers(1, 3000, 200).astype(float))
    y = 100 + 3 * nodes + 2 * edges + 0.5 * nodes * edges + 0.01 * edges**2
    model = PolynomialRegression(2, num_features=2)
    assert model.num_terms == 6
    model.fit(torch.stack([nodes, edges], 1), y)
    grid = torch.tensor([[10.0, 20.0], [400.0, 2500.0]], dtype=f64)
    n, e = grid[:, 0], grid[:, 1]
    assert torch.allclose(model(grid), 100 + 3 * n + 2 * e + 0.5 * n * e + 0.01 * e**2, rtol=1e-9)


def test_upper_bound_covers_every_fitted_peak_and_reports_under_prediction():
    rng = np.random.default_rng(1)
    x = torch.linspace(16, 512, 40, dtype=f64)
    noise = torch.from_numpy(rng.normal(0, 2e4, 40))
    y = 5e5 + 1e3 * x + 4 * x**2 + noise
    plain = PolynomialRegression(2)
    plain_report = plain.fit(x, y)
    assert plain_report.max_under_prediction > 0 and plain_report.offset == 0  # least squares under-predicts some
    bounded = PolynomialRegression(2)
    report = bounded.fit(x, y, upper_quantile=1.0)
    assert bool((bounded(x) >= y - 1e-6).all())
    assert report.offset == pytest.approx(plain_report.max_under_prediction)
    assert report.max_under_prediction_final <= 1e-6
    q90 = PolynomialRegression(2)
    q90.fit(x, y, upper_quantile=0.9)
    assert float((q90(x) >= y).double().mean()) >= 0.9


def test_safety_margin_scales_predictions():
    x = torch.arange(1.0, 10.0, dtype=f64)
    plain, margin = PolynomialRegression(1), PolynomialRegression(1)
    plain.fit(x, 2 * x)
    margin.fit(x, 2 * x, safety_margin=0.1)
    assert torch.allclose(margin(x), 1.1 * plain(x))


def test_state_dict_json_and_files_round_trip(tmp_path):
    x = torch.linspace(0, 100, 20, dtype=f64)
    model = PolynomialRegression(2)
    model.fit(x, 7 + x**2 + torch.sin(x), upper_quantile=1.0, safety_margin=0.05)
    clone = PolynomialRegression(2)
    clone.load_state_dict(model.state_dict())
    assert torch.equal(clone(x), model(x))
    assert torch.equal(PolynomialRegression.from_json(model.to_json())(x), model(x))
    for name in ("model.json", "model.pt"):
        model.save(tmp_path / name)
        assert torch.equal(PolynomialRegression.load(tmp_path / name)(x), model(x))


def test_forward_keeps_the_input_dtype_and_is_vectorized():
    model = PolynomialRegression(2)
    model.fit(torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 2.0, 5.0]))
    out = model(torch.arange(1_000_000, dtype=torch.float32))
    assert out.dtype == torch.float32 and out.shape == (1_000_000,)
    assert out[:3].tolist() == [1.0, 2.0, 5.0]


def test_int_tensors_arrays_and_lists_are_accepted_like_float_tensors():
    reference = PolynomialRegression(2)
    x, y = torch.arange(0.0, 50.0, dtype=f64), 5 + 3 * torch.arange(0.0, 50.0, dtype=f64) ** 2
    reference.fit(x, y)
    points = [0, 7, 49, 100]
    expected = reference(torch.tensor(points, dtype=f64))
    for form in (
        torch.tensor(points),
        torch.tensor(points, dtype=torch.int32),
        np.array(points),
        points,
        tuple(points),
    ):
        out = reference(form)
        assert out.dtype == f64 and torch.equal(out, expected)
    for x_form, y_form in ((x.long(), y), (x.numpy(), y.numpy()), (x.tolist(), y.long().tolist())):
        model = PolynomialRegression(2)
        model.fit(x_form, y_form)
        assert torch.equal(model.coefficients, reference.coefficients)
    two = PolynomialRegression(1, 2)
    two.fit([[0, 0], [1, 0], [0, 1], [1, 1]], [1, 3, 4, 6])
    assert two(np.array([[2, 2]])).round().tolist() == [11.0]
    with pytest.raises(ValueError, match=r"x must be finite, got inf at position 1"):
        reference([1.0, float("inf")])


def test_as_loader_sizeof_with_features():
    lengths = torch.randint(8, 200, (500,))
    model = PolynomialRegression(1)
    model.fit(torch.tensor([0.0, 100.0], dtype=f64), torch.tensor([1000.0, 101_000.0], dtype=f64))  # 1000 + 1000 L
    loader = FastSizeAwareLoader(torch.arange(500), model, 200_000, features=lengths.double())
    for batch in loader:
        assert float((1000 + 1000 * lengths[batch]).sum()) <= 200_000


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: PolynomialRegression(-1), ValueError, r"degree must be a non-negative integer, got -1"),
        (lambda: PolynomialRegression(1.5), ValueError, r"degree must be a non-negative integer, got 1.5"),
        (lambda: PolynomialRegression(True), ValueError, r"degree must be a non-negative integer, got True"),
        (lambda: PolynomialRegression(1, num_features=0), ValueError, r"num_features must be a positive integer"),
        (
            lambda: PolynomialRegression(1).fit(torch.ones(3, 1), torch.ones(3)),
            ValueError,
            r"x must be 1-D, got shape \(3, 1\)",
        ),
        (
            lambda: PolynomialRegression(1).fit(["1", "2"], torch.ones(2)),
            TypeError,
            r"x must hold integers or floats, got dtype <U1: \['1', '2'\]",
        ),
        (
            lambda: PolynomialRegression(1).fit(torch.tensor([True, False]), torch.ones(2)),
            TypeError,
            r"x must hold integers or floats, got dtype torch.bool",
        ),
        (
            lambda: PolynomialRegression(1).fit(torch.ones(3), torch.ones(3, dtype=torch.complex64)),
            TypeError,
            r"y must hold integers or floats, got dtype torch.complex64",
        ),
        (lambda: PolynomialRegression(1)([1.0, None]), TypeError, r"x must hold integers or floats, got dtype object"),
        (
            lambda: PolynomialRegression(1).fit(torch.ones(3), torch.ones(4)),
            ValueError,
            r"x and y must have the same number of points, got 3 and 4",
        ),
        (
            lambda: PolynomialRegression(3).fit(torch.ones(3), torch.ones(3)),
            ValueError,
            r"fitting 4 coefficients \(degree 3\) needs at least 4 points, got 3",
        ),
        (
            lambda: PolynomialRegression(1).fit(torch.ones(3), torch.tensor([1.0, float("nan"), 2.0])),
            ValueError,
            r"y must be finite, got nan at position 1",
        ),
        (
            lambda: PolynomialRegression(1).fit(torch.arange(3.0), torch.ones(3), upper_quantile=0),
            ValueError,
            r"upper_quantile must be in \(0, 1\], got 0",
        ),
        (
            lambda: PolynomialRegression(1).fit(torch.arange(3.0), torch.ones(3), safety_margin=-1),
            ValueError,
            r"safety_margin must be a finite number >= 0",
        ),
        (lambda: PolynomialRegression(1)(torch.ones(3)), RuntimeError, r"PolynomialRegression is not fitted"),
        (
            lambda: PolynomialRegression(1, 2).fit(torch.ones(3, 3), torch.ones(3)),
            ValueError,
            r"x must have 2 columns, got shape \(3, 3\)",
        ),
    ],
)
def test_bad_input(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_several_features_predict_each_point_as_alone() -> None:
    # a point's prediction does not depend on the other points evaluated with it (bit for bit)
    model = PolynomialRegression(3, num_features=3)
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(500, 3, generator=generator, dtype=torch.float64) * 100
    model.fit(x, (x**2).sum(dim=1) + x.prod(dim=1) + torch.rand(500, generator=generator, dtype=torch.float64))
    together = model(x)
    alone = torch.cat([model(x[i : i + 1]) for i in range(len(x))])
    assert torch.equal(together, alone)


def _quadratic_model() -> PolynomialRegression:
    x = torch.linspace(0, 10, 11, dtype=f64)
    model = PolynomialRegression(2)
    model.fit(x, 3 * x**2 + 2 * x + 1)
    return model


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("how", ["to", "method", "parent"])
def test_a_model_run_in_low_precision_keeps_its_float64_state(dtype: torch.dtype, how: str) -> None:
    model = _quadratic_model()
    x = torch.tensor([20.0, 123.0], dtype=f64)
    expected = model(x)
    if how == "to":
        model.to(dtype)
    elif how == "method":
        model.half() if dtype == torch.float16 else model.bfloat16()
    else:  # inside a network converted as a whole, as a trainer's precision setting does
        torch.nn.Sequential(torch.nn.Linear(2, 2), model).to(dtype)
    assert {buffer.dtype for name, buffer in model.named_buffers() if name not in ("exponents", "fitted")} == {f64}
    # the model predicts what it did before, to the last bit
    assert torch.equal(model(x), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_predictions_in_low_precision_never_fall_below_the_model(dtype: torch.dtype) -> None:
    model = _quadratic_model()
    x = torch.arange(0, 140, dtype=dtype)  # (float16 holds costs up to 65504)
    out = model(x)
    exact = model(x.to(f64))
    assert out.dtype == dtype
    # rounded up, never to a smaller cost (but for float64's own rounding): a budget planned from them holds
    assert (out.to(f64) >= exact * (1 - 1e-9)).all()
    assert (out.to(f64) > exact).sum() > len(x) // 2  # most are not exact in the narrower dtype
    assert (out.to(f64) <= exact * 1.01).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fit_on_low_precision_tensors_equals_the_float32_fit(dtype: torch.dtype) -> None:
    x = torch.arange(0, 64, 4, dtype=torch.float32)  # exact in both dtypes
    y = 2 * x + 8
    reference = PolynomialRegression(1)
    reference.fit(x, y)
    model = PolynomialRegression(1)
    model.fit(x.to(dtype), y.to(dtype))
    assert torch.equal(model.coefficients, reference.coefficients)
    assert torch.equal(model(x.to(dtype)).to(f64), reference(x.to(f64)).to(dtype).to(f64))
