from __future__ import annotations

import numpy as np
import pytest
import torch

from fastsab.memory import GiB, KiB, MiB, PolynomialRegression, plan_memory, sample_nbytes


def test_units_and_sample_bytes():
    assert (KiB(1), MiB(1), GiB(1)) == (1024, 2**20, 2**30)
    assert sample_nbytes((torch.zeros(2, 3, dtype=torch.float16), np.zeros(5, dtype=np.int32))) == 12 + 20


def test_feeder_seed_configuration():
    # the feeder seed's example: 3 x 1024 x 1024 float32 inputs, (256,) outputs, reads of 2
    plan = plan_memory(
        cpu_memory_limit=GiB(2),
        gpu_memory_limit=GiB(1.5),
        total_sample_count=2048,
        input_shape=(3, 1024, 1024),
        output_shape=(256,),
        one_read_count=2,
        preferred_batch_size=16,
    )
    per_sample = 3 * 1024 * 1024 * 4 + 256 * 4
    assert plan.per_sample_cpu_bytes == per_sample
    assert plan.max_batch_size == GiB(1.5) // per_sample  # 127
    assert plan.batch_size == 16
    assert plan.samples_in_memory == GiB(2) // per_sample // 16 * 16  # 160
    assert plan.reads_in_memory == plan.samples_in_memory // 2
    assert plan.cpu_bytes_held <= GiB(2) and plan.gpu_bytes_at_batch <= GiB(1.5)


def test_preferred_batch_size_is_rounded_to_reads_and_capped_by_the_gpu():
    plan = plan_memory(gpu_memory_limit=MiB(10), input_shape=(1024,), preferred_batch_size=999, one_read_count=4)
    assert plan.max_batch_size == MiB(10) // 4096 and plan.batch_size == 996  # 999 rounded down to reads of 4
    assert plan.batch_size % 4 == 0
    plan = plan_memory(gpu_memory_limit=MiB(10), input_shape=(1024,), preferred_batch_size=10, one_read_count=4)
    assert plan.batch_size == 8 and any("preferred_batch_size=10 became 8" in note for note in plan.notes)


def test_model_state_is_counted():
    model = torch.nn.Linear(1000, 1000)  # 1,001,000 float32 parameters
    params = 1_001_000 * 4
    adam = plan_memory(gpu_memory_limit=MiB(64), input_shape=(1000,), model=model, optimizer="adam")
    assert adam.model_bytes == params * 4  # parameters, gradients, two Adam states
    sgd = plan_memory(gpu_memory_limit=MiB(64), input_shape=(1000,), model=model, optimizer="sgd")
    assert sgd.model_bytes == params * 2
    inference = plan_memory(gpu_memory_limit=MiB(64), input_shape=(1000,), model=model, train=False)
    assert inference.model_bytes == params
    assert adam.max_batch_size == (MiB(64) - params * 4) // 4000
    assert any("activations are not counted" in note for note in adam.notes)


def test_fitted_memory_model_of_the_batch():
    memory = PolynomialRegression(2)
    batches = torch.arange(1.0, 65.0, dtype=torch.float64)
    memory.fit(batches, 1e6 + 2e5 * batches + 1e3 * batches**2)
    plan = plan_memory(gpu_memory_limit=MiB(40), memory_model=memory, input_shape=(10,))
    need = lambda b: 1e6 + 2e5 * b + 1e3 * b**2 + 40 * b  # noqa: E731
    assert need(plan.max_batch_size) <= MiB(40) < need(plan.max_batch_size + 1)


def test_plan_prints_a_table():
    text = str(plan_memory(gpu_memory_limit=GiB(1), cpu_memory_limit=GiB(1), input_shape=(100,)))
    assert "batch size" in text and "samples held in CPU memory" in text and "MiB" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu_memory_limit": GiB(1)}, "nothing says how much memory a sample needs"),
        (
            {"gpu_memory_limit": MiB(1), "model": torch.nn.Linear(1000, 1000), "input_shape": (10,)},
            "the model's parameters, gradients and optimizer state need 15.3 MiB, more than gpu_memory_limit=1.0 MiB",
        ),
        (
            {"gpu_memory_limit": KiB(4), "input_shape": (1024,), "one_read_count": 2},
            r"cannot hold one read of 2 samples",
        ),
        (
            {"cpu_memory_limit": KiB(4), "input_shape": (1024,), "preferred_batch_size": 2},
            r"cannot hold one batch of 2 samples",
        ),
        ({"input_shape": (3,)}, "no batch size can be planned"),
        (
            {"sample": torch.zeros(3), "input_shape": (3,), "preferred_batch_size": 2},
            "give either sample or input_shape",
        ),
        ({"input_shape": (3, -1), "preferred_batch_size": 2}, "shapes must be tuples of non-negative integers"),
        (
            {"input_shape": (3,), "preferred_batch_size": 2, "model": torch.nn.Linear(2, 2), "optimizer": "lamb"},
            "optimizer must be one of",
        ),
        ({"input_shape": (3,), "preferred_batch_size": 0}, "preferred_batch_size must be a positive integer, got 0"),
    ],
)
def test_impossible_or_incomplete_plans_say_what_is_missing(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_memory(**kwargs)
