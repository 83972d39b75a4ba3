"""Process infrastructure: settings, the object store and its key layout, published policies, the Temporal client
and dev server, the embedded stack's processes, the reward image; never imports `workflows` or `activities`."""
