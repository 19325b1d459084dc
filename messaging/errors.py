"""The one exception tree of warren.

Every error warren raises on purpose derives from :class:`WarrenError`. pika's and
msgpack's exceptions never leave :mod:`messaging`: they are translated here, at the
boundary, so callers in :mod:`worker` catch only these types.
"""

from __future__ import annotations

from typing import Any


class WarrenError(Exception):
    """Base of every error raised by warren."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigurationError(WarrenError):
    """A setting, flag or environment variable has a value warren cannot use."""


class MessagingError(WarrenError):
    """Something went wrong talking to RabbitMQ or handling a message."""


class BrokerConnectionError(MessagingError):
    """The connection to the broker failed or was lost."""


class ConnectionFailed(BrokerConnectionError):
    """The broker could not be reached within the retry budget."""


class ConnectionClosed(BrokerConnectionError):
    """An open connection or channel was closed under us (broker restart, kill, network)."""


class ChannelError(MessagingError):
    """The broker refused an operation on a channel (missing queue, argument mismatch...)."""


class QueueNotFound(ChannelError):
    """A message was published with ``mandatory`` to a queue that does not exist."""


class QueueLocked(ChannelError):
    """The queue is exclusive to another connection (it exists, but is not ours to use)."""


class QueueTypeMismatch(ChannelError, ConfigurationError):
    """A queue exists with another type (classic or quorum) than ``WARREN_QUEUE_TYPE`` declares it.

    A configuration error as much as a broker refusal: the broker cannot convert a queue,
    so retrying cannot help; the processes of one deployment disagree on the setting.
    """


class PublishRejected(MessagingError):
    """The broker did not accept a published message (nack: queue full, disk alarm...)."""


class PublishTimeout(MessagingError):
    """Published messages were not all confirmed by the broker within the time given."""


class StreamStalled(MessagingError):
    """A metadata queue stayed full longer than the publisher's patience: nobody reads it."""


class StreamStopped(Exception):
    """Raised inside a publisher blocked on a full queue when its stop event is set.

    Not a WarrenError: it is control flow for a shutdown the caller asked for.
    """


class CodecError(MessagingError):
    """A body could not be encoded or decoded."""


class EncodeError(CodecError):
    """An object cannot be put on the wire (unsupported type, too large...)."""


class DecodeError(CodecError):
    """A body is not a valid warren message."""

    def __init__(self, message: str, data: bytes | None = None) -> None:
        super().__init__(message)
        self.data = data


class MessageTooLarge(DecodeError, EncodeError):
    """A body is larger than the configured ``max_message_bytes``."""


class RpcError(MessagingError):
    """Base of errors seen by an RPC caller."""


class RpcTimeout(RpcError):
    """No reply arrived within the call's timeout."""


class RemoteError(RpcError):
    """The server answered with ``ok: false``; ``result`` carries its structured detail."""

    def __init__(self, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result: dict[str, Any] = dict(result or {})


class RequestRefused(WarrenError):
    """A handler refuses its request: the RPC server replies ``ok: false`` and keeps serving.

    ``result`` is sent back to the caller as the error's structured detail (the caller's
    :class:`RemoteError` carries it). What a refusal means is the business of the layer above,
    which raises its own subclasses of it.
    """

    def __init__(self, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result: dict[str, Any] = dict(result or {})
