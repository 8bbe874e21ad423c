"""GLUE metrics against hand-computed values and independent formulas (scipy is not installed)."""

import numpy as np
import pytest

from bert_tf.tasks.classification import metrics


def test_accuracy_by_hand():
    # 1=1 yes, 0 vs 1 no, 1=1 yes, 1 vs 0 no -> 2/4.
    assert metrics.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    assert metrics.accuracy([], []) == 0.0


def test_binary_f1_and_mcc_by_hand():
    labels = [1, 1, 0, 0, 1]
    predictions = [1, 0, 1, 0, 1]
    # TP = 2 (rows 0, 4), FP = 1 (row 2), FN = 1 (row 1), TN = 1 (row 3).
    # P = 2/3, R = 2/3, F1 = 2/3.
    assert metrics.f1_score(labels, predictions) == pytest.approx(2 / 3)
    # MCC = (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (2 - 1) / sqrt(3*3*2*2) = 1/6.
    assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(1 / 6)


def test_f1_positive_class_only():
    # All predictions negative: no positive predicted, P undefined -> F1 0 (not NaN).
    assert metrics.f1_score([1, 0, 1], [0, 0, 0]) == 0.0
    # Positive class 0 instead: TP = 1 (row 1), predicted 0s = 3, actual 0s = 1 -> 2*1/(3+1) = 0.5.
    assert metrics.f1_score([1, 0, 1], [0, 0, 0], positive_label=0) == pytest.approx(0.5)


def test_mcc_equals_phi_coefficient_on_random_binary_data():
    rng = np.random.default_rng(0)
    for _ in range(20):
        labels = rng.integers(0, 2, 50)
        predictions = np.where(rng.random(50) < 0.7, labels, 1 - labels)
        # For two classes MCC is Pearson's correlation of the 0/1 vectors (the phi coefficient).
        expected = np.corrcoef(labels, predictions)[0, 1]
        assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(expected)


def test_mcc_multiclass_against_one_hot_covariance():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, 60)
    predictions = np.where(rng.random(60) < 0.6, labels, rng.integers(0, 3, 60))
    # Gorodkin's R_K is cov(X, Y) / sqrt(cov(X, X) cov(Y, Y)) with X, Y the one-hot matrices and
    # cov the sum of per-class covariances.
    x = np.eye(3)[labels]
    y = np.eye(3)[predictions]
    x -= x.mean(axis=0)
    y -= y.mean(axis=0)
    expected = np.sum(x * y) / np.sqrt(np.sum(x * x) * np.sum(y * y))
    assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(expected)


def test_mcc_degenerate_is_zero():
    assert metrics.matthews_corrcoef([1, 1, 1], [1, 1, 1]) == 0.0
    assert metrics.matthews_corrcoef([0, 1, 0], [1, 1, 1]) == 0.0


def test_pearson_by_hand_and_against_numpy():
    # x = 1,2,3 (mean 2), y = 1,2,4 (mean 7/3): dx = -1,0,1; dy = -4/3,-1/3,5/3.
    # sum dx*dy = 4/3 + 5/3 = 3; sum dx^2 = 2; sum dy^2 = (16+1+25)/9 = 42/9.
    # r = 3 / sqrt(2 * 42/9) = 9 / sqrt(84).
    assert metrics.pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(9 / np.sqrt(84))
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=40), rng.normal(size=40)
    assert metrics.pearson(x, x + 0.5 * y) == pytest.approx(np.corrcoef(x, x + 0.5 * y)[0, 1])
    assert metrics.pearson([1, 1, 1], [1, 2, 3]) == 0.0


def test_spearman_with_ties_by_hand():
    # x = 1,2,2,3 -> average ranks 1, 2.5, 2.5, 4; y = 1,3,2,4 -> ranks 1,3,2,4. Both mean 2.5.
    # dx = -1.5,0,0,1.5; dy = -1.5,0.5,-0.5,1.5: sum dx*dy = 4.5, sum dx^2 = 4.5, sum dy^2 = 5.
    # rho = 4.5 / sqrt(4.5 * 5) = 4.5 / sqrt(22.5).
    assert metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / np.sqrt(22.5))
    assert list(metrics.average_ranks([10, 20, 20, 5])) == [2.0, 3.5, 3.5, 1.0]


def test_spearman_without_ties_matches_the_d_squared_formula():
    rng = np.random.default_rng(3)
    n = 30
    x, y = rng.permutation(n), rng.permutation(n)
    # With distinct values: rho = 1 - 6 sum d^2 / (n (n^2 - 1)), d the rank differences.
    expected = 1 - 6 * np.sum((x - y) ** 2) / (n * (n * n - 1))
    assert metrics.spearman(x, y) == pytest.approx(expected)


def test_spearman_with_many_ties_against_counting_ranks():
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, 5, 50), rng.integers(0, 5, 50)

    def counting_ranks(values):
        # rank = (number of smaller values) + (number of equal values + 1) / 2
        return np.array([np.sum(values < v) + (np.sum(values == v) + 1) / 2 for v in values])

    expected = np.corrcoef(counting_ranks(x), counting_ranks(y))[0, 1]
    assert metrics.spearman(x, y) == pytest.approx(expected)


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="3 labels but 2 predictions"):
        metrics.accuracy([1, 2, 3], [1, 2])
