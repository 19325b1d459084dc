"""The collector worker: DI-engine's comm collector on RabbitMQ."""
