"""The Python client: producer, consumer, reader and admin, with a route cache and retries."""
