"""The wire between roles: the messages (`protocol`), their encoding (`codec`: msgpack, arrays as
raw frames), the ZeroMQ sockets that carry them with backpressure and credentials (`transport`),
and hostile frames to test them with (`fuzz`)."""
