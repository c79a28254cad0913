"""One gate at a time, whatever the registry: a lease held in the MLflow model registry itself.

A team shares one registry (an ``mlflow server``, or a sqlite or database store), and every workspace that gates
against it must take turns: two gates that read the same champion and both move the alias, or both number their
record alike, break the ledger (:mod:`pgrank.pipeline.decisions`). MLflow offers no lock, but it offers one
atomic operation on every store: creating a registered model whose name is taken fails
(``RESOURCE_ALREADY_EXISTS``), and so does renaming one that is gone (``RESOURCE_DOES_NOT_EXIST``). So:

* **take**: create the registered model ``<name>-gate-lease`` with the tags ``owner`` (host, process, a random
  token), ``token`` and ``expires`` (epoch seconds). Whoever creates it holds the gate; every other gate finds it
  taken and waits up to ``wait`` seconds, then refuses with one line naming the owner and the expiry.
* **renew**: a heartbeat thread moves ``expires`` to ``now + ttl`` every ``ttl / 3`` seconds while the gate works,
  so a slow evaluation keeps its lease and a killed gate's lease lapses within ``ttl``.
* **take over** a lapsed lease: rename it to ``<name>-gate-lease-lapsed-<token>`` (only one renamer succeeds), check
  that the renamed lease is the lapsed one (a live one renamed by mistake is put back), delete it, and take the lease
  afresh.
* **check** before every write of a decision (:meth:`Lease.check`): the lease is still this gate's and has not
  lapsed; otherwise :class:`LeaseLost` stops the gate before it writes anything more.
* **release**: delete the lease (only if it is still this gate's).

What it cannot do is fence a write already on the wire: a gate frozen for longer than ``ttl`` between its check and
its write could write after another gate took over. The ledger keeps that harmless: a record number is never reused
(:func:`pgrank.pipeline.decisions.commit` refuses to overwrite a record), and the alias moves only by
compare-and-set against the champion the decision was compared with.

Example:
    >>> with Lease(client, "pgrank-retriever", ttl=600, wait=0) as lease:
    ...     lease.check()       # before each registry write of the decision
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from pgrank.errors import PgrankError

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

SUFFIX = "-gate-lease"
POLL = 0.5  # seconds between two looks at a lease held by another gate


class LeaseLost(PgrankError):
    """This gate's lease lapsed or was taken over: it must stop before it writes anything more."""


def lease_name(name: str) -> str:
    """The registered model that is the gate lease of registered model ``name``."""
    return f"{name}{SUFFIX}"


def when(epoch: float) -> str:
    """An expiry in words: UTC, to the second."""
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _code(exc: Exception) -> str | None:
    return getattr(exc, "error_code", None)


