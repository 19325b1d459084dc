"""warren's transport: the only package that talks to RabbitMQ (pika).

Everything above it (:mod:`worker`) uses these names and catches only the errors of
:mod:`messaging.errors`. Private, as :mod:`worker` is: the public API is :mod:`warren`.
"""

from __future__ import annotations

# Codec
from messaging.codec import CONTENT_TYPE, SCHEMA_VERSION, decode, encode

# Errors
from messaging.errors import (
    BrokerConnectionError,
    ChannelError,
    CodecError,
    ConfigurationError,
    ConnectionClosed,
    ConnectionFailed,
    DecodeError,
    EncodeError,
    MessageTooLarge,
    MessagingError,
    PublishRejected,
    PublishTimeout,
    QueueLocked,
    QueueNotFound,
    QueueTypeMismatch,
    RemoteError,
    RequestRefused,
    RpcError,
    RpcTimeout,
    StreamStalled,
    StreamStopped,
    WarrenError,
)

# Links, publishing, RPC and the metadata stream
from messaging.link import BrokerLink
from messaging.publisher import ConfirmedPublisher
from messaging.queue_deleter import DeletionCounts, QueueDeleter
from messaging.rpc_client import RpcClient
from messaging.rpc_server import Reply, Request, RpcServer

# Settings and names
from messaging.settings import Settings, redact_url
from messaging.stream import MetadataConsumer, MetadataItem, MetadataPublisher
from messaging.subscription import Delivery, Envelope, Subscription
from messaging.topology import Names, QueueDecl

__all__ = [
    "CONTENT_TYPE",
    "SCHEMA_VERSION",
    "BrokerConnectionError",
    "BrokerLink",
    "ChannelError",
    "CodecError",
    "ConfigurationError",
    "ConfirmedPublisher",
    "ConnectionClosed",
    "ConnectionFailed",
    "DecodeError",
    "DeletionCounts",
    "Delivery",
    "EncodeError",
    "Envelope",
    "MessageTooLarge",
    "MessagingError",
    "MetadataConsumer",
    "MetadataItem",
    "MetadataPublisher",
    "Names",
    "PublishRejected",
    "PublishTimeout",
    "QueueDecl",
    "QueueDeleter",
    "QueueLocked",
    "QueueNotFound",
    "QueueTypeMismatch",
    "RemoteError",
    "Reply",
    "Request",
    "RequestRefused",
    "RpcClient",
    "RpcError",
    "RpcServer",
    "RpcTimeout",
    "Settings",
    "StreamStalled",
    "StreamStopped",
    "Subscription",
    "WarrenError",
    "decode",
    "encode",
    "redact_url",
]
