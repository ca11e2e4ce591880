"""SQL Server for the tests that can run on it: only when DBQ_MSSQL_DSN names a server
(`mssql://user:password@host:1433/db?driver=ODBC Driver 18 for SQL Server&TrustServerCertificate=yes`).
SQL Server cannot run on this machine, so here those tests are reported as skipped, with why."""

from __future__ import annotations

import os

import pytest

MSSQL_DSN = os.environ.get("DBQ_MSSQL_DSN", "")


def on_sqlserver(param: str) -> object:
    """A fixture parameter that runs only against the SQL Server DBQ_MSSQL_DSN names."""
    return pytest.param(
        param,
        marks=pytest.mark.skipif(
            not MSSQL_DSN, reason="DBQ_MSSQL_DSN is not set: SQL Server cannot run here"
        ),
    )
