"""Closed forms of ParallelBench §4 against the spec's computed tables (parallelbench.md §2)."""

import math

import pytest

from dllm_decode.eval.theory.formulas import (fixed_step_partition, ideal_accuracy, latin_square_total_correlation,
                         list_task_total_correlation, replace_random_accuracy,
                         replace_random_total_correlation, shuffle_accuracy, shuffle_bound,
                         shuffle_total_correlation, task_total_correlation, threshold_partition,
                         total_correlation)


@pytest.mark.parametrize("n, c_shuffle, l_half, c_replace", [
    (3, 2.170, None, 1.170), (4, 3.415, 1.415, 1.245), (6, 6.018, 1.678, 1.315),
    (10, 11.43, 2.023, 1.368), (16, 19.75, 2.348, 1.397)])
def test_table_values(n, c_shuffle, l_half, c_replace):
    assert shuffle_total_correlation(n) == pytest.approx(c_shuffle, abs=6e-3)
    assert replace_random_total_correlation(n) == pytest.approx(c_replace, abs=6e-4)
    if l_half is not None:
        assert shuffle_bound((2,) * (n // 2)) == pytest.approx(l_half, abs=6e-4)


def test_enumeration_agrees_with_closed_forms():
    for n in (3, 4, 5):
        perms = list(__import__("itertools").permutations(range(n)))
        assert total_correlation(perms) == pytest.approx(shuffle_total_correlation(n))
        replaced = [tuple("w" if i == j else i for i in range(n)) for j in range(n)]
        assert total_correlation(replaced) == pytest.approx(replace_random_total_correlation(n))


def test_bound_boundary_cases():
    n = 5
    assert shuffle_bound((n,)) == pytest.approx(shuffle_total_correlation(n))   # L_1 = C
    assert shuffle_bound((1,) * n) == pytest.approx(0.0, abs=1e-12)              # L_|Y| = 0
    bounds = [shuffle_bound(fixed_step_partition(8, t)) for t in range(1, 9)]
    assert all(a >= b - 1e-12 for a, b in zip(bounds, bounds[1:]))              # Theorem 2


def test_ideal_accuracies():
    assert shuffle_accuracy((2, 2)) == pytest.approx(0.375)
    assert shuffle_accuracy((4,)) == pytest.approx(math.factorial(4) / 4 ** 4)
    assert shuffle_accuracy((2, 2, 2)) == pytest.approx(0.3125)
    assert shuffle_accuracy((1, 1, 1)) == 1.0
    assert replace_random_accuracy((3,), sampled=True) == pytest.approx(4 / 9)   # Fig. 1, 44.4%
    assert replace_random_accuracy((200,), sampled=True) == pytest.approx(1 / math.e, abs=2e-3)
    assert replace_random_accuracy((1,) * 5, sampled=True) == pytest.approx(1.0)
    assert replace_random_accuracy((2, 2), sampled=False) == 0.5
    assert replace_random_accuracy((3, 3), sampled=False) == 0.0
    assert ideal_accuracy("copy", (2, 2), False) is None


def test_partitions():
    assert fixed_step_partition(6, 4) == (2, 2, 1, 1)
    assert fixed_step_partition(3, 5) == (1, 1, 1)
    assert threshold_partition("shuffle", 6, 0.6) == (1,) * 6
    assert threshold_partition("shuffle", 6, 0.4) == (1,) * 4 + (2,)
    assert threshold_partition("replace_random", 6, 0.9) == (1,) * 6
    assert threshold_partition("replace_random", 6, 0.8) == (6,)


def test_task_total_correlation():
    assert latin_square_total_correlation() == pytest.approx(32 - math.log2(144))
    assert task_total_correlation("sudoku", None) == 0.0
    assert task_total_correlation("released/copy", 5) == 0.0
    assert task_total_correlation("copy", None) is None
    assert list_task_total_correlation("insert_random", 4) > 0
    assert task_total_correlation("unknown_task", 4) is None
