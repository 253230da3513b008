"""Shared pytest configuration: hypothesis profiles ``dev`` and ``ci``.

``ci`` is chosen when the ``CI`` environment variable is set (CI runs
``.ci/run`` with ``CI=true``) or with ``HYPOTHESIS_PROFILE=ci``: derandomised,
no deadline, no example database, and the reproduce blob printed on failure.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
