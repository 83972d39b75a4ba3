"""Building content-hashed container images on this host, with no registry: `docker build` from a context of
files and cached wheels, the Debian base layer (debootstrap), offline wheels (`pip wheel`) and the hashing and
locking around them; the worker image and the reward image (`reward_image`) are built here too, so every image has
one home. Used by the sandbox layers (`trajflow.sandbox.images`), `trajflow setup`/`up` and the hosts' images; imports
the docker SDK and the stdlib only."""
