from __future__ import annotations

import gc
import io
import subprocess
import sys
import textwrap

import pytest
import torch

from fastsab.adaptive.oom import is_out_of_memory
from fastsab.memory import collect_cuda_peak_alloc, collect_peak_alloc, profile_peak_bytes

MiB = 2**20


def test_known_allocations_peak():
    # 4 MiB + 4 MiB, free one, + 8 MiB: the most held at once is 12 MiB above the start
    def work():
        a = torch.empty(4 * MiB, dtype=torch.uint8)
        b = torch.empty(4 * MiB, dtype=torch.uint8)
        del a
        c = torch.empty(8 * MiB, dtype=torch.uint8)
        return b.numel() + c.numel()

    result, peak = profile_peak_bytes(work)
    assert result == 12 * MiB
    assert peak == 12 * MiB


def test_memory_held_before_is_not_counted():
    held = torch.empty(64 * MiB, dtype=torch.uint8)
    _, peak = profile_peak_bytes(lambda: torch.empty(MiB, dtype=torch.uint8).numel())
    assert peak == MiB
    del held


@pytest.mark.parametrize("nbytes", [1, 1000, 12345, 3 * MiB + 7])
def test_a_known_allocation_inside_the_step_is_the_peak(nbytes):
    def work(n):
        scratch = [torch.ones(16) for _ in range(50)]  # allocated and freed before the big one
        del scratch
        return torch.empty(n, dtype=torch.uint8).fill_(1).numel()

    features, peaks = collect_peak_alloc([nbytes, nbytes], work, progress=False)
    assert features == [nbytes, nbytes]
    assert peaks == [max(nbytes, 50 * 16 * 4)] * 2


