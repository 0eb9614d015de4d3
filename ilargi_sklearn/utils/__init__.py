"""Utilities: input validation shared by the estimators, and testing helpers."""
