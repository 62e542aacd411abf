"""Differential privacy: the release mechanism, public bounds, the privacy statement, the ledger,
fabrication (the smoother), the membership-inference score and the audit of the claim
(:mod:`kahm_dask.privacy.audit`). See docs/privacy.md."""

from kahm_dask.privacy.ledger import BudgetExceededError, PrivacyLedger
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import PrivacyLeakWarning
from kahm_dask.privacy.statement import PrivacyStatement

__all__ = ["GridLaplace", "PrivacyLeakWarning", "PrivacyLedger", "BudgetExceededError", "PrivacyStatement"]