def test_cpu_measurement_prints_nothing(capfd):
    linear = torch.nn.Linear(32, 64)

    def work(rows):
        linear(torch.randn(rows, 32)).sum().backward()
        return rows

    # pytest's stderr is not a terminal: the default progress bar is not drawn
    assert collect_peak_alloc([4, 8, 16], work).features == [4, 8, 16]
    profile_peak_bytes(lambda: torch.ones(10).sum())
    assert tuple(capfd.readouterr()) == ("", "")
    assert collect_peak_alloc([4, 8, 16], work, progress=False).features == [4, 8, 16]
    assert tuple(capfd.readouterr()) == ("", "")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_is_drawn_on_a_terminal_only_when_asked(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    collect_peak_alloc([1, 2, 3], lambda n: torch.zeros(n).numel())
    assert "3/3" in terminal.getvalue()
    terminal.seek(0)
    terminal.truncate()
    collect_peak_alloc([1, 2, 3], lambda n: torch.zeros(n).numel(), progress=False)
    assert terminal.getvalue() == ""
    with pytest.raises(TypeError, match="progress must be a bool, got 'yes'"):
        collect_peak_alloc([1], len, progress="yes")


def test_a_cycle_left_by_an_item_is_freed_before_the_next_item():
    def work(n):
        gc.collect()  # as an automatic collection might: it must find nothing of the item before
        kept = torch.empty(MiB, dtype=torch.uint8)
        cycle = [torch.empty(2 * MiB, dtype=torch.uint8)]
        cycle.append(cycle)  # garbage that only a collection frees
        return n + kept.numel() * 0

    assert collect_peak_alloc([1, 2, 3], work, progress=False).peaks == [3 * MiB] * 3


def test_objects_alive_before_are_left_out_of_collections_during_the_measurement_only():
    # NOTE: the suite freezes what it imported (tests/conftest.py): thawed here, and frozen again after
    gc.unfreeze()
    try:
        counts = []
        collect_peak_alloc([1, 2], lambda n: counts.append(gc.get_freeze_count()) or n, progress=False)
        assert len(counts) == 2 and min(counts) > 0 and gc.get_freeze_count() == 0
        with pytest.raises(ValueError, match="boom"):
            collect_peak_alloc([1], lambda n: (_ for _ in ()).throw(ValueError("boom")), progress=False)
        assert gc.get_freeze_count() == 0
        gc.freeze()  # a process that froze objects itself keeps them frozen
        frozen = gc.get_freeze_count()
        collect_peak_alloc([1], lambda n: n, progress=False)
        assert gc.get_freeze_count() == frozen
    finally:
        gc.freeze()


def test_linear_forward_activation_is_measured_exactly():
    linear, x = torch.nn.Linear(256, 512), torch.randn(64, 256)

    def work(batch):
        with torch.no_grad():
            return tuple(linear(batch).shape)

    features, peaks = collect_peak_alloc([x, x[:16]], work)
    assert features == [(64, 512), (16, 512)]
    assert peaks == [64 * 512 * 4, 16 * 512 * 4]  # the float32 output, nothing else


def test_conv_forward_peak_is_output_plus_at_most_im2col():
    conv, x = torch.nn.Conv2d(3, 8, 3, padding=1), torch.randn(1, 3, 32, 32)
    output_bytes, columns_bytes = 8 * 32 * 32 * 4, 3 * 3 * 3 * 32 * 32 * 4

    def work(batch):
        with torch.no_grad():
            return conv(batch).shape

    (_, [peak]) = collect_peak_alloc([x], work)
    assert output_bytes <= peak <= output_bytes + columns_bytes


def test_out_of_memory_items_are_skipped_other_errors_raise(capsys):
    def work(n):
        if n == 2:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
        return torch.zeros(n, MiB // 4).numel()

    cleanups = []
    result = collect_peak_alloc([1, 2, 3], work, cleanup=lambda: cleanups.append(1))
    features, peaks = result
    assert features == [MiB // 4, 3 * MiB // 4] and peaks == [MiB, 3 * MiB]
    assert result.skipped == [1] and len(cleanups) == 3
    assert "Out of memory at item 1, skipping it" in capsys.readouterr().err
    with pytest.raises(ValueError, match="boom"):
        collect_peak_alloc([1], lambda n: (_ for _ in ()).throw(ValueError("boom")))


@pytest.mark.slow
def test_real_cpu_out_of_memory_is_skipped_in_a_limited_process():
    script = textwrap.dedent(
        """
        import resource, torch
        from fastsab.memory import collect_peak_alloc
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        usage = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (usage + 768 * 2**20, hard))
        sizes = [2**20, 2**34, 2**21]  # 1 MiB, 16 GiB (cannot be had), 2 MiB
        result = collect_peak_alloc(sizes, lambda n: torch.ones(n, dtype=torch.uint8).numel())
        print(result.features, result.peaks, result.skipped)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == f"[{2**20}, {2**21}] [{2**20}, {2**21}] [1]"


def test_cpu_collector_refuses_absolute_baseline_and_other_devices():
    with pytest.raises(ValueError, match="baseline='absolute' cannot be measured on the CPU"):
        collect_peak_alloc([1], len, baseline="absolute")
    with pytest.raises(ValueError, match="device must be 'cpu' or a CUDA device, got 'meta'"):
        collect_peak_alloc([1], len, device="meta")
    with pytest.raises(ValueError, match="baseline must be one of 'absolute', 'subtract', got 'none'"):
        collect_peak_alloc([1], len, baseline="none")
    with pytest.raises(ValueError, match="device must be a CUDA device, got 'cpu'"):
        collect_cuda_peak_alloc([1], len, torch.device("cpu"))


class FakeCudaAllocator:
    """Just enough of the CUDA caching allocator's statistics to test the collector.

    Blocks are allocated and freed explicitly; the peak follows torch's semantics
    (reset_peak_memory_stats sets the peak to what is currently allocated).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity, self.allocated, self.peak = capacity, 0, 0
        self.empty_cache_calls = 0

    def alloc(self, nbytes: int) -> FakeBlock:
        if self.allocated + nbytes > self.capacity:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {nbytes} bytes")
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)
        return FakeBlock(self, nbytes)

    # the torch.cuda functions the collector calls
    def reset_peak_memory_stats(self, device=None) -> None:
        self.peak = self.allocated

    def memory_allocated(self, device=None) -> int:
        return self.allocated

    def memory_stats(self, device=None) -> dict:
        return {"allocated_bytes.all.peak": self.peak, "allocated_bytes.all.current": self.allocated}

    def empty_cache(self) -> None:
        self.empty_cache_calls += 1


class FakeBlock:
    def __init__(self, allocator: FakeCudaAllocator, nbytes: int) -> None:
        self.allocator, self.nbytes = allocator, nbytes

    def __del__(self) -> None:
        self.allocator.allocated -= self.nbytes


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCudaAllocator(capacity=100 * MiB)
    for name in ("reset_peak_memory_stats", "memory_allocated", "memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    return fake


def test_cuda_collector_with_fake_allocator(fake_cuda):
    weights = fake_cuda.alloc(10 * MiB)  # held before every item, like model weights
    kept = []

    def work(n):
        activations = [fake_cuda.alloc(n * MiB), fake_cuda.alloc(n * MiB)]
        del activations[0]
        kept.append(fake_cuda.alloc(MiB))  # a reference the cleanup releases
        return n

    cleanup_calls = []

    def cleanup():
        kept.clear()
        cleanup_calls.append(1)

    features, peaks = collect_cuda_peak_alloc([1, 2, 60, 3], work, "cuda:0", cleanup)
    # 60 MiB x 2 exceeds the 100 MiB device: skipped, and the next item starts clean again
    assert features == [1, 2, 3]
    # peak: weights + both activations (the 1 MiB block comes after one is freed)
    assert peaks == [(10 + 2) * MiB, (10 + 4) * MiB, (10 + 6) * MiB]
    assert len(cleanup_calls) == 4 and fake_cuda.empty_cache_calls == 4
    assert fake_cuda.allocated == 10 * MiB
    result = collect_cuda_peak_alloc([1, 60, 3], work, torch.device("cuda"), cleanup, baseline="subtract")
    assert result.peaks == [2 * MiB, 6 * MiB] and result.skipped == [1]
    del weights


def test_cuda_collector_drops_references_to_the_item_before_cleanup(fake_cuda):
    seen_allocated = []

    def work(block):
        return block.nbytes

    def cleanup():
        seen_allocated.append(fake_cuda.allocated)

    def items():
        for n in (3, 5):
            yield fake_cuda.alloc(n * MiB)

    features, _peaks = collect_cuda_peak_alloc(items(), work, "cuda")
    assert features == [3 * MiB, 5 * MiB]
    collect_cuda_peak_alloc(items(), work, "cuda", cleanup)
    assert seen_allocated == [0, 0]  # the item itself was released before cleanup ran


def test_collect_peak_alloc_dispatches_cuda_devices(fake_cuda):
    features, peaks = collect_peak_alloc([2], lambda n: fake_cuda.alloc(n * MiB).nbytes, device="cuda")
    assert features == [2 * MiB] and peaks == [2 * MiB]


@pytest.mark.parametrize(
    "message",
    [
        "CUDA out of memory. Tried to allocate 20.00 MiB",
        "CUDA error: out of memory",
        "HIP out of memory. Tried to allocate 2.00 GiB",
        "XPU out of memory. Tried to allocate 1.00 GiB",
        "MPS backend out of memory (MPS allocated: 1.00 GB)",
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes.",
        "DefaultCPUAllocator: not enough memory: you tried to allocate 8 bytes.",
    ],
)
def test_out_of_memory_messages(message):
    assert is_out_of_memory(RuntimeError(message))


def test_non_memory_errors_are_not_out_of_memory():
    assert is_out_of_memory(torch.OutOfMemoryError("x")) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("expected scalar type Float"))
    assert not is_out_of_memory(ValueError("CUDA out of memory"))
    assert not is_out_of_memory(RuntimeError())
