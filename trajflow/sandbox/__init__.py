"""Docker sandboxes: content-hashed images, containers that host an env runner, and orphan cleanup."""
