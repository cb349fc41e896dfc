"""PadCollator and PackCollator against a per-sample reference, as collate_fn of the loaders and of DataLoader."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from fastsab import FastLoader, FastSizeAwareLoader
from fastsab.varlen.collate import PackCollator, PadCollator


def reference_pad(samples: list[dict[str, Any]], pads: dict[str, int], multiple: int | None) -> dict[str, Any]:
    """Each sequence padded by hand, one sample at a time."""
    token_keys = [key for key, value in samples[0].items() if torch.as_tensor(value).ndim == 1]
    lengths = [len(sample[token_keys[0]]) for sample in samples] if token_keys else [0] * len(samples)
    width = max(lengths)
    if multiple:
        width = -(-width // multiple) * multiple
    batch: dict[str, Any] = {}
    for key in samples[0]:
        if key in token_keys:
            rows = [
                list(torch.as_tensor(s[key]).tolist()) + [pads.get(key, 0)] * (width - len(s[key])) for s in samples
            ]
            batch[key] = rows
        else:
            batch[key] = [torch.as_tensor(s[key]).item() for s in samples]
    batch["attention_mask"] = [[1] * n + [0] * (width - n) for n in lengths]
    return batch


def reference_pack(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Each sequence appended by hand, one sample at a time."""
    batch: dict[str, Any] = {}
    positions: list[int] = []
    cu = [0]
    token_keys = [key for key, value in samples[0].items() if torch.as_tensor(value).ndim == 1]
    for sample in samples:
        n = len(sample[token_keys[0]])
        positions += list(range(n))
        cu.append(cu[-1] + n)
        for key, value in sample.items():
            if key in token_keys:
                batch.setdefault(key, []).extend(torch.as_tensor(value).tolist())
            else:
                batch.setdefault(key, []).append(torch.as_tensor(value).item())
    batch.update(position_ids=positions, cu_seqlens=cu, max_seqlen=max(cu[i + 1] - cu[i] for i in range(len(samples))))
    return batch


def as_lists(batch: dict[str, Any]) -> dict[str, Any]:
    return {key: value.tolist() if isinstance(value, torch.Tensor) else value for key, value in batch.items()}


@st.composite
def sample_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    lengths = draw(st.lists(st.integers(0, 12), min_size=1, max_size=8))
    form = draw(st.sampled_from(["tensor", "numpy", "list"]))
    samples = []
    for i, n in enumerate(lengths):
        ids = np.arange(n, dtype=np.int64) + 100 * i
        as_form = {"tensor": torch.from_numpy, "numpy": np.asarray, "list": list}[form]
        samples.append({"input_ids": as_form(ids), "labels": as_form(ids + 1), "label": i})
    return samples


@given(samples=sample_lists(), multiple=st.sampled_from([None, 1, 3, 8]), labels_pad=st.sampled_from([0, -100]))
def test_pad_collator_pads_each_sequence_as_by_hand(samples, multiple, labels_pad):
    batch = PadCollator({"labels": labels_pad}, pad_to_multiple_of=multiple)(samples)
    assert as_lists(batch) == reference_pad(samples, {"labels": labels_pad}, multiple)
    assert batch["input_ids"].dtype == torch.int64 and batch["attention_mask"].dtype == torch.int64
    assert list(batch) == ["input_ids", "labels", "label", "attention_mask"]


@given(samples=sample_lists())
def test_pack_collator_appends_each_sequence_as_by_hand(samples):
    batch = PackCollator()(samples)
    assert as_lists(batch) == reference_pack(samples)
    assert batch["cu_seqlens"].dtype == torch.int32 and batch["position_ids"].dtype == torch.int64
    assert type(batch["max_seqlen"]) is int


def test_one_pad_value_for_every_key_and_the_mask_padded_with_zero():
    samples = [{"input_ids": [1, 2], "attention_mask": [1, 1]}, {"input_ids": [3], "attention_mask": [1]}]
    batch = PadCollator(pad_value=7)(samples)
    assert batch["input_ids"].tolist() == [[1, 2], [3, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1], [1, 0]]  # the samples' own mask, padded with 0
    assert list(batch) == ["input_ids", "attention_mask"]


