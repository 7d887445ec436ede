"""Data: sources -> documents -> tokenizer -> per-arm train/val token shards (cached), and batches of rows."""

from .prepare import DataError, PreparedData, data_key, default_cache_dir, prepare_data
from .source_files import SourceError, source_files, source_fingerprint
from .source_readers import load_documents
from .tokenizer import EOT, Tokenizer, TokenizerError, train_tokenizer

__all__ = [
    "DataError",
    "PreparedData",
    "data_key",
    "default_cache_dir",
    "prepare_data",
    "SourceError",
    "load_documents",
    "source_files",
    "source_fingerprint",
    "EOT",
    "Tokenizer",
    "TokenizerError",
    "train_tokenizer",
]
