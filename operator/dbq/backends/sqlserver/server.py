"""The oldest SQL Server dbq's T-SQL runs on, and the check that refuses an older one.

SQL Server 2017 (major version 14) is the floor: the procedures read
`sys.sequences.last_used_value` and aggregate with `STRING_AGG`, both from 2017. The database
must be at compatibility level 130 or more, where `OPENJSON` and `STRING_SPLIT` exist.
"""

from __future__ import annotations

from dbq.errors import InvalidSpec

FLOOR_MAJOR = 14
FLOOR_LEVEL = 130
RELEASES = {11: "2012", 12: "2014", 13: "2016", 14: "2017", 15: "2019", 16: "2022", 17: "2025"}
# The server's major version (14 = SQL Server 2017): ProductVersion is '14.0.1000.169'.
MAJOR_VERSION = "CAST(PARSENAME(CAST(SERVERPROPERTY('ProductVersion') AS nvarchar(128)), 4) AS int)"
LEVEL = "(SELECT compatibility_level FROM sys.databases WHERE database_id = DB_ID())"
SERVER_VERSION = f"SELECT {MAJOR_VERSION}, {LEVEL}"


def refuse_below_floor(major: int, level: int) -> None:
    """Raise InvalidSpec (nothing is changed) when the server or the database is below the floor."""
    release = f"SQL Server {RELEASES.get(major, '?')} (major version {major})"
    if major < FLOOR_MAJOR:
        raise InvalidSpec(
            f"{release} is older than dbq supports: SQL Server 2017 (14) or later is needed"
            " (dbq's T-SQL reads sys.sequences.last_used_value and uses STRING_AGG); use a newer server"
        )
    if level < FLOOR_LEVEL:
        raise InvalidSpec(
            f"the database's compatibility level is {level}: dbq needs {FLOOR_LEVEL} or more on {release}"
            f" (for OPENJSON and STRING_SPLIT): ALTER DATABASE CURRENT SET COMPATIBILITY_LEVEL = {FLOOR_LEVEL}"
            " (or higher), after checking the database's other users"
        )