class Lease:
    """The gate lease of registered model ``name`` (module docstring); a context manager.

    Args:
        client: the registry.
        name: the registered model gated.
        ttl: seconds the lease lasts without a renewal, > 0.
        wait: seconds to wait for a lease held by another gate before refusing, >= 0.
        owner: who holds it, in words (default: host, process id).
    """

    def __init__(self, client: MlflowClient, name: str, *, ttl: float, wait: float, owner: str | None = None):
        if not ttl > 0 or not wait >= 0:
            raise PgrankError(f"gate lease of {name}: expected ttl > 0 and wait >= 0 seconds, got ttl {ttl!r}, "
                              f"wait {wait!r}")
        self.client, self.name, self.ttl, self.wait = client, name, float(ttl), float(wait)
        self.token = secrets.token_hex(8)
        self.owner = f"{owner or f'{socket.gethostname()} pid {os.getpid()}'} ({self.token})"
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.lost: str | None = None

    # ------------------------------------------------------------------ reading

    def holder(self) -> dict[str, str] | None:
        """The lease's tags (``owner``, ``token``, ``expires``), or ``None`` when nobody holds it."""
        try:
            return dict(self.client.get_registered_model(lease_name(self.name)).tags)
        except Exception as exc:  # noqa: BLE001 - MlflowException or RestException, told apart by their code
            if _code(exc) == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise

    @staticmethod
    def expiry(tags: dict[str, str]) -> float:
        try:
            return float(tags.get("expires", "inf"))
        except ValueError:
            return float("inf")

    # ------------------------------------------------------------------ taking and giving back

    def _create(self) -> bool:
        tags = {"owner": self.owner, "token": self.token, "expires": repr(time.time() + self.ttl)}
        try:
            self.client.create_registered_model(lease_name(self.name), tags=tags, description=json.dumps(
                {"what": f"the champion gate lease of {self.name}: one gate at a time (pgrank)"}))
            return True
        except Exception as exc:  # noqa: BLE001
            # Taken; or, on a database store, lost the race to a create (or a release) in flight, which the store
            # reports as the name missing when it looks the winner up: either way, not ours, look again.
            if _code(exc) in ("RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"):
                return False
            raise

    def _take_over(self, seen: dict[str, str]) -> None:
        """Remove a lapsed lease ``seen`` (module docstring); a live lease renamed by a race is put back."""
        lapsed = f"{lease_name(self.name)}-lapsed-{self.token}"
        try:
            self.client.rename_registered_model(lease_name(self.name), lapsed)
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in ("RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS"):
                return  # another gate got there first
            raise
        got = dict(self.client.get_registered_model(lapsed).tags)
        if got.get("token") == seen.get("token") and self.expiry(got) < time.time():
            self.client.delete_registered_model(lapsed)
            return
        try:  # a live lease taken between our look and our rename: give it back its name
            self.client.rename_registered_model(lapsed, lease_name(self.name))
        except Exception:  # noqa: BLE001 - a third gate took the name meanwhile: the renamed one has lost it
            self.client.delete_registered_model(lapsed)

    def acquire(self) -> Lease:
        """Take the lease, waiting up to ``wait`` seconds for a live holder; start the heartbeat.

        Raises:
            PgrankError: a live gate still holds it after ``wait`` seconds (the message names it and its expiry).
        """
        deadline, said = time.monotonic() + self.wait, False
        while True:
            if self._create():
                break
            seen = self.holder()
            if seen is None:  # released meanwhile: try again
                time.sleep(POLL / 10)
                continue
            if self.expiry(seen) < time.time():
                self._take_over(seen)
                continue
            held = (f"the champion gate of {self.name} is held by {seen.get('owner', 'an unknown owner')} until "
                    f"{when(self.expiry(seen))} (registered model {lease_name(self.name)})")
            if time.monotonic() >= deadline:
                raise PgrankError(f"{held}; wait for it to finish (champion.lease_wait), or, if that process is gone, "
                                  "for its lease to lapse")
            if not said:
                print(f"pgrank: {held}; waiting up to {self.wait:g} s", file=sys.stderr, flush=True)
                said = True
            time.sleep(POLL)
        self._beat = threading.Thread(target=self._heartbeat, name=f"pgrank gate lease {self.name}", daemon=True)
        self._beat.start()
        return self

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except Exception as exc:  # noqa: BLE001 - said by the next check()
                self.lost = str(exc)
                return

    def renew(self) -> None:
        """Move the expiry to ``now + ttl`` (after :meth:`check`)."""
        self.check()
        self.client.set_registered_model_tag(lease_name(self.name), "expires", repr(time.time() + self.ttl))

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless this gate still holds an unlapsed lease."""
        if self.lost:
            raise LeaseLost(f"the champion gate lease of {self.name} was lost: {self.lost}")
        tags = self.holder()
        if tags is None or tags.get("token") != self.token:
            holder = "nobody" if tags is None else tags.get("owner", "another gate")
            raise LeaseLost(f"the champion gate lease of {self.name} is now held by {holder}: this gate stopped "
                            "before writing anything more; run it again")
        if self.expiry(tags) < time.time():
            raise LeaseLost(f"the champion gate lease of {self.name} lapsed at {when(self.expiry(tags))} (its "
                            "heartbeat stopped): this gate stopped before writing anything more; run it again")

    def release(self) -> None:
        """Stop the heartbeat and delete the lease if it is still this gate's."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        tags = self.holder()
        if tags is not None and tags.get("token") == self.token:
            try:
                self.client.delete_registered_model(lease_name(self.name))
            except Exception as exc:  # noqa: BLE001
                if _code(exc) != "RESOURCE_DOES_NOT_EXIST":
                    raise

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
