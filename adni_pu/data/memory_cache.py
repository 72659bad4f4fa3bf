"""MONAI's in-memory ``CacheDataset``, with a cache fill that never leaves a thread running.

MONAI fills the cache in a thread pool that it terminates without joining when an item
fails. A volume refused by the input check (:mod:`adni_pu.data.grid_check`) then left a
worker thread inside torch while the command printed its one-line error and exited, and the
process aborted ("terminate called without an active exception", exit 134) instead of
exiting 2. Imported lazily (it imports MONAI); a module-level class, so the dataset pickles.
"""

from __future__ import annotations

from multiprocessing.pool import ThreadPool

from monai.data import CacheDataset


class JoinedCacheDataset(CacheDataset):
    """``CacheDataset`` whose cache fill waits for the items being loaded before it raises."""

    def _fill_cache(self, indices=None) -> list:
        if self.cache_num <= 0:
            return []
        indices = list(range(self.cache_num)) if indices is None else indices
        pool = ThreadPool(self.num_workers)
        try:
            return list(pool.imap(self._load_cache_item, indices))
        finally:
            pool.terminate()  # drops the items not started yet
            pool.join()  # and waits for those being loaded
