"""Millpond: a distributed event-streaming database (SQL over Kafka, executed on Spark,
materialized in RocksDB, served over gRPC).

The namespace joins the repository's top-level folders: ``millpond.services`` (coordinator,
worker, router), ``millpond.shared`` (SQL, catalog, Kafka, RPC), ``millpond.cli`` and
``millpond.deploy``, and the generated protobuf stubs ``millpond.<area>.v1``.
"""
