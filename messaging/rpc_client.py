"""RPC client: send a request to a queue, wait for its reply on the client's reply queue."""

from __future__ import annotations

import collections
import contextlib
import logging
import time
import uuid
from typing import Any

from messaging import replies
from messaging.codec import decode, encode
from messaging.errors import DecodeError, MessagingError, QueueNotFound, RemoteError, RpcTimeout
from messaging.link import BrokerLink
from messaging.settings import Settings
from messaging.subscription import Envelope, Subscription

logger = logging.getLogger(__name__)

#: Longest a wait for a reply goes without checking whether its request came back unroutable.
_RETURN_CHECK_S = 0.05
#: Stray replies kept for :meth:`RpcClient.stray_replies`; older ones are forgotten.
STRAY_KEPT = 64


class RpcClient:
    """Calls workers through their queues; one reply queue per client, one thread per client.

    Requests are published with ``mandatory``, so a call to a queue that does not exist
    fails at once with :class:`~messaging.errors.QueueNotFound` (the broker returns the
    request); they carry an ``expiration`` equal to the call's timeout, so a request
    nobody took in time is dropped by the broker instead of being run after the caller
    gave up. A request is not confirmed before the wait for its reply starts (a lost one
    ends in :class:`~messaging.errors.RpcTimeout` like any lost reply), unless it is sent
    ``durable``: persistent and confirmed, so it survives a broker restart while it waits
    in its queue. Replies that match no waiting call (late or unknown) are dropped with a
    log line; the successful ones stay readable once through :meth:`stray_replies`.

    Args:
        settings: transport settings (``rpc_timeout_s`` is the default timeout).
        role: name shown in the management UI.
        link: an existing link of the calling thread to reuse; by default the client opens its own.
    """

    def __init__(self, settings: Settings, role: str = "client", *, link: BrokerLink | None = None) -> None:
        self.settings = settings
        self.link = link if link is not None else BrokerLink(settings, role)
        self._owns_link = link is None
        client_id = f"{role}-{uuid.uuid4().hex[:12]}"
        self._reply_decl = self.link.names.reply_decl(client_id, expires_s=settings.reply_queue_expires_s)
        self._replies: Subscription | None = None
        self._waiting: set[str] = set()
        self._arrived: dict[str, Envelope] = {}
        self._gathering: dict[str, list[Envelope]] = {}
        self._stray: collections.deque[Envelope] = collections.deque(maxlen=STRAY_KEPT)
        self.dropped_replies = 0

    @property
    def reply_queue(self) -> str:
        return self._reply_decl.name

    def close(self) -> None:
        """Stop consuming replies, delete the reply queue, close the link if the client opened it.

        The reply queue goes with its client: a reply still on its way then comes back
        unroutable to its server, which learns that nobody heard it (a collector drops a
        task whose start reply nobody received) instead of delivering it for nobody.
        """
        if self._replies is not None:
            self._replies.close()
            self._replies = None
            with contextlib.suppress(MessagingError):
                self.link.delete_queue(self.reply_queue)
        if self._owns_link:
            self.link.close()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def call(self, queue: str, request: Any, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Send ``request`` to ``queue`` and return the reply's ``result``.

        Raises:
            QueueNotFound: ``queue`` does not exist (nobody serves it).
            RpcTimeout: no reply within ``timeout_s``.
            RemoteError: the server refused the request (``ok: false``).
        """
        timeout = self.settings.rpc_timeout_s if timeout_s is None else timeout_s
        correlation_id = self.send(queue, request, timeout_s=timeout)
        return self.wait(correlation_id, timeout_s=timeout)

    def send(self, queue: str, request: Any, *, timeout_s: float | None = None, durable: bool = False) -> str:
        """Publish a request without waiting for its reply; returns its correlation id for :meth:`wait`.

        Raises:
            QueueNotFound: ``durable`` and ``queue`` does not exist (otherwise :meth:`wait`
                or :meth:`poll` raise it).
        """
        timeout = self.settings.rpc_timeout_s if timeout_s is None else timeout_s
        self._ensure_replies()
        correlation_id = uuid.uuid4().hex
        body = encode(request, max_bytes=self.settings.max_message_bytes)
        self._waiting.add(correlation_id)
        try:
            self.link.publish(
                queue,
                body,
                correlation_id=correlation_id,
                reply_to=self.reply_queue,
                expiration_ms=max(1, int(timeout * 1000)),
                persistent=durable,
                confirm=durable,
            )
        except BaseException:
            self._waiting.discard(correlation_id)
            raise
        return correlation_id

    def wait(self, correlation_id: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the reply to an earlier :meth:`send`; see :meth:`call` for errors."""
        timeout = self.settings.rpc_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        replies_sub = self._ensure_replies()
        try:
            while correlation_id not in self._arrived:
                self._raise_if_returned(correlation_id)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    # The request may have died on its channel (a quorum queue's leader change):
                    # the next one goes out on a fresh channel.
                    self.link.renew_unconfirmed_channel()
                    raise RpcTimeout(f"no reply within {timeout:.1f} s (correlation_id {correlation_id})")
                # In slices: a returned request (no queue) must end the wait, not only a reply.
                delivery = replies_sub.get(min(remaining, _RETURN_CHECK_S))
                if delivery is None:
                    continue
                delivery.ack()
                self._sort(delivery.envelope)
            envelope = self._arrived.pop(correlation_id)
        finally:
            self._waiting.discard(correlation_id)
        return self._unwrap(envelope)

    def poll(self, correlation_id: str) -> dict[str, Any] | None:
        """The reply to an earlier :meth:`send` if it has arrived, else ``None``; never blocks.

        Lets one thread keep many calls in flight (the coordinator does). Raises like :meth:`call`.
        """
        replies_sub = self._ensure_replies()
        while (delivery := replies_sub.get(0.0)) is not None:
            delivery.ack()
            self._sort(delivery.envelope)
        if correlation_id not in self._arrived:
            self._raise_if_returned(correlation_id)
            return None
        envelope = self._arrived.pop(correlation_id)
        self._waiting.discard(correlation_id)
        return self._unwrap(envelope)

    def broadcast(self, exchange: str, request: Any, *, timeout_s: float | None = None) -> str:
        """Publish ``request`` to a fanout exchange: every queue bound to it gets a copy, every server replies.

        Returns the correlation id for :meth:`gathered`. Not mandatory: nobody bound is no
        error, just no replies. Every request expires after ``timeout_s``.
        """
        timeout = self.settings.rpc_timeout_s if timeout_s is None else timeout_s
        self._ensure_replies()
        correlation_id = uuid.uuid4().hex
        body = encode(request, max_bytes=self.settings.max_message_bytes)
        self._gathering[correlation_id] = []
        self.link.publish(
            "",
            body,
            exchange=exchange,
            correlation_id=correlation_id,
            reply_to=self.reply_queue,
            expiration_ms=max(1, int(timeout * 1000)),
            mandatory=False,
            confirm=False,
        )
        return correlation_id

    def gathered(self, correlation_id: str, *, done: bool = False) -> list[dict[str, Any]]:
        """The results of the replies to a :meth:`broadcast` that arrived so far; never blocks.

        Each reply is returned once. Refusals and unreadable replies are left out. With
        ``done`` the broadcast is over: later replies are dropped.
        """
        replies_sub = self._ensure_replies()
        while (delivery := replies_sub.get(0.0)) is not None:
            delivery.ack()
            self._sort(delivery.envelope)
        envelopes = self._gathering.get(correlation_id, [])
        self._gathering[correlation_id] = []
        if done:
            self._gathering.pop(correlation_id, None)
        results = []
        for envelope in envelopes:
            with contextlib.suppress(DecodeError, RemoteError):
                results.append(self._unwrap(envelope))
        return results

    def abandon(self, correlation_id: str) -> None:
        """Give up on a call: a reply arriving later is dropped with a log line."""
        self._waiting.discard(correlation_id)
        self._arrived.pop(correlation_id, None)

    def _raise_if_returned(self, correlation_id: str) -> None:
        if self.link.was_returned(correlation_id):
            self._waiting.discard(correlation_id)
            raise QueueNotFound(f"request {correlation_id} came back: no queue serves it")

    def _unwrap(self, envelope: Envelope) -> dict[str, Any]:
        try:
            body = decode(envelope.body, max_bytes=self.settings.max_message_bytes)
        except DecodeError as exc:
            raise DecodeError(f"undecodable reply: {exc.message}") from None
        return replies.unwrap(body)

    def _sort(self, envelope: Envelope) -> None:
        corr = envelope.correlation_id
        if corr is not None and corr in self._waiting:
            self._arrived[corr] = envelope
            return
        if corr is not None and corr in self._gathering:
            self._gathering[corr].append(envelope)
            return
        self.dropped_replies += 1
        self._stray.append(envelope)
        logger.info("dropping a late or unknown reply (correlation_id %s)", corr)

    def stray_replies(self) -> list[dict[str, Any]]:
        """Results of the successful replies no call waited for since the last look, oldest first.

        A request can be run twice: a broker restart between a worker's reply and its ack
        redelivers the request, to that worker or another, and the second reply finds no
        call waiting. The caller may need to undo what that second run started (the
        coordinator closes such a task). Replies that cannot be read are skipped.
        """
        found = []
        while self._stray:
            envelope = self._stray.popleft()
            with contextlib.suppress(DecodeError, RemoteError):
                found.append(self._unwrap(envelope))
        return found

    def _ensure_replies(self) -> Subscription:
        if self._replies is None:
            self._replies = self.link.subscribe(self._reply_decl, prefetch=256)
        return self._replies
