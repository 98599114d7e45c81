"""Corpus → shards: the first stage of the cll-scale data flow (``cll-shards``)."""
