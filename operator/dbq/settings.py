"""The operator's settings from its `DBQ_*` environment, read and checked in one place."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dbq.errors import InvalidSpec


@dataclass(frozen=True)
class OperatorSettings:
    drift_interval_s: float = 60.0  # DBQ_DRIFT_INTERVAL: how often objects are compared with the spec
    upkeep_tick_s: float = 5.0  # DBQ_UPKEEP_TICK: the shortest stats/cleanup interval
    workers: int = 8  # DBQ_WORKERS: handlers that run at once
    db_connections: int = 10  # DBQ_DB_CONNECTIONS: the most the operator opens to one database
    timezone: str = "UTC"  # DBQ_TIMEZONE: the zone maintenance cron schedules are read in
    # DBQ_SCALER_ADDRESS: host:port at which KEDA reaches this operator's push scaler (`dbq run
    # --scaler-port`); empty: QueueConsumers cannot use trigger push
    scaler_address: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        env = os.environ if env is None else env
        try:
            settings = cls(
                drift_interval_s=float(env.get("DBQ_DRIFT_INTERVAL", cls.drift_interval_s)),
                upkeep_tick_s=float(env.get("DBQ_UPKEEP_TICK", cls.upkeep_tick_s)),
                workers=int(env.get("DBQ_WORKERS", cls.workers)),
                db_connections=int(env.get("DBQ_DB_CONNECTIONS", cls.db_connections)),
                timezone=env.get("DBQ_TIMEZONE", cls.timezone),
                scaler_address=env.get("DBQ_SCALER_ADDRESS", cls.scaler_address),
            )
        except ValueError as e:
            raise InvalidSpec(
                f"operator settings: {e}: DBQ_DRIFT_INTERVAL and DBQ_UPKEEP_TICK are seconds,"
                " DBQ_WORKERS and DBQ_DB_CONNECTIONS whole numbers"
            ) from None
        settings.zone()  # refuses an unknown time zone now, not at the first window
        return settings

    def zone(self) -> ZoneInfo:
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidSpec(
                f"DBQ_TIMEZONE {self.timezone!r} is not a time zone: use an IANA name such as Europe/Berlin"
            ) from None


def time_zone() -> ZoneInfo:
    """The zone maintenance windows are read in (DBQ_TIMEZONE, default UTC), as set now."""
    return OperatorSettings.from_env().zone()
