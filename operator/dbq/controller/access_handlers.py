"""kopf handlers of QueueUsers: thin wrappers around `dbq.controller.access`."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from dbq.api.access import QUEUE_USER_PLURAL
from dbq.api.models import GROUP, VERSION
from dbq.controller import leadership
from dbq.controller.access import QueueUserSync
from dbq.controller.handlers import SETTINGS, backoff, forget_credentials, kube, post_event, read_secret

log = logging.getLogger("dbq")


def users() -> QueueUserSync:
    return QueueUserSync(kube(), read_secret, post_event)


def _sync(body: kopf.Body, retry: int, *, retrying: bool = True) -> None:
    synced = users().sync(body)
    if synced.error is not None:
        forget_credentials()
        log.info("queueuser %s/%s not synced: %s", body["metadata"]["namespace"], body["metadata"]["name"],
                 synced.error)  # fmt: skip
        if retrying and synced.error.retry:
            raise kopf.TemporaryError(str(synced.error), delay=backoff(retry))


@kopf.on.resume(GROUP, VERSION, QUEUE_USER_PLURAL)
@kopf.on.create(GROUP, VERSION, QUEUE_USER_PLURAL)
@kopf.on.update(GROUP, VERSION, QUEUE_USER_PLURAL)
def apply_queue_user(body: kopf.Body, retry: int, **_: Any) -> None:
    """Spec or annotations changed (a right given or taken, `dbq.dev/rotate`): synced at once."""
    leadership.fence()
    _sync(body, retry)


@kopf.timer(GROUP, VERSION, QUEUE_USER_PLURAL, interval=SETTINGS.drift_interval_s,
            initial_delay=SETTINGS.drift_interval_s, idle=5)  # fmt: skip
def check_queue_user(body: kopf.Body, **_: Any) -> None:
    """A Secret deleted (a new password), a Queue made Ready since, a grant revoked behind dbq's back."""
    leadership.fence()
    _sync(body, 0, retrying=False)


@kopf.on.delete(GROUP, VERSION, QUEUE_USER_PLURAL)
def delete_queue_user(body: kopf.Body, **_: Any) -> None:
    leadership.fence()
    sessions = users().delete(body)
    if sessions is None:
        kopf.warn(body, reason="LoginNotDropped", message="no Queue or Topic it names is left to reach its"
                  " database: a DBA drops its login (status.login) by hand")  # fmt: skip
        return
    kopf.info(body, reason="Deleted", message=f"dropped login {body.get('status', {}).get('login')}"
              f" ({sessions})")  # fmt: skip