def test_empty_sequences_give_rows_of_padding_and_repeated_offsets():
    samples = [{"input_ids": torch.tensor([], dtype=torch.int64)}, {"input_ids": torch.tensor([4, 5])}]
    padded = PadCollator(pad_to_multiple_of=4)(samples)
    assert padded["input_ids"].tolist() == [[0, 0, 0, 0], [4, 5, 0, 0]]
    assert padded["attention_mask"].tolist() == [[0, 0, 0, 0], [1, 1, 0, 0]]
    packed = PackCollator()(samples)
    assert packed["cu_seqlens"].tolist() == [0, 0, 2] and packed["position_ids"].tolist() == [0, 1]
    only_empty = [{"input_ids": []}, {"input_ids": []}]
    assert PadCollator(pad_to_multiple_of=8)(only_empty)["input_ids"].shape == (2, 0)
    packed = PackCollator()(only_empty)
    assert packed["input_ids"].tolist() == [] and packed["cu_seqlens"].tolist() == [0, 0, 0]
    assert packed["max_seqlen"] == 0


def test_dtypes_are_kept_also_those_torch_cannot_scatter():
    samples = [{"input_ids": np.array([1, 2], dtype=np.uint16)}, {"input_ids": np.array([3], dtype=np.uint16)}]
    assert PadCollator()(samples)["input_ids"].dtype == torch.uint16
    tensors = [{"x": torch.tensor([1.5, 2.0], dtype=torch.bfloat16)}, {"x": torch.tensor([3.0], dtype=torch.bfloat16)}]
    padded = PadCollator(pad_value=-1)(tensors)["x"]
    assert padded.dtype == torch.bfloat16 and padded.tolist() == [[1.5, 2.0], [3.0, -1.0]]
    assert PackCollator()(tensors)["x"].dtype == torch.bfloat16


def test_scalars_are_stacked_as_default_collate_does():
    batch = PadCollator()([{"x": [1], "y": 0.5, "z": torch.tensor(2)}, {"x": [2], "y": 1.5, "z": torch.tensor(3)}])
    assert batch["y"].dtype == torch.float64 and batch["z"].tolist() == [2, 3]


def test_collators_are_the_collate_fn_of_the_loaders_and_of_dataloader():
    sequences = [{"input_ids": torch.arange(n), "index": i} for i, n in enumerate([3, 1, 4, 1, 5, 9, 2, 6])]
    lengths = torch.tensor([len(s["input_ids"]) for s in sequences])
    for collate in (PadCollator(), PackCollator()):
        dl = DataLoader(sequences, batch_size=3, collate_fn=collate)
        assert [b["index"].tolist() for b in dl] == [[0, 1, 2], [3, 4, 5], [6, 7]]
        with pytest.warns(UserWarning, match="once per sample, in Python"):
            loader = FastSizeAwareLoader(sequences, lengths, 10, seed=0, collate_fn=collate)
        seen = sorted(i for batch in loader for i in batch["index"].tolist())
        assert seen == list(range(8))
        with pytest.warns(UserWarning, match="once per sample, in Python"):
            fixed = FastLoader(sequences, 4, shuffle=False, collate_fn=collate)
        assert [b["index"].tolist() for b in fixed] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert pickle.loads(pickle.dumps(PadCollator({"labels": -100}, 8))).pad_value == {"labels": -100}


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match=r"pad_value must be a number .*got 'x' of type str"):
        PadCollator(pad_value="x")
    with pytest.raises(TypeError, match=r"pad_value\['labels'\] must be a number.*got None"):
        PadCollator(pad_value={"labels": None})
    with pytest.raises(TypeError, match=r"pad_value keys must be strings, got 1 of type int"):
        PadCollator(pad_value={1: 0})
    with pytest.raises(ValueError, match=r"pad_to_multiple_of must be a positive integer, got 0"):
        PadCollator(pad_to_multiple_of=0)
    with pytest.raises(TypeError, match=r"pad_to_multiple_of must be an integer, got 2.5"):
        PadCollator(pad_to_multiple_of=2.5)


