"""The exactness record: fingerprints of the upstream functions the lean paths reproduce (:mod:`~.upstream_verified`),
the check that makes a lean path step aside when the installed code differs (:mod:`~.upstream`) and the maintainers'
command that records new versions (:mod:`~.upstream_record`)."""
