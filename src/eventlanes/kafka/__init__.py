"""Kafka-protocol brokers at the edges: ingest a topic into the store exactly once (one token
per partition, committed with the append), and publish results to a topic.

Needs the ``kafka`` extra (confluent-kafka); nothing here imports it until a client is built.
"""

from .ingestor import Ingestor
from .parking import ParkedRecord
from .records import CHAIN_HEADER, BadRecord, Record
from .settings import Kafka, KafkaUnavailableError
from .sink import KafkaSink

__all__ = [
    "CHAIN_HEADER",
    "BadRecord",
    "Ingestor",
    "Kafka",
    "KafkaSink",
    "KafkaUnavailableError",
    "ParkedRecord",
    "Record",
]
