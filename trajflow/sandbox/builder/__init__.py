"""Building content-hashed container images on this host, with no registry: `docker build` from a context of
files and cached wheels, the Debian base layer (debootstrap), offline wheels (`pip wheel`) and the hashing and
locking around them. Used by the sandbox layers (`trajflow.sandbox.images`) and the reward image
(`trajflow.infra.reward_image`); imports the docker SDK and the stdlib only."""
