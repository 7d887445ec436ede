"""Data: sources -> documents -> byte-level BPE -> per-arm train/val token shards (cached)."""
from .prepare import DataError, PreparedData, data_key, default_cache_dir, prepare_data, split_documents
from .sources import SourceError, load_documents, source_files, source_fingerprint
from .tokenizer import EOT, Tokenizer, train_tokenizer

__all__ = [
    "DataError", "PreparedData", "data_key", "default_cache_dir", "prepare_data", "split_documents",
    "SourceError", "load_documents", "source_files", "source_fingerprint",
    "EOT", "Tokenizer", "train_tokenizer",
]
