"""ChunkGraph (foxdqn.device.chunk_graph): chunks of K steps keep exactly the records of a per-step
loop (CPU, eager); the captured chunk replays like the eager one, bit for bit (GPU)."""
import numpy as np
import pytest
import torch

from foxdqn.device.chunk_graph import ChunkGraph


def counter(device="cpu"):
    """A step adding (1, 2) to a long [2] state; records the state (long), its parity (bool) and
    half of it (float64)."""
    x = torch.zeros(2, dtype=torch.long, device=device)
    inc = torch.tensor([1, 2], device=device)

    def step():
        x.add_(inc)
        return {"x": x.clone(), "odd": x % 2 == 1, "half": x.double() / 2}

    return x, step


@pytest.mark.parametrize("chunk", [1, 3, 4, 10, 16])
def test_records_equal_a_per_step_loop(chunk):
    x, step = counter()
    host = ChunkGraph(step, torch.device("cpu"), chunk).run(10)
    expected = np.arange(1, 11)[:, None] * np.array([1, 2])
    np.testing.assert_array_equal(host["x"], expected)
    np.testing.assert_array_equal(host["odd"], expected % 2 == 1)
    np.testing.assert_array_equal(host["half"], expected / 2)
    assert (host["x"].dtype, host["odd"].dtype, host["half"].dtype) == (np.int64, np.bool_, np.float64)
    # the last chunk ran whole: its steps beyond max_steps happened, their records were dropped
    assert x.tolist() == [-(-10 // chunk) * chunk, 2 * (-(-10 // chunk) * chunk)]


def test_stop_sees_each_chunk_in_order_and_ends_the_run():
    seen = []

    def stop(records):
        seen.append(records["x"][:, 0].tolist())
        return records["x"][-1, 0] >= 5

    x, step = counter()
    walker = ChunkGraph(step, torch.device("cpu"), 3)
    host = walker.run(100, stop)
    assert seen == [[1, 2, 3], [4, 5, 6]] and walker.chunks_run == 2
    assert host["x"][:, 0].tolist() == [1, 2, 3, 4, 5, 6]
    # max_steps inside a chunk: stop gets the kept rows only
    seen.clear()
    x, step = counter()
    host = ChunkGraph(step, torch.device("cpu"), 3).run(4, lambda r: seen.append(r["x"][:, 0].tolist()))
    assert seen == [[1, 2, 3], [4]] and host["x"].shape == (4, 2) and int(x[0]) == 6


def test_without_keep_only_stop_sees_the_records():
    seen = []
    x, step = counter()
    host = ChunkGraph(step, torch.device("cpu"), 3).run(7, lambda r: seen.append(r["x"][:, 0].tolist()), keep=False)
    assert host == {} and seen == [[1, 2, 3], [4, 5, 6], [7]] and int(x[0]) == 9


def test_bad_arguments():
    _, step = counter()
    cpu = torch.device("cpu")
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="^chunk: must be an integer >= 1"):
            ChunkGraph(step, cpu, bad)
    with pytest.raises(ValueError, match="^use_graph: a CUDA graph needs a CUDA device, got cpu"):
        ChunkGraph(step, cpu, 4, use_graph=True)
    with pytest.raises(ValueError, match="^max_steps: must be an integer >= 1"):
        ChunkGraph(step, cpu, 4).run(0)
    calls = []

    def changing():
        calls.append(1)
        return {"a": torch.zeros(1)} if len(calls) == 1 else {"a": torch.zeros(1), "b": torch.zeros(1)}

    with pytest.raises(ValueError, match=r"^step: returned the records \['a', 'b'\], the first step returned \['a'\]"):
        ChunkGraph(changing, cpu, 4)()


def _random_walk(device, seed):
    """A step drawing from a generator: state [5] float32 += U[0,1); records the state and its argmax."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.zeros(5, device=device)

    def step():
        x.add_(torch.rand(5, device=device, generator=gen))
        return {"x": x.clone(), "argmax": x.argmax()}

    return gen, step


@pytest.mark.gpu
def test_gpu_captured_chunks_equal_eager_chunks():
    cuda = torch.device("cuda")
    _, eager_step = _random_walk(cuda, 7)
    eager = ChunkGraph(eager_step, cuda, 7).run(50)
    gen, graph_step = _random_walk(cuda, 7)
    walker = ChunkGraph(graph_step, cuda, 7, use_graph=True, generators=(gen,))
    graphed = walker.run(50)
    assert walker.graph is not None and walker.chunks_run == 8  # warm-up, capture + replay, 6 replays
    for name in eager:
        np.testing.assert_array_equal(graphed[name], eager[name], err_msg=name)
    assert len(np.unique(graphed["argmax"])) > 1  # the draws changed from replay to replay
