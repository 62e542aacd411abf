"""What the auditor's scores achieve: right guesses among the most confident canaries, the AUC
and the TPR at 1 % FPR.

The auditor guesses "x + d" where the LLR is > 0 and "x" where it is < 0, on the k canaries of
largest ``|LLR|`` (ties in random order, drawn independently of the coins) and abstains on the
rest; a canary with LLR = 0 is never guessed on. The LLR takes few distinct values (every
output outside ``[q0, q1]`` has the largest), so the ROC is a step curve with long ties; the TPR
at 1 % FPR is read off its linear interpolation, the rate a randomised threshold attains.

Examples
--------
>>> import numpy as np
>>> llr = np.array([2.0, -2.0, 1.0, 0.0])
>>> coins = np.array([True, False, False, True])
>>> correct_among_most_confident(llr, coins, np.array([4, 2])).tolist()
[2, 2]
>>> roc_summary(llr, coins)
(0.75, 0.5)
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

__all__ = ["correct_among_most_confident", "roc_summary", "ROC_FPR"]

#: The false-positive rate at which the TPR is reported.
ROC_FPR = 0.01


def correct_among_most_confident(llr: np.ndarray, coins: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Right guesses among the ``grid[i]`` canaries of largest ``|LLR|`` → int64 (len(grid),).

    ``llr``, ``coins``: one value per canary (any shape, flattened together).
    """
    llr, coins = np.ravel(llr), np.ravel(coins)
    confidence = np.abs(llr)
    order = np.lexsort((np.random.default_rng().random(llr.size), -confidence))
    right = ((llr > 0) == coins) & (confidence > 0)
    right_cum = np.concatenate([[0], np.cumsum(right[order])])
    return right_cum[np.asarray(grid, dtype=np.int64)]


def roc_summary(llr: np.ndarray, coins: np.ndarray) -> tuple[float, float]:
    """``(AUC, TPR at ROC_FPR)`` of the LLR as a score for "x + d" (module docstring)."""
    llr, coins = np.ravel(llr), np.ravel(coins)
    fpr, tpr, _ = roc_curve(coins, llr)
    return float(roc_auc_score(coins, llr)), float(np.interp(ROC_FPR, fpr, tpr))
