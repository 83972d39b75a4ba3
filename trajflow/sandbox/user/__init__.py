"""A user's own environment (`py:MODULE:CLASS`): find and check its source, pack it content-addressed into the
object store at submission, and unpack it where an env worker builds its image layer."""
