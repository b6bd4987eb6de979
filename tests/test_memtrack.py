"""The tensor peak tracker of the CPU benchmarks, against byte counts worked out by hand."""

import torch

from repro.ops.memtrack import TensorPeak

MB = 1000 * 1000 * 4  # bytes of a 1000 × 1000 float32 tensor


def test_peak_counts_new_storages_until_freed_and_not_views_or_inputs():
    x = torch.randn(1000, 1000)
    with TensorPeak() as tp:
        y = x @ x  # +1
        z = y.view(-1)  # a view: +0
        x.mul_(1.0)  # in place on an input: +0
        w = torch.relu(y)  # +1 → 2 live
        del y  # still alive through the view z
        v = w + 1  # +1 → 3 live (peak)
        del z, w  # y's and w's storages freed → 1 live
        u = v * 2  # +1 → 2 live
    assert tp.peak == 3 * MB
    assert tp.live == 2 * MB
    assert u.shape == v.shape


def test_peak_of_a_module_forward_matches_its_activations():
    lin = torch.nn.Linear(1000, 1000, bias=False)
    x = torch.randn(1000, 1000)
    with torch.no_grad(), TensorPeak() as tp:
        h = lin(x)  # one output: the weights and the input existed before
        out = torch.tanh(h)  # second output while the first is alive
    assert tp.peak == 2 * MB and out.shape == (1000, 1000)