@pytest.mark.parametrize(
    ("samples", "error", "match"),
    [
        ([], ValueError, r"PadCollator takes at least one sample, got an empty list \[\]"),
        (torch.zeros(2, 3), TypeError, r"PadCollator takes a list of samples, got tensor"),
        ([torch.arange(3)], TypeError, r"samples that are dicts .*got sample 0 = tensor\(\[0, 1, 2\]\) of type Tensor"),
        (
            [{"input_ids": [1]}, {"input_ids": [1], "labels": [2]}],
            ValueError,
            r"samples with the same keys: sample 0 has \['input_ids'\], sample 1 \['input_ids', 'labels'\]",
        ),
        (
            [{"x": torch.zeros(2, 3)}],
            ValueError,
            r"1-D per-token values and scalars, got 'x' of shape \(2, 3\) in sample 0",
        ),
        ([{"x": [1, 2], "y": [1]}], ValueError, r"sample 0 has per-token values of different lengths: x 2, y 1"),
        ([{"x": [1]}, {"x": 1}], ValueError, r"'x' is a token in sample 0 but not in sample 1, whose value is 1"),
        (
            [{"x": torch.tensor([1])}, {"x": torch.tensor([1], dtype=torch.int32)}],
            ValueError,
            r"'x' is a tensor of dtype torch.int64 in sample 0 but a tensor of dtype torch.int32 in sample 1",
        ),
        ([{"x": "abc"}], TypeError, r"tensors, arrays, lists and numbers, got 'x' = 'abc' of type str in sample 0"),
    ],
)
def test_bad_samples_are_named(samples, error, match):
    with pytest.raises(error, match=match):
        PadCollator()(samples)


def test_a_pad_value_for_a_key_the_batch_lacks_is_refused():
    with pytest.raises(
        ValueError, match=r"pad_value names \['label'\], which are not per-token keys .*\['input_ids', 'labels'\]"
    ):
        PadCollator({"label": -100})([{"input_ids": [1], "labels": [2]}])
    with pytest.raises(ValueError, match=r"pad_value 1.5 of key 'x' does not fit its dtype int64"):
        PadCollator(1.5)([{"x": [1, 2]}, {"x": [3]}])
    with pytest.raises(ValueError, match=r"pad_value -100 of key 'labels' does not fit its dtype uint8"):
        PadCollator({"labels": -100})(
            [{"labels": np.array([1, 2], dtype=np.uint8)}, {"labels": np.array([3], np.uint8)}]
        )


def test_pack_collator_refuses_the_keys_it_makes():
    with pytest.raises(ValueError, match=r"PackCollator makes the keys .*position_ids.*; got \['position_ids'\]"):
        PackCollator()([{"input_ids": [1], "position_ids": [0]}])


def test_nan_pads_float_values():
    padded = PadCollator(float("nan"))([{"x": np.array([1.0, 2.0])}, {"x": np.array([3.0])}])["x"]
    assert padded[0].tolist() == [1.0, 2.0] and padded[1, 0] == 3.0 and torch.isnan(padded[1, 1])


@pytest.mark.parametrize(
    ("pad", "dtype", "shown"),
    [(float("nan"), np.int64, "nan"), (1e300, np.float32, "1e\\+300"), (float("inf"), np.int32, "inf")],
)
def test_a_pad_value_its_dtype_cannot_hold_raises_only_the_value_error(pad, dtype, shown):
    # under warnings as errors too: numpy's cast warning must not stand in for the message
    samples = [{"x": np.array([1, 2], dtype=dtype)}, {"x": np.array([3], dtype=dtype)}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=rf"pad_value {shown} of key 'x' does not fit its dtype {np.dtype(dtype)}"):
            PadCollator(pad_value=pad)(samples)


def test_every_name_of_fastsab_collate_is_the_one_of_its_module():
    import fastsab
    from fastsab.varlen import collate, collator

    for name in collate.__all__:
        home = collator if name in collator.__all__ else collate
        assert getattr(collate, name) is getattr(home, name)
    assert {"Collator", "Flat", "pack_positions"} <= set(collate.__all__)
    assert fastsab.PadCollator is collate.PadCollator and fastsab.PackCollator is collate.PackCollator


def test_the_former_module_path_gives_the_same_objects():
    # the module the README named before the package had stage folders still imports
    import fastsab
    import fastsab.collate
    from fastsab.varlen import collate

    assert fastsab.collate.PadCollator is fastsab.PadCollator is collate.PadCollator
    assert fastsab.collate.PackCollator is fastsab.PackCollator is collate.PackCollator
    assert fastsab.collate.Collator is collate.Collator
    assert fastsab.collate.pack_positions is collate.pack_positions
    assert fastsab.collate.__all__ == ["Collator", "Flat", "PackCollator", "PadCollator", "pack_positions"]
