"""Sinusoid tasks: the MAML paper's distribution, seeded and resumable."""

import numpy as np
import pytest
import tensorflow as tf

from metalearn.tasks import Sinusoid


def _as_numpy(episode):
    return [np.asarray(t) for t in episode]


def test_shapes_and_ranges():
    episode = Sinusoid(shots=5, queries=7).sample(tf.constant([0, 0]), num_tasks=30)
    assert [tuple(t.shape) for t in episode] == [(30, 5, 1), (30, 5, 1), (30, 7, 1),
                                                 (30, 7, 1)]
    x = np.concatenate([episode.support_x, episode.query_x], axis=1)
    y = np.concatenate([episode.support_y, episode.query_y], axis=1)
    assert x.min() >= -5 and x.max() <= 5
    assert np.abs(y).max() <= 5.0


def test_support_and_query_share_one_sinusoid_per_task():
    episode = Sinusoid(shots=10, queries=10).sample(tf.constant([3, 4]), num_tasks=8)
    for t in range(8):
        x = np.concatenate([episode.support_x[t], episode.query_x[t]])[:, 0]
        y = np.concatenate([episode.support_y[t], episode.query_y[t]])[:, 0]
        # y = A sin(x - phi) = a sin x + b cos x: exactly linear in (sin x, cos x).
        basis = np.stack([np.sin(x), np.cos(x)], axis=1)
        coef, residual, *_ = np.linalg.lstsq(basis, y, rcond=None)
        assert np.allclose(basis @ coef, y, atol=1e-4)
        amplitude = np.hypot(*coef)
        assert 0.1 - 1e-4 <= amplitude <= 5.0 + 1e-4


def test_same_seed_same_tasks_and_splits_differ():
    sampler = Sinusoid()
    a = _as_numpy(next(iter(sampler.dataset(4, seed=7))))
    b = _as_numpy(next(iter(sampler.dataset(4, seed=7))))
    c = _as_numpy(next(iter(sampler.dataset(4, seed=7, split="test"))))
    d = _as_numpy(next(iter(sampler.dataset(4, seed=8))))
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.allclose(a[0], c[0]) and not np.allclose(a[0], d[0])


def test_resumed_stream_continues_the_uninterrupted_one():
    sampler = Sinusoid()
    full = [_as_numpy(e) for e in sampler.dataset(3, seed=1, num_steps=6)]
    resumed = [_as_numpy(e) for e in sampler.dataset(3, seed=1, start_step=4, num_steps=2)]
    for u, v in zip(full[4:], resumed):
        for a, b in zip(u, v):
            np.testing.assert_array_equal(a, b)


def test_streams_are_disjoint():
    sampler = Sinusoid()
    s0 = [_as_numpy(e) for e in sampler.dataset(3, seed=1, streams=[0], num_streams=2,
                                                num_steps=2)]
    s1 = [_as_numpy(e) for e in sampler.dataset(3, seed=1, streams=[1], num_streams=2,
                                                num_steps=2)]
    both = [_as_numpy(e) for e in sampler.dataset(3, seed=1, streams=[0, 1], num_streams=2,
                                                  num_steps=2)]
    assert not np.allclose(s0[0][0], s1[0][0])
    for got, want in zip(both, [s0[0], s1[0], s0[1], s1[1]]):  # interleaved per step
        np.testing.assert_array_equal(got[0], want[0])
    with pytest.raises(ValueError, match=r"streams must be .* \[0, 2\), got \[2\]"):
        sampler.dataset(3, streams=[2], num_streams=2)


@pytest.mark.parametrize("kwargs, message", [
    ({"shots": 0}, "shots must be >= 1, got 0"),
    ({"amplitude": (5.0, 0.1)}, r"amplitude must be .* got \(5.0, 0.1\)"),
])
def test_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sinusoid(**kwargs)


def test_bad_split():
    with pytest.raises(ValueError, match="split must be one of .* got 'dev'"):
        Sinusoid().dataset(2, split="dev")
